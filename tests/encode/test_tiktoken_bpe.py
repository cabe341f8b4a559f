"""The tiktoken engine (packer/encode/tiktoken_bpe.py) against the HF tokenizer it replaces: the same ids on
adversarial text, the same ids and labels on the build's own records (chats, trees, images, videos, tool calls),
the general path still run where it must, and no engine where it would not be exact."""

from __future__ import annotations

import json
import unicodedata

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from tokenizers import AddedToken, Tokenizer, normalizers, pre_tokenizers

from packer.core.types import Example
from packer.encode.encoder import FAST_PATHS, Encoder
from packer.encode.tiktoken_bpe import TiktokenBPE
from packer.encode.tokenizers import load_tokenizer
from packer.models import get_profile
from packer.models.registry import builtin_tokenizers
from tests.encode.helpers import assert_same, general, one_by_one, parse_all
from tests.encode.reference_tokenizers import reference_tokenizer
from tests.encode.test_builtin_tokenizers import NFC_EXAMPLE, adversarial

ENGINE_BUILTINS = [n for n in builtin_tokenizers() if n != "mistral3"]
TIKTOKEN = set(FAST_PATHS) - {"fastokens"}  # fastokens comes first where it applies: these tests are tiktoken's


def _check_engine(name: str, max_examples: int) -> None:
    backend = load_tokenizer(name).backend_tokenizer
    engine, ref = TiktokenBPE.of(backend), reference_tokenizer(name)
    assert engine is not None

    @settings(max_examples=max_examples, deadline=None, derandomize=True, database=None,
              suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
    @given(texts=st.lists(adversarial(name), min_size=1, max_size=6))
    def check(texts):
        got = engine.encode(texts)
        for text, ids, want in zip(texts, got, ref.encode_batch(texts, add_special_tokens=False), strict=True):
            if ids is None:  # left to the HF tokenizer: only a text NFC rewrites
                assert engine.nfc and not unicodedata.is_normalized("NFC", text)
            else:
                assert ids == want.ids, text

    check()


def test_engine_equals_hf_on_adversarial_text_qwen(qwen_tokenizer):
    _check_engine("qwen2-vl", 60)
    assert TiktokenBPE.of(qwen_tokenizer.backend_tokenizer).encode([NFC_EXAMPLE]) == [None]


@pytest.mark.slow
@pytest.mark.parametrize("name", [n for n in ENGINE_BUILTINS if n != "qwen2-vl"])
def test_engine_equals_hf_on_adversarial_text(name):
    """Every builtin but mistral3 (tekken: not a RANKS file) gets the engine, and it equals the reference."""
    _check_engine(name, 30)


def test_no_engine_where_not_exact(qwen_tokenizer):
    """Another normalizer, a prefix space, a normalized added token, an added token that is a prefix of
    another, a BPE that merges a vocabulary whose merges miss tokens (Llama 3's without ``ignore_merges``), or
    a vocabulary that is not the rank file's: no engine (the HF tokenizer does the work)."""
    original = qwen_tokenizer.backend_tokenizer.to_str()
    assert TiktokenBPE.of(Tokenizer.from_str(original)) is not None
    changes = [
        lambda t: setattr(t, "normalizer", normalizers.NFKC()),
        lambda t: setattr(t, "pre_tokenizer", pre_tokenizers.ByteLevel(add_prefix_space=True)),
        lambda t: t.add_tokens([AddedToken("hello there", normalized=True)]),
        lambda t: t.add_special_tokens([AddedToken("<|im_end|>x", normalized=False)]),
    ]
    llama = load_tokenizer("llama3").backend_tokenizer.to_str()  # its merges do not reach every token
    backend = Tokenizer.from_str(llama)
    assert TiktokenBPE.of(backend) is not None
    backend.model.ignore_merges = False
    assert TiktokenBPE.of(backend) is None
    for change in changes:
        backend = Tokenizer.from_str(original)
        change(backend)
        assert TiktokenBPE.of(backend) is None
    assert TiktokenBPE.of(load_tokenizer("mistral3").backend_tokenizer) is None


def _records(text: str) -> list[dict]:
    image = {"type": "image", "image": "img/a.jpg"}
    ask = {"role": "user", "content": [image, {"type": "text", "text": "What? " + text}]}
    return [
        {"messages": [{"role": "user", "content": "Hi " + text}, {"role": "assistant", "content": text + " fine."}]},
        {"messages": [ask, {"role": "assistant", "content": "A cat " + text}]},
        {"messages": [{"role": "user", "content": text + "?"}],
         "branches": [[{"role": "assistant", "content": "One " + text}], [{"role": "assistant", "content": "Two."}]]},
        {"text": "plain " + text},
    ]


@settings(max_examples=20, deadline=None, derandomize=True, database=None,
          suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture])
@given(text=adversarial("qwen2-vl"))
def test_build_records_equal_general_path(qwen_tokenizer, image_root, text):
    """Chats, images and trees holding adversarial text: ids and labels of the fast encoder (tiktoken) equal
    the general path's (HF tokenizer, offsets); the engine ran on the fast one (on every text, unless NFC
    rewrites the text: then on none) and never on the general one."""
    encoder = Encoder(qwen_tokenizer, get_profile("qwen2-vl", max_pixels=64 * 28 * 28), fast=TIKTOKEN)
    examples = [p for p in parse_all(_records(text), image_root) if isinstance(p, Example)]
    slow = general(encoder)
    for got, want in zip(encoder.encode_batch(examples), one_by_one(slow, examples), strict=True):
        assert_same(got, want)
    counts = encoder.path_counts()
    nfc = unicodedata.is_normalized("NFC", text)
    assert (counts["tokens:tiktoken"] > 0, counts["tokens:hf"] > 0) == (nfc, not nfc), counts
    assert slow.path_counts()["tokens:tiktoken"] == 0 and slow.path_counts()["tokens:hf"] > 0


@pytest.mark.slow
def test_tool_calls_and_videos_equal_general_path(image_root, tmp_path):
    """Tool calls (qwen2.5's template) and videos (qwen2.5-vl): the engine's ids and labels equal the general path's."""
    from tests.media.make_videos import write_clip

    tools = [{"type": "function", "function": {"name": "get_weather", "description": "Weather in a city.",
                                               "parameters": {"type": "object", "properties": {"city": {"type": "string"}}}}}]
    tool_records = [{"tools": tools, "messages": [
        {"role": "user", "content": "Weather in Zu\u0308rich and 東京?"},
        {"role": "assistant", "tool_calls": [{"type": "function", "function": {"name": "get_weather", "arguments": {"city": "Zürich"}}}]},
        {"role": "tool", "name": "get_weather", "content": "18 C <tool_call>"},
        {"role": "assistant", "content": "18 C in Zürich. \U0001f468\u200d\U0001f469\u200d\U0001f467"}]}]
    tool_records.append(json.loads(json.dumps(tool_records[0]).replace("Zu\\u0308rich", "Z\\u00fcrich")))  # NFC
    clip = write_clip(tmp_path / "clip.mp4", fps=2, frames=4, width=64, height=48)
    video_records = [{"messages": [{"role": "user", "content": [{"type": "video", "video": str(clip)}, {"type": "text", "text": "Qu'est-ce que c'est ?"}]},
                                   {"role": "assistant", "content": "Un carre\u0301 gris."}]}]
    video_records.append({"messages": [video_records[0]["messages"][0], {"role": "assistant", "content": "Un carré gris."}]})
    for tokenizer, profile, records in (
        ("qwen2.5", get_profile("text"), tool_records),
        (get_profile("qwen2.5-vl").default_tokenizer, get_profile("qwen2.5-vl", max_pixels=128 * 32 * 32), video_records),
    ):
        encoder = Encoder(load_tokenizer(tokenizer), profile, fast=TIKTOKEN)
        examples = [p for p in parse_all(records, image_root) if isinstance(p, Example)]
        for got, want in zip(encoder.encode_batch(examples), one_by_one(general(encoder), examples), strict=True):
            assert_same(got, want)
        assert encoder.path_counts()["tokens:tiktoken"] > 0 and encoder.path_counts()["tokens:hf"] > 0
