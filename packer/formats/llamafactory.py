"""LLaMA-Factory's ``dataset_info.json``: an entry -> a dataset spec, and a record of that dataset -> a packer
record (a ``messages`` chat, a ``chosen`` preference pair or a ``text``), which then parses as every other.

The semantics are LLaMA-Factory's own (``src/llamafactory/data/parser.py`` and ``converter.py``):

- ``columns`` / ``tags`` given: every column (tag) they do not name is unset, as ``DatasetAttr.join`` reads
  them; absent: the defaults below (alpaca ``instruction`` / ``input`` / ``output``, sharegpt ``conversations``
  with ``from`` / ``value`` and ``human`` / ``gpt`` / ``observation`` / ``function_call`` / ``system``).
- alpaca: user ``prompt + "\\n" + query`` (each only when non-empty), ``history`` pairs as earlier turns,
  assistant ``response``; a dataset with no response column (``c4_demo``, ``wiki_demo``: pretraining) is text.
- sharegpt: turns alternate user|observation and assistant|function_call, a first ``system_tag`` turn is the
  system prompt; ``function_call`` -> the assistant's ``tool_calls``, ``observation`` -> a ``tool`` message.
  LLaMA-Factory drops a record that breaks the alternation; packer rejects it, saying which turn.
- ``ranking``: ``chosen`` / ``rejected`` (alpaca: strings; sharegpt: one turn each) -> a preference tree.
- ``tools`` (a JSON string or a list): bare function schemas wrapped as ``{"type": "function", "function": ...}``
  (LLaMA-Factory's Llama-3 tool formatter does the same), for the chat template.
- ``images`` / ``videos`` / ``audios``: one ``<image>`` / ``<video>`` / ``<audio>`` placeholder each, counted
  against the list whenever the entry names the column (an empty list too), as LLaMA-Factory's multimodal
  plugins count them; without the column a placeholder is text.

    {"instruction": "Name it.", "input": "<image>", "output": "A bus.", "images": ["b.jpg"]}
    -> {"messages": [{"role": "user", "content": "Name it.\\n<image>"}, {"role": "assistant", "content": "A bus."}],
        "images": ["b.jpg"]}
"""

from __future__ import annotations

import json
from typing import Any

from packer.errors import ConfigError
from packer.formats.common import AUDIO_PLACEHOLDER, IMAGE_PLACEHOLDER, VIDEO_PLACEHOLDER, Ctx

FORMATTINGS = ("alpaca", "sharegpt")
HUB_KEYS = ("hf_hub_url", "ms_hub_url", "om_hub_url", "script_url", "cloud_file_name")
COLUMNS = ("prompt", "query", "response", "history", "messages", "system", "tools", "images", "videos", "audios",
           "chosen", "rejected", "kto_tag")
TAGS = ("role_tag", "content_tag", "user_tag", "assistant_tag", "observation_tag", "function_tag", "system_tag")
# LLaMA-Factory's DatasetAttr defaults, used only where the entry has no "columns" ("tags") at all.
DEFAULT_COLUMNS = {"prompt": "instruction", "query": "input", "response": "output", "messages": "conversations"}
DEFAULT_TAGS = {"role_tag": "from", "content_tag": "value", "user_tag": "human", "assistant_tag": "gpt",
                "observation_tag": "observation", "function_tag": "function_call", "system_tag": "system"}
MEDIA = (("images", IMAGE_PLACEHOLDER), ("videos", VIDEO_PLACEHOLDER), ("audios", AUDIO_PLACEHOLDER))


def dataset_spec(name: str, entry: Any, where: str) -> dict[str, Any]:
    """A ``dataset_info.json`` entry -> the spec a source stores (every column and tag spelled out, so the
    manifest says exactly how its records were read); ConfigError for what packer cannot read as asked."""
    if not isinstance(entry, dict):
        raise ConfigError(f"{where}: dataset {name!r} must be an object, got {type(entry).__name__}")
    formatting = entry.get("formatting", "alpaca")
    if formatting not in FORMATTINGS:
        hint = (" (OpenAI-style messages: packer's own `messages` kind reads such files directly, --source "
                f"{name}=FILE)") if formatting == "openai" else ""
        raise ConfigError(f"{where}: dataset {name!r} has formatting {formatting!r}; packer reads "
                          f"{' and '.join(FORMATTINGS)}{hint}")
    columns, tags = entry.get("columns"), entry.get("tags")
    for key, value in (("columns", columns), ("tags", tags)):
        if value is not None and not (isinstance(value, dict) and all(
                isinstance(v, str) or v is None for v in value.values())):
            raise ConfigError(f"{where}: dataset {name!r}: {key!r} must map names to strings, got {value!r:.200}")
    cols = {c: (columns or {}).get(c) if columns is not None else DEFAULT_COLUMNS.get(c) for c in COLUMNS}
    tag = {t: (tags or {}).get(t) if tags is not None else DEFAULT_TAGS[t] for t in TAGS}
    if cols["kto_tag"]:
        raise ConfigError(
            f"{where}: dataset {name!r} is a KTO dataset (columns.kto_tag {cols['kto_tag']!r}): each record is one "
            "answer labelled desirable or not, for a KTO trainer; packing it as plain SFT would train on the "
            "undesirable answers too, and packer has no KTO trainer. Drop it, or filter its desirable records "
            "into a dataset without kto_tag")
    ranking = entry.get("ranking", False)
    if not isinstance(ranking, bool):
        raise ConfigError(f"{where}: dataset {name!r}: 'ranking' must be true or false, got {ranking!r}")
    if ranking and not (cols["chosen"] and cols["rejected"]):
        raise ConfigError(f"{where}: dataset {name!r} is a ranking dataset without 'chosen' and 'rejected' columns")
    if formatting == "sharegpt" and not (cols["messages"] and tag["role_tag"] and tag["content_tag"]):
        raise ConfigError(f"{where}: dataset {name!r} (sharegpt) needs columns.messages and tags role_tag / "
                          "content_tag")
    if entry.get("num_samples") is not None:
        raise ConfigError(f"{where}: dataset {name!r} sets num_samples, a random draw packer does not reproduce; "
                          f"drop it and give the dataset a weight instead (--dataset {name}@W)")
    return {"name": name, "formatting": formatting, "ranking": ranking, "columns": cols, "tags": tag}


# ---------------------------------------------------------------------------------------------- records
def to_record(obj: dict[str, Any], spec: dict[str, Any], ctx: Ctx) -> dict[str, Any]:
    """One record of a LLaMA-Factory dataset -> a packer record (RecordError, with ``path:line``, when
    LLaMA-Factory would drop it or it cannot mean anything)."""
    cols = spec["columns"]
    if spec["formatting"] == "alpaca":
        prompt, answers, text = _alpaca(obj, spec, ctx)
    else:
        prompt, answers, system = _sharegpt(obj, spec, ctx)
        text = None
        if system:
            prompt.insert(0, {"role": "system", "content": system})
    out: dict[str, Any] = {}
    for key, placeholder in MEDIA:
        if not cols[key]:
            continue  # no such column: a placeholder is text, as LLaMA-Factory's text-only plugin leaves it
        value = _get(obj, cols[key])
        value = [] if value is None else value if isinstance(value, list) else [value]
        if text is not None and value:
            raise ctx.error("wrong_type", f"a pretraining record (no response column) lists {key}; "
                                          "give the dataset a response column or drop the media")
        contents = [m.get("content") for m in prompt + (answers[0] if answers else [])]  # each branch sees them
        found = sum(c.count(placeholder) for c in contents if isinstance(c, str))
        if found != len(value):
            raise ctx.error("image_count_mismatch",
                            f"the record lists {len(value)} {key} ({cols[key]!r}) but its text has {found} "
                            f"{placeholder} placeholders; LLaMA-Factory needs one per item")
        if value:
            out[key] = value
    if text is not None:
        out["text"] = text
        return out
    tools = _tools(_get(obj, cols["tools"]), ctx, cols["tools"])
    if tools:
        out["tools"] = tools
    if spec["ranking"]:
        out.update(prompt=prompt, chosen=answers[0], rejected=answers[1])
    else:
        out["messages"] = prompt + answers[0]
    return out


def _get(obj: dict[str, Any], column: str | None) -> Any:
    return obj.get(column) if column else None


def _alpaca(obj: dict[str, Any], spec: dict[str, Any], ctx: Ctx) -> tuple[list[dict], list[list[dict]], str | None]:
    """(prompt messages, answers: one list per branch, or the text of a pretraining record)."""
    cols = spec["columns"]
    prompt: list[dict] = []
    system = _get(obj, cols["system"])
    if system is not None and not isinstance(system, str):
        raise ctx.error("wrong_type", f"{cols['system']!r} (the system prompt) must be a string, got "
                                      f"{type(system).__name__}")
    if system:
        prompt.append({"role": "system", "content": system})
    history = _get(obj, cols["history"])
    if isinstance(history, list):
        for i, pair in enumerate(history):
            if not (isinstance(pair, list) and len(pair) == 2 and all(isinstance(s, str) for s in pair)):
                raise ctx.error("wrong_type", f"{cols['history']}[{i}] must be a [query, response] pair of "
                                              f"strings, got {pair!r:.120}")
            prompt += [{"role": "user", "content": pair[0]}, {"role": "assistant", "content": pair[1]}]
    query = []
    for key in ("prompt", "query"):
        value = _get(obj, cols[key])
        if value is not None and not isinstance(value, str):
            raise ctx.error("wrong_type", f"{cols[key]!r} must be a string, got {type(value).__name__}")
        if value:
            query.append(value)
    user = "\n".join(query)  # LLaMA-Factory: "prompt\nquery"
    if not cols["response"] and not spec["ranking"]:  # a pretraining dataset: the prompt column is the text
        if prompt:
            raise ctx.error("wrong_type", "a pretraining record (no response column) has a history or system prompt")
        return [], [], user
    if not user:
        raise ctx.error("empty_messages", f"the record has no instruction ({cols['prompt']!r}) and no input "
                                          f"({cols['query']!r})")
    prompt.append({"role": "user", "content": user})
    if spec["ranking"]:
        pair = [_get(obj, cols["chosen"]), _get(obj, cols["rejected"])]
        if not all(isinstance(a, str) for a in pair):
            raise ctx.error("wrong_type", f"a ranking record needs string {cols['chosen']!r} and "
                                          f"{cols['rejected']!r}, got {type(pair[0]).__name__} and "
                                          f"{type(pair[1]).__name__}")
        return prompt, [[{"role": "assistant", "content": a}] for a in pair], None
    response = _get(obj, cols["response"])
    if not isinstance(response, str):
        raise ctx.error("empty_messages", f"the record has no response: {cols['response']!r} is "
                                          f"{type(response).__name__}, not a string")
    return prompt, [[{"role": "assistant", "content": response}]], None


def _sharegpt(obj: dict[str, Any], spec: dict[str, Any], ctx: Ctx) -> tuple[list[dict], list[list[dict]], str]:
    """(prompt messages, answers: one list per branch, the system prompt)."""
    cols, tag = spec["columns"], spec["tags"]
    turns = obj.get(cols["messages"])
    if not isinstance(turns, list):
        raise ctx.error("wrong_type" if cols["messages"] in obj else "unknown_format",
                        f"{cols['messages']!r} must be a list of turns, got {type(turns).__name__}")
    for i, t in enumerate(turns):
        if not isinstance(t, dict):
            raise ctx.error("wrong_type", f"{cols['messages']}[{i}] must be an object, got {type(t).__name__}")
    role, content = tag["role_tag"], tag["content_tag"]
    system = ""
    if tag["system_tag"] and turns and turns[0].get(role) == tag["system_tag"]:
        system, turns = turns[0].get(content), turns[1:]
        if not isinstance(system, str):
            raise ctx.error("wrong_type", f"{cols['messages']}[0] (system) {content!r} must be a string")
    elif cols["system"]:
        system = _get(obj, cols["system"]) or ""
        if not isinstance(system, str):
            raise ctx.error("wrong_type", f"{cols['system']!r} (the system prompt) must be a string")
    offset = len(obj.get(cols["messages"])) - len(turns)
    odd, even = (tag["user_tag"], tag["observation_tag"]), (tag["assistant_tag"], tag["function_tag"])
    messages = []
    for i, t in enumerate(turns):
        allowed = (odd, even)[i % 2]
        if t.get(role) is None or t.get(role) not in allowed:
            names = " or ".join(repr(a) for a in allowed if a)
            raise ctx.error("unknown_role", f"{cols['messages']}[{i + offset}] has {role} {t.get(role)!r}; "
                                            f"sharegpt turns alternate, and this one must be {names} "
                                            "(LLaMA-Factory drops such a record)")
        messages.append(_turn(t, spec, ctx, f"{cols['messages']}[{i + offset}]"))
    if spec["ranking"]:
        if len(messages) % 2 != 1:
            raise ctx.error("wrong_type", f"a ranking record's {cols['messages']!r} must end with a user turn "
                                          f"(an odd count), got {len(messages)} turns")
        answers = []
        for key in ("chosen", "rejected"):
            t = _get(obj, cols[key])
            if not isinstance(t, dict) or t.get(role) is None or t.get(role) not in even:
                raise ctx.error("wrong_type", f"{cols[key]!r} must be one {tag['assistant_tag']!r} turn, got "
                                              f"{t!r:.120}")
            answers.append([_turn(t, spec, ctx, cols[key])])
        return messages, answers, system
    if not messages or len(messages) % 2:
        raise ctx.error("empty_messages" if not messages else "wrong_type",
                        f"{cols['messages']!r} must hold user/assistant pairs ending with an assistant turn, "
                        f"got {len(messages)} turns (LLaMA-Factory drops such a record)")
    return messages[:-1], [messages[-1:]], system


def _turn(t: dict[str, Any], spec: dict[str, Any], ctx: Ctx, where: str) -> dict[str, Any]:
    tag = spec["tags"]
    role, value = t.get(tag["role_tag"]), t.get(tag["content_tag"])
    if not isinstance(value, str):
        raise ctx.error("wrong_type", f"{where} {tag['content_tag']!r} must be a string, got {type(value).__name__}")
    if role == tag["function_tag"]:
        return {"role": "assistant", "content": "", "tool_calls": _calls(value, ctx, where)}
    if role == tag["observation_tag"]:
        return {"role": "tool", "content": value}
    return {"role": "user" if role == tag["user_tag"] else "assistant", "content": value}


def _calls(value: str, ctx: Ctx, where: str) -> list[dict[str, Any]]:
    """A function_call turn's JSON (``{"name", "arguments"}`` or a list of them) -> OpenAI ``tool_calls``."""
    try:
        calls = json.loads(value)
    except json.JSONDecodeError as e:
        raise ctx.error("wrong_type", f"{where} (function_call) is not JSON: {e.msg} at column {e.colno}") from None
    calls = calls if isinstance(calls, list) else [calls]
    out = []
    for j, c in enumerate(calls):
        if not (isinstance(c, dict) and isinstance(c.get("name"), str) and c["name"] and "arguments" in c):
            raise ctx.error("wrong_type", f'{where} call {j} must be {{"name": ..., "arguments": ...}}, got {c!r:.120}')
        out.append({"type": "function", "function": {"name": c["name"], "arguments": c["arguments"]}})
    return out


def _tools(value: Any, ctx: Ctx, column: str | None) -> list[dict[str, Any]] | None:
    """The ``tools`` column (a JSON string, a list or one object) -> OpenAI tool definitions, bare function
    schemas wrapped as LLaMA-Factory's formatter wraps them."""
    if value is None or value == "" or value == []:
        return None
    if isinstance(value, str):
        try:
            value = json.loads(value)
        except json.JSONDecodeError as e:
            raise ctx.error("wrong_type", f"{column!r} is not JSON: {e.msg} at column {e.colno}") from None
    value = [value] if isinstance(value, dict) else value
    if not isinstance(value, list) or not all(isinstance(t, dict) for t in value):
        raise ctx.error("wrong_type", f"{column!r} must be a list of function schemas, got {value!r:.120}")
    return [t if t.get("type") == "function" else {"type": "function", "function": t} for t in value] or None


def v1_pair(obj: dict[str, Any], ctx: Ctx) -> dict[str, Any]:
    """LLaMA-Factory v1's DPO sample (``chosen_messages`` / ``rejected_messages``: whole conversations, content
    parts with ``value``) -> a preference record (the prompt: their common prefix, as TRL takes it)."""
    out = {k: v for k, v in obj.items() if k not in ("chosen_messages", "rejected_messages")}
    out["chosen"], out["rejected"] = obj.get("chosen_messages"), obj.get("rejected_messages")
    return out
