"""The build's fast paths against the general paths they stand in for, on many random records.

- ``Renderer.encode_batch`` (one tokenizer call per batch, the registered ChatML renderer) gives byte-identical
  Encoded examples, and the same located errors, as ``encode`` one example at a time through the Jinja
  template (the general path: ``_fast`` off).
- The ChatML renderer gives Jinja's exact text and content spans; a record holding a marker character falls
  back to Jinja; a template that is not registered, or that disagrees on the probes, gets no fast path.
- A pickled Renderer encodes identically in a fresh process without importing transformers.
"""

from __future__ import annotations

import copy
import pickle
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from PIL import Image

from packer.core.types import Encoded, Example, ImageRef, Message
from packer.encode.renderer import OPEN, Renderer
from packer.errors import RecordError
from packer.formats import parse_record
from packer.models import get_profile

IMAGES = ("a.jpg", "b.jpg", "c.png")
IMAGE_PAD = 151655
# Content that templates and tokenizers treat specially: whitespace and newlines at the edges (merged into
# neighbouring tokens), special-token text, Jinja syntax, multi-byte characters, and the marker character.
ALPHABET = "ab cd\n\t.,?!0123456789éü中🙂"
TRICKY = ["", " ", "\n", "\n\n", "  x  ", "<|im_end|>", "<|im_start|>user\n", "{{ x }}", "{% if %}", "<think>y</think>",
          "<|image_pad|>", OPEN, "\ue001"]

plain = st.text(alphabet=ALPHABET, max_size=30)
text = st.one_of(plain, plain, plain, st.sampled_from(TRICKY))  # one draw in four is a tricky string
plain1 = st.text(alphabet=ALPHABET, min_size=1, max_size=30)
nonempty = st.one_of(plain1, plain1, plain1, st.sampled_from([t for t in TRICKY if t]))


@st.composite
def content(draw, *, images: bool) -> str | list[dict]:
    if not images or not draw(st.booleans()):
        return draw(nonempty)
    parts: list[dict] = []
    for _ in range(draw(st.integers(1, 4))):
        if draw(st.booleans()):
            parts.append({"type": "image", "image": f"img/{draw(st.sampled_from(IMAGES))}"})
        else:
            parts.append({"type": "text", "text": draw(nonempty)})
    return parts


@st.composite
def message(draw, role: str, *, images: bool = False) -> dict:
    m = {"role": role, "content": draw(content(images=images))}
    if draw(st.integers(0, 5)) == 0:
        m["loss"] = draw(st.booleans())
    return m


@st.composite
def turns(draw, *, images: bool) -> list[dict]:
    msgs = [draw(message("system"))] if draw(st.booleans()) else []
    for _ in range(draw(st.integers(1, 3))):
        msgs.append(draw(message(draw(st.sampled_from(["user", "user", "tool"])), images=images)))
        msgs.append(draw(message("assistant", images=images and draw(st.integers(0, 5)) == 0)))
    return msgs


@st.composite
def branch(draw, depth: int):
    msgs = draw(turns(images=False))[-2:] if draw(st.booleans()) else [draw(message("assistant"))]
    if depth == 0 or draw(st.booleans()):
        return msgs
    return {"messages": msgs, "branches": draw(st.lists(branch(depth - 1), min_size=1, max_size=3))}


@st.composite
def record(draw) -> dict:
    kind = draw(st.sampled_from(["chat", "chat", "tree", "tree", "llava", "text"]))
    images = draw(st.booleans())
    if kind == "chat":
        return {"messages": draw(turns(images=images))}
    if kind == "tree":
        return {"messages": draw(turns(images=images))[:-1], "branches": draw(st.lists(branch(2), min_size=1, max_size=3))}
    if kind == "llava":
        n = draw(st.integers(0, 2)) if images else 0
        conv = [{"from": "human", "value": "<image>\n" * n + draw(text)}, {"from": "gpt", "value": draw(nonempty)}]
        rec: dict = {"conversations": conv}
        if n:
            rec["image"] = [f"img/{draw(st.sampled_from(IMAGES))}" for _ in range(n)]
        return rec
    return {"text": draw(nonempty)}


@pytest.fixture(scope="module")
def image_root(coco_images, tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("fast")
    (root / "img").mkdir()
    shutil.copy(coco_images[0], root / "img" / IMAGES[0])
    shutil.copy(coco_images[1], root / "img" / IMAGES[1])
    Image.open(coco_images[2]).convert("RGB").resize((100, 60)).save(root / "img" / IMAGES[2])  # a PNG
    return root


def general(renderer: Renderer) -> Renderer:
    """The same Renderer on the general path: every conversation through the Jinja template, every label
    boundary from the tokenizer's character offsets."""
    slow = copy.copy(renderer)
    slow._fast = None
    slow._token_bytes = None
    return slow


@pytest.fixture(scope="module")
def renderers(qwen_tokenizer) -> dict[str, Renderer]:
    tok = qwen_tokenizer
    return {
        "qwen2-vl": Renderer(tok, get_profile("qwen2-vl", max_pixels=64 * 28 * 28)),
        "qwen2-vl-truncate": Renderer(tok, get_profile("qwen2-vl", max_pixels=64 * 28 * 28), max_length=60,
                                      overlong="truncate"),
        "qwen2-vl-drop": Renderer(tok, get_profile("qwen2-vl", max_pixels=64 * 28 * 28), max_length=90),
        "llava": Renderer(tok, get_profile("llava")),
        "text": Renderer(tok, get_profile("text")),
    }


def parse_all(records: list[dict], root: Path) -> list[Example | RecordError]:
    out: list[Example | RecordError] = []
    for i, rec in enumerate(records):
        try:
            out.append(parse_record(rec, path="f.jsonl", line=i + 1, base_dir=str(root)))
        except RecordError as e:
            out.append(e)
    return out


def one_by_one(renderer: Renderer, examples: list[Example]) -> list[Encoded | RecordError]:
    out: list[Encoded | RecordError] = []
    for ex in examples:
        try:
            out.append(renderer.encode(ex))
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


@settings(max_examples=150, deadline=None, derandomize=True, database=None,
          suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large, HealthCheck.function_scoped_fixture])
@given(records=st.lists(record(), min_size=1, max_size=16),
       name=st.sampled_from(["qwen2-vl", "qwen2-vl", "qwen2-vl-truncate", "qwen2-vl-drop", "llava", "text"]))
def test_encode_batch_equals_general_path(renderers, image_root, records, name):
    renderer = renderers[name]
    parsed = parse_all(records, image_root)
    examples = [p for p in parsed if isinstance(p, Example)]
    batch = renderer.encode_batch(examples)
    assert len(batch) == len(examples)
    for got, want in zip(batch, one_by_one(general(renderer), examples), strict=True):
        assert_same(got, want)


def test_encode_batch_mixed_errors_are_located(renderers, image_root):
    """Bad records in the middle of a batch: each gets its own located error, the others are unaffected."""
    records = [
        {"messages": [{"role": "user", "content": "Hi"}, {"role": "assistant", "content": "Hello."}]},
        {"messages": [{"role": "user", "content": "only a question"}]},  # no_loss_tokens
        {"text": "literal <|image_pad|> token"},  # image_count_mismatch
        {"messages": [{"role": "user", "content": [{"type": "image", "image": "img/a.jpg"}, {"type": "text", "text": "?"}]},
                      {"role": "assistant", "content": "A picture."}]},
        {"messages": [{"role": "user", "content": "x " * 200}, {"role": "assistant", "content": "y"}]},  # overlong
    ]
    examples = [ex for ex in parse_all(records, image_root) if isinstance(ex, Example)]
    renderer = renderers["qwen2-vl-drop"]
    batch = renderer.encode_batch(examples)
    assert [b.reason if isinstance(b, RecordError) else "ok" for b in batch] == [
        "ok", "no_loss_tokens", "image_count_mismatch", "ok", "overlong"]
    assert [b.line for b in batch if isinstance(b, RecordError)] == [2, 3, 5]
    for got, want in zip(batch, one_by_one(general(renderer), examples), strict=True):
        assert_same(got, want)
    assert renderer.encode_batch([]) == []


@settings(max_examples=300, deadline=None, derandomize=True, database=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(convs=st.lists(st.tuples(st.sampled_from(["system", "user", "assistant", "tool"]),
                                st.lists(st.one_of(text, st.just(None)), min_size=0, max_size=4)),
                      min_size=1, max_size=5))
def test_chatml_renderer_equals_jinja(renderers, convs):
    """Text and content spans equal the Jinja template's on any conversation (None parts are images)."""
    renderer = renderers["qwen2-vl"]
    image = ImageRef(path="x.jpg")
    conv = [Message(role, [image if p is None else p for p in parts]) for role, parts in convs]
    fast = renderer._fast.locate(conv)
    want = locate(general(renderer), conv)
    if any(OPEN in p or "\ue001" in p for _, parts in convs for p in parts if p is not None):
        assert fast is None  # a marker character in the content: Jinja (and its marker check) decides
    else:
        assert fast == want
    assert locate(renderer, conv) == want


def locate(renderer: Renderer, conv: list[Message]) -> tuple | str:
    try:
        return renderer._locate(conv)
    except RecordError as e:
        return str(e)


@settings(max_examples=300, deadline=None, derandomize=True, database=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(text=st.text(alphabet=ALPHABET + "\u0301\U0001f44d\u200d" + "<|im_end|>", min_size=1, max_size=50))
def test_byte_boundaries_equal_offsets(renderers, text):
    """Token boundaries from byte lengths equal those from character offsets at every character, including
    characters split across byte-level tokens (emoji, combining marks) and special tokens in the text."""
    renderer = renderers["qwen2-vl"]
    enc = renderer._backend.encode(text, add_special_tokens=False)
    ids = np.array(enc.ids, dtype=np.int32)
    token_at, starts_before = renderer._byte_boundaries(ids, text)
    want_at, want_before = general(renderer)._offset_boundaries(ids, enc, text)
    for c in range(len(text) + 1):
        assert token_at(c) == want_at(c), c
        for t in range(ids.shape[0]):
            assert starts_before(t, c) == want_before(t, c), (t, c)


def test_byte_lengths_only_for_byte_level_tokenizers(renderers):
    """A normalizer, a prefix space or trimmed offsets break "tokens spell the bytes": offsets are used."""
    from tokenizers import Tokenizer, normalizers, pre_tokenizers, processors

    renderer = copy.copy(renderers["qwen2-vl"])
    assert renderer._byte_lengths() is not None
    original = renderer._backend.to_str()
    for change in (
        lambda t: setattr(t, "normalizer", normalizers.NFC()),
        lambda t: setattr(t, "pre_tokenizer", pre_tokenizers.ByteLevel(add_prefix_space=True)),
        lambda t: setattr(t, "pre_tokenizer", pre_tokenizers.Metaspace()),
        lambda t: setattr(t, "post_processor", processors.ByteLevel(trim_offsets=True)),
    ):
        renderer._backend = Tokenizer.from_str(original)
        assert renderer._cached_byte_lengths() is not None
        change(renderer._backend)  # the same tokenizer object, changed in place: the cache must notice
        assert renderer._byte_lengths() is None and renderer._cached_byte_lengths() is None


def test_fast_path_only_for_registered_templates(qwen_tokenizer):
    tok = qwen_tokenizer
    profile = get_profile("qwen2-vl")
    assert Renderer(tok, profile)._fast is not None
    # The same template with one byte changed renders the same, but it is not registered: the Jinja path.
    assert Renderer(tok, profile, chat_template=tok.chat_template + " ")._fast is None
    # A registered renderer that disagreed with Jinja on the probes would be refused.
    r = Renderer(tok, profile)
    wrong = copy.copy(r._fast)
    wrong.default_system = "<|im_start|>system\nBe terse.<|im_end|>\n"
    assert r._checked_fast(wrong) is None


def test_pickled_renderer_needs_no_transformers(renderers, image_root, tmp_path):
    """A worker gets the Renderer pickled: same Encoded bytes, and transformers is never imported."""
    recs = [{"messages": [{"role": "user", "content": [{"type": "image", "image": "img/a.jpg"}, {"type": "text", "text": "What?"}]},
                          {"role": "assistant", "content": "A cat."}]},
            {"messages": [{"role": "user", "content": "Hi"}], "branches": [[{"role": "assistant", "content": "One."}],
                                                                          [{"role": "assistant", "content": "Two."}]]}]
    examples = [ex for ex in parse_all(recs, image_root) if isinstance(ex, Example)]
    (tmp_path / "r.pkl").write_bytes(pickle.dumps((renderers["qwen2-vl"], examples)))
    script = (
        "import pickle, sys\n"
        f"r, exs = pickle.loads(open({str(tmp_path / 'r.pkl')!r}, 'rb').read())\n"
        "out = r.encode_batch(exs)\n"
        "assert 'transformers' not in sys.modules and 'torch' not in sys.modules, 'transformers was imported'\n"
        "sys.stdout.buffer.write(pickle.dumps(out))\n"
    )
    run = subprocess.run([sys.executable, "-c", script], capture_output=True, check=False)
    assert run.returncode == 0, run.stderr.decode()
    for got, want in zip(pickle.loads(run.stdout), renderers["qwen2-vl"].encode_batch(examples), strict=True):
        assert_same(got, want)
