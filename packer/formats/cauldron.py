"""The Cauldron's rows (HuggingFaceM4/the_cauldron, Idefics2's fine-tuning mixture) -> a ``messages`` record.

A row holds ``images`` (a list of ``datasets.Image`` structs, ``{"bytes", "path"}``) and ``texts`` (a list of
``{"user", "assistant", "source"}`` turns). It becomes a multi-turn chat whose first user turn shows every image,
before its text, as Idefics2's own fine-tuning recipe lays them out::

    {"images": [img0, img1], "texts": [{"user": "Q1", "assistant": "A1"}, {"user": "Q2", "assistant": "A2"}]}
    -> user [img0, img1, "Q1"], assistant "A1", user "Q2", assistant "A2"

Read through the table path (``tables.py``) like any Parquet file: the images stay embedded bytes.
"""

from __future__ import annotations

from typing import Any

from packer.formats.common import Ctx


def to_record(obj: dict[str, Any], ctx: Ctx) -> dict[str, Any]:
    texts = obj["texts"]
    if not isinstance(texts, list) or not texts:
        raise ctx.error("empty_messages" if texts == [] else "wrong_type",
                        f"'texts' must be a non-empty list of {{user, assistant}} turns, got {texts!r:.80}")
    images = obj.get("images") or []
    if not isinstance(images, list):
        raise ctx.error("wrong_type", f"'images' must be a list of images, got {type(images).__name__}")
    messages: list[dict[str, Any]] = []
    for i, turn in enumerate(texts):
        if not (isinstance(turn, dict) and isinstance(turn.get("user"), str)
                and isinstance(turn.get("assistant"), str)):
            raise ctx.error("wrong_type", f"texts[{i}] must be {{\"user\": str, \"assistant\": str}}, got {turn!r:.120}")
        user: list[dict[str, Any]] = [{"type": "image", "image": im} for im in images] if i == 0 else []
        messages += [{"role": "user", "content": user + [{"type": "text", "text": turn["user"]}]},
                     {"role": "assistant", "content": turn["assistant"]}]
    return {"messages": messages}
