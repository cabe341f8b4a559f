"""Helpers shared by the encode tests: expected sequences built piece by piece, records, comparisons."""

from __future__ import annotations

from functools import lru_cache
from pathlib import Path
from typing import Any

import numpy as np
from hypothesis import strategies as st

from packer.core.types import IGNORE_INDEX, Encoded, Example
from packer.encode.encoder import Encoder
from packer.encode.templates import CLOSE, OPEN
from packer.errors import RecordError
from packer.formats import parse_record

SYS_DEFAULT = "<|im_start|>system\nYou are a helpful assistant.<|im_end|>\n"
IMAGE_PAD = 151655
VISION_START, VISION_END = 151652, 151653
IMAGES = ("a.jpg", "b.jpg", "c.png")  # under the image_root fixture's img/

_BUILTINS: dict[str, Any] = {}


def builtin(name: str) -> Any:
    """``load_tokenizer(name)``, kept for the whole test process (an xdist worker): the same object every time.
    ``load_tokenizer`` keeps 8 and the files that sweep the ~17 builtins (fastokens, references, templates,
    released constants) evicted each other's in turn; each eviction cost a reload (~0.9 CPU-s) and fastokens'
    native tokenizer, which lives as long as its tokenizer (~2.9 CPU-s for a 151k vocabulary)."""
    if name not in _BUILTINS:
        from packer.encode.tokenizers import load_tokenizer

        _BUILTINS[name] = load_tokenizer(name)
    return _BUILTINS[name]

# Content that templates and tokenizers treat specially: whitespace and newlines at the edges (merged into
# neighbouring tokens), special-token text, Jinja syntax, multi-byte characters, and the marker characters.
ALPHABET = "ab cd\n\t.,?!0123456789éü中🙂"
TRICKY = ["", " ", "\n", "\n\n", "  x  ", "<|im_end|>", "<|im_start|>user\n", "{{ x }}", "{% if %}", "<think>y</think>",
          "<|image_pad|>", OPEN, CLOSE]
plain = st.text(alphabet=ALPHABET, max_size=30)
text = st.one_of(plain, plain, plain, st.sampled_from(TRICKY))  # one draw in four is a tricky string
plain1 = st.text(alphabet=ALPHABET, min_size=1, max_size=30)
nonempty = st.one_of(plain1, plain1, plain1, st.sampled_from([t for t in TRICKY if t]))


class Seq:
    """Expected (ids, labels) built from pieces: ``add(text, loss)`` tokenizes one known string."""

    def __init__(self, tok):
        self.tok = tok
        self.ids: list[int] = []
        self.labels: list[int] = []

    def add(self, text: str, loss: bool = False) -> Seq:
        ids = self.tok.encode(text, add_special_tokens=False)
        self.ids += ids
        self.labels += ids if loss else [IGNORE_INDEX] * len(ids)
        return self

    def image(self, n: int) -> Seq:
        self.ids += [VISION_START] + [IMAGE_PAD] * n + [VISION_END]
        self.labels += [IGNORE_INDEX] * (n + 2)
        return self

    def turn(self, role: str, content: str, loss: bool) -> Seq:
        """<|im_start|>role\\n + content + <|im_end|> + \\n; loss on content and <|im_end|>."""
        return self.add(f"<|im_start|>{role}\n").add(content, loss).add("<|im_end|>", loss).add("\n")

    def arrays(self) -> tuple[np.ndarray, np.ndarray]:
        labels = np.array(self.labels, dtype=np.int32)
        labels[:1] = IGNORE_INDEX
        return np.array(self.ids, dtype=np.int32), labels


def example(rec: dict, base_dir: Path | str = "/") -> Example:
    return parse_record(rec, path="t.jsonl", line=3, base_dir=str(base_dir))


def msg(role: str, content, **kw) -> dict:
    return {"role": role, "content": content, **kw}


def assert_encoded(enc, seq: Seq) -> None:
    ids, labels = seq.arrays()
    assert enc.input_ids.dtype == np.int32 and enc.labels.dtype == np.int32
    np.testing.assert_array_equal(enc.input_ids, ids)
    np.testing.assert_array_equal(enc.labels, labels)


@lru_cache(maxsize=32)
def general(encoder: Encoder) -> Encoder:
    """The same Encoder on the general path (``fast=False``): every conversation through the Jinja template,
    every label boundary from the tokenizer's character offsets."""
    return encoder.replace(fast=False)


def parse_all(records: list[dict], root: Path) -> list[Example | RecordError]:
    out: list[Example | RecordError] = []
    for i, rec in enumerate(records):
        try:
            out.append(parse_record(rec, path="f.jsonl", line=i + 1, base_dir=str(root)))
        except RecordError as e:
            out.append(e)
    return out


def one_by_one(encoder: Encoder, examples: list[Example]) -> list[Encoded | RecordError]:
    out: list[Encoded | RecordError] = []
    for ex in examples:
        try:
            out.append(encoder.encode(ex))
        except RecordError as e:
            out.append(e)
    return out


def assert_same(got: Encoded | RecordError, want: Encoded | RecordError) -> None:
    """Byte-identical Encoded (every array's dtype, shape and bytes) or the same located error."""
    if isinstance(want, RecordError):
        assert isinstance(got, RecordError), f"expected {want}, got an Encoded example"
        assert (got.reason, got.message, got.path, got.line) == (want.reason, want.message, want.path, want.line)
        return
    assert isinstance(got, Encoded), f"expected an Encoded example, got {got}"
    for name in ("input_ids", "labels", "position_ids", "node_offsets", "node_parents", "mrope_position_ids"):
        a, b = getattr(got, name), getattr(want, name)
        if b is None:
            assert a is None, name
            continue
        assert a.dtype == b.dtype and a.shape == b.shape and a.tobytes() == b.tobytes(), name
    assert (got.example_id, got.source_name, got.images) == (want.example_id, want.source_name, want.images)
