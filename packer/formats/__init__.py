"""Input kinds -> ``Example`` trees, through a registry keyed by each kind's top-level field.

One JSON object per line; the first registered field the record has picks its kind (in ``KINDS`` order)::

    {"messages": [...], "branches": [...]}            chat.py   chat messages, message trees
    {"conversations": [...], "image": "a.jpg"}         llava.py  LLaVA / ShareGPT turns, <image> placeholders
    {"text": "..."}                                    text.py   plain text, loss on every token
    {"prompt": [...], "chosen": [...], "rejected": [...]}  preference.py  preference pairs as 2-branch trees

Per message, ``"loss": true|false`` overrides the default (assistant turns carry loss). Relative image paths
resolve against the JSONL file's directory, or ``image_root`` when given; absolute paths stay. Only a cheap
existence check happens here (``missing_image``); decoding is the model profile's job (``bad_image``).

Adding an input kind is one file with ``parse(obj, ctx) -> Example`` (built from ``common.py``) and one line
in ``KINDS``; another tool's shape of an existing kind is a function ``obj -> packer record`` and one line in
``SHAPES`` (The Cauldron, LLaMA-Factory v1's DPO samples), and a LLaMA-Factory dataset is read through its
``dataset_info.json`` spec (``llamafactory.py``). Reading files (bytes -> records, blank lines, bad UTF-8) is ``read.py``.

A JSONL line of the common shape (a chat of ``{role, content}`` messages with text / image parts, a tree of such
branches, a text record) takes ``plain.py``'s fast path to the same Example, ``parse_record`` the rest.

Cost: ``read.read_jsonl`` parses ~50k two-turn image records/s on one core (one ``stat`` per image included);
the tokenizer, not this, bounds a build.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from packer.core.location import absolute
from packer.core.types import Example
from packer.formats import cauldron, chat, llamafactory, llava, preference, text
from packer.formats.common import Ctx

Parser = Callable[[dict[str, Any], Ctx], Example]

KINDS: dict[str, Parser] = {
    "messages": chat.parse,
    "conversations": llava.parse,
    "text": text.parse,
    "chosen": preference.parse,
}
# Other tools' record shapes, each rewritten into a record of one of KINDS; tried, by their field, only when a
# record has no field of KINDS.
SHAPES: dict[str, Callable[[dict[str, Any], Ctx], dict[str, Any]]] = {
    "texts": cauldron.to_record,  # The Cauldron: images + texts [{user, assistant}]
    "chosen_messages": llamafactory.v1_pair,  # LLaMA-Factory v1's DPO samples
}


def parse_record(
    obj: Any, *, path: str, line: int, base_dir: str, image_root: str | None = None, source_name: str = "",
    columns: dict[str, str] | None = None, audio_in_video: bool = False, dataset: dict[str, Any] | None = None,
) -> Example:
    """Parse one decoded JSON record (or table row) into an Example; raise RecordError (with ``path:line``)
    when unusable.

    ``base_dir`` is the directory relative image paths resolve against (the input file's), unless
    ``image_root`` is given. ``columns`` maps packer fields onto the record's own names
    (``{"messages": "conversations"}``: packer's ``messages`` is the record's ``conversations``).
    ``audio_in_video``: every clip video brings its sound track (``use_audio_in_video``; a record's own
    ``use_audio_in_video`` wins). ``dataset``: the record is one of a LLaMA-Factory dataset with this spec
    (``llamafactory.dataset_spec``), converted to a packer record first.
    """
    ctx = Ctx(path, line, absolute(image_root if image_root is not None else base_dir), source_name,
              audio_in_video=audio_in_video)
    if not isinstance(obj, dict):
        raise ctx.error("malformed_json", f"the line is a JSON {type(obj).__name__}, not an object")
    if dataset is not None:
        obj = llamafactory.to_record(obj, dataset, ctx)
    elif columns:
        obj = rename_fields(obj, columns)
    rid = obj.get("id")
    if rid is not None and not isinstance(rid, (str, int)):
        raise ctx.error("wrong_type", f"'id' must be a string or an integer, got {type(rid).__name__}")
    for field, parse in KINDS.items():
        if field in obj:
            return parse(obj, ctx)
    keys = ", ".join(sorted(map(str, obj))[:8]) or "none"
    shape = next((f for f in SHAPES if f in obj), None)
    if shape is not None:
        return parse_record(SHAPES[shape](obj, ctx), path=path, line=line, base_dir=base_dir, image_root=image_root,
                            source_name=source_name, audio_in_video=audio_in_video)
    fields = ", ".join(f"'{f}'" for f in KINDS)
    hint = ""
    if "prompt" in obj and "completion" in obj:
        # TRL's prompt-completion shape: its loss is whatever follows the prompt's rendering, template by template;
        # refused with the way to write it rather than read approximately.
        hint = ("; TRL's prompt-completion format is not read: write it as 'messages' (the prompt's turns, then the "
                "completion's assistant turns)")
    elif "instruction" in obj:
        hint = "; an alpaca record is read through its LLaMA-Factory dataset_info.json (--dataset-info)"
    raise ctx.error("unknown_format", f"the record has none of {fields} (keys: {keys}){hint}")


def rename_fields(obj: dict[str, Any], columns: dict[str, str]) -> dict[str, Any]:
    """``obj`` with each packer field taken from its mapped name: ``{"messages": "dialog"}`` turns
    ``{"dialog": [...], "messages": "x"}`` into ``{"messages": [...]}`` (the mapping decides which wins)."""
    source = {col: field for field, col in columns.items()}
    return {source.get(k, k): v for k, v in obj.items() if k in source or k not in columns}
