"""The ``chosen`` kind: preference pairs (TRL's conversational preference format) as two-branch trees.

Explicit prompt, or implicit (the prompt is the longest common message prefix of ``chosen`` and
``rejected``, as TRL's ``extract_prompt`` takes it)::

    {"prompt": [user(img) "Caption it."], "chosen": [asst "A red bus."], "rejected": [asst "A car."]}
    {"chosen": [user "Hi", asst "Hello!"], "rejected": [user "Hi", asst "Go away."]}
    -> root node [prompt] with two children: node 1 = chosen, node 2 = rejected (always this order)

The prompt (its images included) is encoded and computed once; each answer is a branch continuing from it.
The node order is the contract the DPO loss reads (``packer.train.loss.sequence_logps``: leaves come in
(chosen, rejected) pairs); no column says it. Messages take the chat kind's fields (parts, images,
``tool_calls``, ``loss``; the prompt's turns carry no loss unless they say ``"loss": true``); a top-level ``images`` / ``videos`` / ``audios`` / ``tools`` applies to both branches. Why a tree: the
prompt of a padded (prompt+chosen, prompt+rejected) pair is computed twice; here once (docs/benchmarks.md).
"""

from __future__ import annotations

from typing import Any

from packer.core.types import Example, Node
from packer.formats.common import (
    Ctx,
    bind_media,
    chat_messages,
    check_pool_used,
    record_tools,
)


def _messages(obj: dict[str, Any], key: str, ctx: Ctx) -> list:
    value = obj.get(key)
    if not isinstance(value, list):
        raise ctx.error(
            "wrong_type",
            f"'{key}' must be a list of chat messages (TRL's conversational format), got {type(value).__name__}",
        )
    return value


def split_prompt(chosen: list, rejected: list) -> int:
    """The length of the longest common message prefix of two conversations (TRL's implicit prompt)."""
    n = 0
    while n < min(len(chosen), len(rejected)) and chosen[n] == rejected[n]:
        n += 1
    return n


def parse(obj: dict[str, Any], ctx: Ctx) -> Example:
    bind_media(obj, ctx)
    chosen, rejected = _messages(obj, "chosen", ctx), _messages(obj, "rejected", ctx)
    if "prompt" in obj:
        prompt = _messages(obj, "prompt", ctx)
    else:
        n = split_prompt(chosen, rejected)
        prompt, chosen, rejected = chosen[:n], chosen[n:], rejected[n:]
    if not prompt:
        raise ctx.error(
            "empty_messages",
            "the preference pair has no prompt ('prompt' is empty, or 'chosen' and 'rejected' share no first "
            "message); give a 'prompt' list",
        )
    for key, answer in (("chosen", chosen), ("rejected", rejected)):
        if not answer:
            raise ctx.error(
                "empty_branch", f"'{key}' has no message after the prompt (chosen and rejected must differ)"
            )
    prompt_messages = chat_messages(prompt, ctx, "prompt")
    for m in prompt_messages:  # the prompt is context, never a target (TRL's DPO masks it too)
        if m.loss is None:
            m.loss = False
    root = Node(
        messages=prompt_messages,
        children=[
            Node(messages=chat_messages(chosen, ctx, "chosen")),
            Node(messages=chat_messages(rejected, ctx, "rejected")),
        ],
    )
    check_pool_used(ctx)
    return ctx.example(root, "preference", tools=record_tools(obj, ctx))
