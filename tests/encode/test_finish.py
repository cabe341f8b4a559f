"""The ``batch-finish`` fast path (packer/encode/finish.py) against ``Encoder._finish`` one record at a time, its
general path: byte-identical Encoded examples, the same located errors and the same chunk table, on random
batches (every record kind, images, trees, loss weights, overlong, no loss) and on the cases it must leave to
the general path."""

from __future__ import annotations

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from packer.core.types import Example
from packer.encode.encoder import FAST_PATHS, Encoder
from packer.encode.finish import BatchFinish
from packer.models import get_profile
from packer.shards.assemble import encoded_table
from tests.encode.helpers import assert_same, builtin, parse_all
from tests.encode.test_encoder import record
from tests.shards.test_encoded_table import _ipc


def without(encoder: Encoder) -> Encoder:
    """The same encoder with every fast path but ``batch-finish``."""
    return encoder.replace(fast=set(FAST_PATHS) - {"batch-finish"})


def check_batch(encoder: Encoder, examples: list[Example]) -> int:
    """Both paths on one batch: each record and the batch's table equal; returns the records batch-finish took."""
    reference = without(encoder)
    before = encoder.path_counts()["finish:batch"]
    got, want = encoder.encode_batch(examples), reference.encode_batch(examples)
    taken = encoder.path_counts()["finish:batch"] - before
    for a, b in zip(got, want, strict=True):
        if isinstance(b, list):  # a text split by long_docs="split": its chunks
            assert isinstance(a, list) and len(a) == len(b)
            for x, y in zip(a, b, strict=True):
                assert_same(x, y)
        else:
            assert_same(a, b)
    ok = [e for e in got if not isinstance(e, Exception) and not isinstance(e, list)]
    ok_want = [e for e in want if not isinstance(e, Exception) and not isinstance(e, list)]
    assert encoded_table(ok).equals(encoded_table(ok_want))
    # the table read from batch-finish's Rows (no Encoded) between the general path's Encodeds, in record
    # order, every other row and backwards (not consecutive): the same IPC bytes as the reference's
    rows = [x for e in encoder.encode_batch(examples, rows=True) if not isinstance(e, Exception)
            for x in (e if isinstance(e, list) else [e])]
    flat = [x for e in want if not isinstance(e, Exception) for x in (e if isinstance(e, list) else [e])]
    assert len(rows) == len(flat)
    for pick in (slice(None), slice(None, None, 2), slice(None, None, -1)):
        assert _ipc(encoded_table(rows[pick])) == _ipc(encoded_table(flat[pick]))
    assert reference.path_counts()["finish:batch"] == 0
    return taken


@settings(max_examples=40, deadline=None, derandomize=True, database=None,
          suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large, HealthCheck.function_scoped_fixture])
@given(records=st.lists(record(), min_size=1, max_size=12),
       name=st.sampled_from(["qwen2-vl", "qwen2-vl", "qwen2-vl-truncate", "qwen2-vl-drop", "llava", "text",
                             "qwen3-vl"]))
def test_batch_finish_equals_per_record(encoders, image_root, records, name):
    examples = [p for p in parse_all(records, image_root) if isinstance(p, Example)]
    check_batch(encoders[name], examples)


@pytest.fixture(scope="module")
def glm() -> Encoder:
    return Encoder(builtin("glm-4.6v"), get_profile("glm-4.6v", max_pixels=28 * 28 * 2 * 64))


@pytest.fixture(scope="module")
def onevision() -> Encoder:
    profile = get_profile("llava-onevision")
    return Encoder(builtin(profile.default_tokenizer), profile)


@settings(max_examples=15, deadline=None, derandomize=True, database=None,
          suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large, HealthCheck.function_scoped_fixture])
@given(records=st.lists(record(), min_size=1, max_size=12), name=st.sampled_from(["glm", "onevision"]))
def test_batch_finish_of_own_media_runs_equals_per_record(glm, onevision, image_root, records, name):
    """A family's own media_runs, asked per record (GLM-4.6V's, with its mRoPE: ``images_as_qwen2``; LLaVA-OneVision's,
    which tiles an image alone on its path: the general path's), by batch where its runs are the plain ones."""
    examples = [p for p in parse_all(records, image_root) if isinstance(p, Example)]
    check_batch(glm if name == "glm" else onevision, examples)


NAMED = ["internvl", "mistral3", "molmo2", "gemma4", "llama4"]


@pytest.fixture(scope="module")
def named() -> dict[str, Encoder]:
    """Families whose image run is named tokens (``MediaRun.tokens``), flat positions: InternVL's <img>...</img>
    and Gemma 4's (their entry one token in), Mistral 3's rows of [IMG] between [IMG_BREAK]s, Llama 4's tiles,
    Molmo2's (its own media_runs)."""
    out = {}
    for name in NAMED:
        profile = get_profile(name)
        out[name] = Encoder(builtin(profile.default_tokenizer), profile)
    return out


@settings(max_examples=8, deadline=None, derandomize=True, database=None,
          suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large, HealthCheck.function_scoped_fixture])
@given(records=st.lists(record(), min_size=1, max_size=12), name=st.sampled_from(NAMED))
def test_batch_finish_of_named_runs_equals_per_record(named, image_root, records, name):
    """Named-token image runs by batch: the run's own ids over its placeholder repeated, the entry ``lead`` in."""
    examples = [p for p in parse_all(records, image_root) if isinstance(p, Example)]
    check_batch(named[name], examples)


def _two_image_chat_and_tree() -> list[dict]:
    """A chat with two images (img/a.jpg, img/c.png) and a tree whose prompt holds img/a.jpg."""
    image = {"type": "image", "image": "img/a.jpg"}
    return [{"messages": [{"role": "user", "content": [image, {"type": "text", "text": "and"},
                                                       {"type": "image", "image": "img/c.png"}]},
                          {"role": "assistant", "content": "Two."}]},
            {"messages": [{"role": "user", "content": [image, {"type": "text", "text": "What?"}]}],
             "branches": [[{"role": "assistant", "content": "One."}], [{"role": "assistant", "content": "Two."}]]}]


@pytest.mark.parametrize("name", NAMED)
def test_batch_finish_takes_named_runs(named, image_root, name):
    """A chat with two images and a tree with one go by batch."""
    records = _two_image_chat_and_tree()
    assert check_batch(named[name], [p for p in parse_all(records, image_root)]) == 2


@pytest.fixture(scope="module")
def blocks_and_text() -> dict[str, Encoder]:
    """Gemma 3 with pan-and-scan (an elongated image written as blocks, one entry each: img/a.jpg, 640x427, is
    the whole image and 2 crops; img/c.png, 100x60, too small to crop, one block) and SmolVLM (its run a text,
    ``<fake_token_around_image>`` ... tokenized alone)."""
    gemma3 = get_profile("gemma3", do_pan_and_scan=True)
    smolvlm = get_profile("smolvlm")
    return {"gemma3": Encoder(builtin(gemma3.default_tokenizer), gemma3),
            "smolvlm": Encoder(builtin(smolvlm.default_tokenizer), smolvlm)}


@settings(max_examples=10, deadline=None, derandomize=True, database=None,
          suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large, HealthCheck.function_scoped_fixture])
@given(records=st.lists(record(), min_size=1, max_size=12), name=st.sampled_from(["gemma3", "smolvlm"]))
def test_batch_finish_of_blocks_and_text_runs_equals_per_record(blocks_and_text, image_root, records, name):
    """Image blocks (each block's placeholder its own entry) and text runs (their ids over the placeholder
    repeated, as named runs) by batch."""
    examples = [p for p in parse_all(records, image_root) if isinstance(p, Example)]
    check_batch(blocks_and_text[name], examples)


@pytest.mark.parametrize("name", ["gemma3", "smolvlm"])
def test_batch_finish_takes_blocks_and_text_runs(blocks_and_text, image_root, name):
    """A chat with an image in blocks beside one that is not, and a tree with one, go by batch."""
    records = _two_image_chat_and_tree()
    encoder = blocks_and_text[name]
    assert check_batch(encoder, [p for p in parse_all(records, image_root)]) == 2
    got = encoder.encode_batch([p for p in parse_all(records[:1], image_root)])[0]
    assert len(got.images) == (4 if name == "gemma3" else 2)  # a.jpg: the whole image and 2 crops


def test_batch_finish_takes_glm_records(glm, image_root):
    """A chat with an image, a tree and a text record of GLM-4.6V go by batch."""
    image = {"type": "image", "image": "img/a.jpg"}
    records = [{"messages": [{"role": "user", "content": [image, {"type": "text", "text": "What?"}]},
                             {"role": "assistant", "content": "A cat."}]},
               {"messages": [{"role": "user", "content": "Hi"}],
                "branches": [[{"role": "assistant", "content": "One."}], [{"role": "assistant", "content": "Two."}]]},
               {"text": "plain text"}]
    assert check_batch(glm, [p for p in parse_all(records, image_root)]) == 3


def test_batch_finish_takes_the_common_records_and_leaves_the_rest(encoders, image_root, tmp_path):
    """Chats, trees with images or none and text records go by batch; loss weights, no loss token, an overlong
    record, a literal image token and an unreadable image go to the general path, in the same batch."""
    image = {"type": "image", "image": "img/a.jpg"}
    (tmp_path / "bad.jpg").write_bytes(b"not an image")
    chat = {"messages": [{"role": "user", "content": [image, {"type": "text", "text": "What?"}]},
                         {"role": "assistant", "content": "A cat."}]}
    records = [
        chat,
        {"messages": [{"role": "user", "content": "Hi"}, {"role": "assistant", "content": "Hello there."}]},
        {"messages": [{"role": "user", "content": [image, image, {"type": "text", "text": "Two?"}]},
                      {"role": "assistant", "content": "Yes."}]},
        {"messages": [{"role": "user", "content": "Hi"}],
         "branches": [[{"role": "assistant", "content": "One."}], [{"role": "assistant", "content": "Two."}]]},
        {"messages": [{"role": "user", "content": "Hi"}], "branches": [  # an image in a branch
            [{"role": "user", "content": [image]}, {"role": "assistant", "content": "One."}]]},
        {"text": "plain text"},
        {"messages": [{"role": "user", "content": "only a question"}]},  # no_loss_tokens
        {"messages": [{"role": "user", "content": "<|image_pad|> literal"}, {"role": "assistant", "content": "No."}]},
        {"messages": [{"role": "user", "content": [{"type": "image", "image": str(tmp_path / "bad.jpg")}]},
                      {"role": "assistant", "content": "?"}]},
        {"messages": [{"role": "user", "content": "x " * 200}, {"role": "assistant", "content": "long"}]},
        chat,
    ]
    examples = [p for p in parse_all(records, image_root) if isinstance(p, Example)]
    assert len(examples) == len(records)
    # the chats (two images too), the trees, the text, the long one
    assert check_batch(encoders["qwen2-vl"], examples) == 8
    assert check_batch(encoders["qwen2-vl-drop"], examples) < 8  # over --max-length 90: the general path's
    weighted = [{"messages": [{"role": "user", "content": "Hi"}, {"role": "assistant", "content": "A.", "loss": 0.5}]},
                chat]
    assert check_batch(encoders["qwen2-vl"], [p for p in parse_all(weighted, image_root)]) == 0  # weights: general
    assert check_batch(encoders["qwen2-vl"], [p for p in parse_all([*weighted, {"text": "a"}], image_root)]) == 1


@pytest.mark.parametrize("name", ["text", "qwen2-vl", "qwen2-vl-truncate", "qwen2-vl-drop", "llava", "split",
                                  "gemma3"])
def test_batch_finish_of_text_records(encoders, image_root, name):
    """Text records by batch (bos + tokens + eos, mRoPE's flat rows) beside the ones it leaves: an empty text,
    one holding a media token literally, and one over ``max_length`` (dropped, truncated or split)."""
    if name == "split":
        encoder = encoders["text"].replace(max_length=40, long_docs="split", long_docs_overlap=4)
    elif name == "gemma3":  # a tokenizer with a bos token
        encoder = Encoder(builtin("gemma3"), get_profile("text"), max_length=100, overlong="truncate")
    else:
        encoder = encoders[name]
    records = [{"text": "plain text"}, {"text": ""}, {"text": "a <|image_pad|> b <image>"},
               {"text": "word " * 300}, {"text": "Hello world. " * 3},
               {"messages": [{"role": "user", "content": "Hi"}, {"role": "assistant", "content": "Hello."}]},
               {"text": "x"}]
    examples = [p for p in parse_all(records, image_root) if isinstance(p, Example)]
    assert check_batch(encoder, examples) >= 3


@pytest.mark.parametrize(("name", "taken"), [("qwen2-vl", True), ("llava", True), ("text", True),
                                             ("qwen3-vl", True), ("qwen2.5-vl", True)])
def test_batch_finish_only_for_the_rules_it_knows(tok, name, taken):
    """Flat positions or Qwen2-VL's mRoPE for images (Qwen3-VL's subclass differs in videos only); other
    positions (Omni's) are the general path's."""
    encoder = Encoder(tok, get_profile(name))
    assert (BatchFinish.of(encoder.context) is not None) == taken
