"""The fastokens engine (packer/encode/fastokens_bpe.py) against the HF tokenizer it replaces: the same ids on
adversarial text for every builtin (transformers' reference tokenizers), NFC text, literal special tokens, a
user's own tokenizer file with added tokens; the HF tokenizer where it must (a lone surrogate, a byte-fallback
vocabulary, added-token flags it is not checked on); and the build's own records byte-identical. Where the
native tokenizer is built by ``from_tiktoken`` (``tiktoken_spec``: every builtin but llama3 and mistral3), the same
fuzz runs on it, and a text that is not NFC under an NFC normalizer goes to the HF tokenizer."""

from __future__ import annotations

import json
import unicodedata
from itertools import pairwise

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from tokenizers import AddedToken, Regex, Tokenizer, decoders, models, normalizers, pre_tokenizers, trainers
from transformers import PreTrainedTokenizerFast

from packer.core.types import Example
from packer.encode import fastokens_bpe
from packer.encode.encoder import Encoder
from packer.encode.fastokens_bpe import FastokensBPE
from packer.models import get_profile
from packer.models.registry import builtin_tokenizers
from tests.encode.helpers import assert_same, builtin, general, one_by_one, parse_all
from tests.encode.reference_tokenizers import reference_tokenizer, referenced_builtins
from tests.encode.test_builtin_tokenizers import NFC_EXAMPLE, adversarial


def _ids(engine: FastokensBPE, texts: list[str]) -> list[list[int] | None]:
    flat, left = engine.encode(texts)
    assert flat.ids.dtype == np.int32 and len(flat.starts) == len(texts) + 1
    return [None if k in left else flat.ids[a:b].tolist() for k, (a, b) in enumerate(pairwise(flat.starts))]


# the builtins whose tokenizer.json is not from_tiktoken's (``tiktoken_spec``): Llama 3's ranks hold tokens its
# merges never make (``Ranks.own_bpe``), mistral3's tekken puts its control tokens first
_JSON_BUILT = {"llama3", "mistral3"}


def _check(name: str, max_examples: int) -> None:
    backend = builtin(name).backend_tokenizer
    engine = FastokensBPE.of(backend)
    assert engine is not None
    assert (engine.tiktoken is None) == (name in _JSON_BUILT), name
    assert engine.nfc_only == (engine.tiktoken is not None and backend.normalizer is not None)
    # mistral3 (tekken) has no reference in tests/encode/reference_tokenizers.py: its own tokenizer is the reference
    ref = reference_tokenizer(name) if name in referenced_builtins() else backend

    @settings(max_examples=max_examples, deadline=None, derandomize=True, database=None,
              suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
    @given(texts=st.lists(adversarial(name), min_size=1, max_size=6))
    def check(texts):
        for text, ids, want in zip(texts, _ids(engine, texts), ref.encode_batch(texts, add_special_tokens=False),
                                   strict=True):
            # a text that is not NFC goes to the HF tokenizer where tiktoken would meet it without NFC
            assert ids == want.ids or (ids is None and engine.nfc_only and not unicodedata.is_normalized("NFC", text)), text

    check()


def test_engine_equals_hf_on_adversarial_text_qwen(qwen_tokenizer):
    _check("qwen2-vl", 60)
    engine = FastokensBPE.of(qwen_tokenizer.backend_tokenizer)
    want = qwen_tokenizer.backend_tokenizer.encode(NFC_EXAMPLE, add_special_tokens=False).ids
    assert want == [[924, 58858, 43117, 533]][0]
    composed = unicodedata.normalize("NFC", NFC_EXAMPLE)
    # from_tiktoken's: the decomposed text goes to the HF tokenizer, its NFC form to fastokens, the same ids
    assert _ids(engine, [NFC_EXAMPLE, composed, "ok"]) == [None, want, [562]]
    literal = "<|im_start|>user\nhi<|im_end|><|image_pad|>"  # literal special tokens in the text: one id each
    assert _ids(engine, [literal])[0][:1] == [qwen_tokenizer.convert_tokens_to_ids("<|im_start|>")]


@pytest.mark.slow
@pytest.mark.parametrize("name", [n for n in builtin_tokenizers() if n != "qwen2-vl"])
def test_engine_equals_hf_on_adversarial_text(name):
    """Every builtin, mistral3's tekken too, gets the engine, and it equals the reference."""
    _check(name, 30)


def test_lone_surrogate_goes_to_hf(qwen_tokenizer):
    engine = FastokensBPE.of(qwen_tokenizer.backend_tokenizer)
    assert _ids(engine, ["ok", "bad \ud800", "fine"]) == [[562], None, [62057]]


def _user_tokenizer(**added: AddedToken) -> PreTrainedTokenizerFast:
    """A byte-level BPE trained here on a little text (a user's own tokenizer.json), NFC, with added tokens."""
    backend = Tokenizer(models.BPE(ignore_merges=True))
    backend.normalizer = normalizers.NFC()
    backend.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Split(pattern=Regex(r"\s+|\w+|[^\s\w]+"), behavior="isolated"),
        pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)])
    backend.decoder = decoders.ByteLevel()
    text = ["The quick brown fox jumps over the lazy dog. Caf\u00e9 na\u00efve \u6771\u4eac 12345."] * 50
    backend.train_from_iterator(text, trainers.BpeTrainer(vocab_size=400, initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
                                                          special_tokens=["<s>", "</s>"]))
    backend.add_special_tokens([AddedToken("<|user|>", normalized=False), *added.values()])
    backend.add_tokens([AddedToken("quickfox", normalized=False)])
    return PreTrainedTokenizerFast(tokenizer_object=backend, bos_token="<s>", eos_token="</s>")


@settings(max_examples=40, deadline=None, derandomize=True, database=None,
          suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
@given(texts=st.lists(st.one_of(adversarial("qwen2-vl"), st.sampled_from(["<|user|>", "quickfox", "<s>", "quick fox"])),
                      min_size=1, max_size=6).map(lambda xs: ["".join(xs), *xs]))
def test_user_tokenizer_file_with_added_tokens(texts):
    tok = _user_tokenizer()
    backend = Tokenizer.from_str(tok.backend_tokenizer.to_str())  # as read back from a user's file
    engine = FastokensBPE.of(backend)
    assert engine is not None
    assert _ids(engine, texts) == [e.ids for e in backend.encode_batch(texts, add_special_tokens=False)]


def test_no_engine_for_unchecked_added_token_flags():
    """An added token that strips, matches as a single word or is normalized: the HF tokenizer encodes."""
    for flags in ({"lstrip": True}, {"rstrip": True}, {"single_word": True}, {"normalized": True}):
        tok = _user_tokenizer(extra=AddedToken("<|x|>", **{"normalized": False, **flags}))
        assert FastokensBPE.of(tok.backend_tokenizer) is None, flags
    assert FastokensBPE.of(_user_tokenizer().backend_tokenizer) is not None


def test_failed_probe_leaves_every_text_to_hf(image_root):
    """Where fastokens' ids differ from HF's on the probe (or it cannot load the file), the HF tokenizer encodes
    every text, with the same bytes out."""
    tok = _user_tokenizer()
    tok.chat_template = builtin("qwen2.5").chat_template
    encoder = Encoder(tok, get_profile("text"))
    assert encoder._fastokens is not None
    fastokens_bpe._NATIVE[encoder._fastokens.backend] = None  # what a failed probe leaves
    records = [{"messages": [{"role": "user", "content": "quick fox"}, {"role": "assistant", "content": "The dog."}]}]
    examples = [p for p in parse_all(records, image_root) if isinstance(p, Example)]
    for got, want in zip(encoder.encode_batch(examples), one_by_one(general(encoder), examples), strict=True):
        assert_same(got, want)
    assert encoder.path_counts()["tokens:fastokens"] == 0 and encoder.path_counts()["tokens:hf"] > 0


def test_a_failed_probe_or_load_is_said_never_silent():
    """The HF fallback keeps the ids exact but costs several times the time: a warning says why, once."""
    backend = _user_tokenizer().backend_tokenizer
    engine = FastokensBPE.of(backend)
    with pytest.warns(RuntimeWarning, match="probe texts differ from the HF tokenizer's"):
        assert fastokens_bpe._checked_native(backend.to_str(), [[0]] * len(engine.want)) is None
    with pytest.warns(RuntimeWarning, match="fastokens cannot load it"):
        assert fastokens_bpe._checked_native("{not a tokenizer", engine.want) is None
    assert fastokens_bpe._checked_native(backend.to_str(), engine.want) is not None


def test_byte_fallback_vocabulary_takes_the_hf_tokenizer(image_root):
    """A SentencePiece-style BPE with byte fallback: its boundaries need offsets, so the HF tokenizer encodes
    (no engine), and the encoder's output is the general path's."""
    backend = Tokenizer(models.BPE(byte_fallback=True, unk_token="<unk>"))
    backend.normalizer = normalizers.Sequence([normalizers.Prepend("\u2581"), normalizers.Replace(" ", "\u2581")])
    backend.decoder = decoders.Sequence([decoders.Replace("\u2581", " "), decoders.ByteFallback(), decoders.Fuse()])
    specials = ["<unk>", "<s>", "</s>", *(f"<0x{b:02X}>" for b in range(256))]
    backend.train_from_iterator(["Hello there, how are you today? Fine thanks."] * 20,
                                trainers.BpeTrainer(vocab_size=400, special_tokens=specials))
    tok = PreTrainedTokenizerFast(tokenizer_object=backend, bos_token="<s>", eos_token="</s>", unk_token="<unk>")
    tok.chat_template = builtin("qwen2.5").chat_template  # ChatML
    encoder = Encoder(tok, get_profile("text"))
    records = [{"messages": [{"role": "user", "content": "Hi \u6771"}, {"role": "assistant", "content": "Hello there."}]}]
    examples = [p for p in parse_all(records, image_root) if isinstance(p, Example)]
    for got, want in zip(encoder.encode_batch(examples), one_by_one(general(encoder), examples), strict=True):
        assert_same(got, want)
    assert encoder.path_counts()["tokens:fastokens"] == 0 and encoder.path_counts()["tokens:hf"] > 0


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
    """Chats, images, trees and text records holding adversarial text (NFC-rewritten too): the default encoder
    (fastokens, flat) gives the general path's bytes, and fastokens encoded every text."""
    encoder = Encoder(qwen_tokenizer, get_profile("qwen2-vl", max_pixels=64 * 28 * 28))
    examples = [p for p in parse_all(_records(text), image_root) if isinstance(p, Example)]
    for got, want in zip(encoder.encode_batch(examples), one_by_one(general(encoder), examples), strict=True):
        assert_same(got, want)
    counts = encoder.path_counts()
    nfc = unicodedata.is_normalized("NFC", text)
    assert nfc or counts["labels:offsets"] > 0  # NFC-rewritten: offsets' labels
    # from_tiktoken's engine (no normalizer): a text NFC rewrites is the HF tokenizer's
    assert (counts["tokens:fastokens"] > 0 and counts["tokens:hf"] == 0) or not nfc, counts


def test_the_hf_tokenizers_texts_are_spliced_into_the_flat_batch(qwen_tokenizer):
    """``Flat.with_texts``: the texts fastokens leaves (decomposed: first, inside, last) take their HF ids in their
    places, the batch's ids are the HF tokenizer's of every text, and the encodings are kept for their offsets."""
    backend = qwen_tokenizer.backend_tokenizer
    texts = [NFC_EXAMPLE, "one two", NFC_EXAMPLE + " three", "", "four five six", "x " + NFC_EXAMPLE]
    engine = FastokensBPE.of(backend)
    flat, rest = engine.encode(texts)
    assert rest == [0, 2, 5]
    hf = backend.encode_batch([texts[k] for k in rest], add_special_tokens=False)
    spliced = flat.with_texts(rest, hf, offsets=True)
    want = [e.ids for e in backend.encode_batch(texts, add_special_tokens=False)]
    assert spliced.ids.dtype == np.int32 and len(spliced.starts) == len(texts) + 1
    assert [spliced.ids[a:b].tolist() for a, b in pairwise(spliced.starts)] == want
    assert sorted(spliced.hf) == rest and spliced.hf[2].offsets == hf[1].offsets
    assert flat.with_texts(rest, hf, offsets=False).hf is None


def test_a_text_the_hf_tokenizer_encodes_is_encoded_once(qwen_tokenizer, image_root, monkeypatch):
    """A decomposed text in a fastokens batch: its labels read the offsets of the HF tokenizer's one encode of it
    (``Flat.hf``) instead of encoding it again, and every record equals the general path's."""
    from packer.encode.context import TokenizerView

    encoder = Encoder(qwen_tokenizer, get_profile("qwen2-vl", max_pixels=64 * 28 * 28))
    examples = [p for p in parse_all(_records(NFC_EXAMPLE) + _records("plain words"), image_root)
                if isinstance(p, Example)]
    want = one_by_one(general(encoder), examples)

    def again(self, text):
        raise AssertionError(f"encoded again for its offsets: {text!r}")

    monkeypatch.setattr(TokenizerView, "encoding", again)
    for got, one in zip(encoder.encode_batch(examples), want, strict=True):
        assert_same(got, one)
    counts = encoder.path_counts()
    assert counts["tokens:hf"] > 0 and counts["tokens:fastokens"] > 0 and counts["labels:offsets"] > 0, counts


@pytest.mark.slow
def test_tool_calls_and_videos_equal_general_path(image_root, tmp_path):
    """Tool calls (qwen2.5's template) and videos (qwen2.5-vl), NFC-rewritten text too: the engine's ids and labels
    equal the general path's."""
    from tests.media.make_videos import write_clip

    tools = [{"type": "function", "function": {"name": "get_weather", "description": "Weather in a city.",
                                               "parameters": {"type": "object", "properties": {"city": {"type": "string"}}}}}]
    tool_records = [{"tools": tools, "messages": [
        {"role": "user", "content": "Weather in Zu\u0308rich and \u6771\u4eac?"},
        {"role": "assistant", "tool_calls": [{"type": "function", "function": {"name": "get_weather", "arguments": {"city": "Z\u00fcrich"}}}]},
        {"role": "tool", "name": "get_weather", "content": "18 C <tool_call>"},
        {"role": "assistant", "content": "18 C in Z\u00fcrich. \U0001f468\u200d\U0001f469\u200d\U0001f467"}]}]
    tool_records.append(json.loads(json.dumps(tool_records[0]).replace("Zu\\u0308rich", "Z\\u00fcrich")))  # NFC
    clip = write_clip(tmp_path / "clip.mp4", fps=2, frames=4, width=64, height=48)
    video_records = [{"messages": [{"role": "user", "content": [{"type": "video", "video": str(clip)}, {"type": "text", "text": "Qu'est-ce que c'est ?"}]},
                                   {"role": "assistant", "content": "Un carre\u0301 gris."}]}]
    video_records.append({"messages": [video_records[0]["messages"][0], {"role": "assistant", "content": "Un carr\u00e9 gris."}]})
    for tokenizer, profile, records in (
        ("qwen2.5", get_profile("text"), tool_records),
        (get_profile("qwen2.5-vl").default_tokenizer, get_profile("qwen2.5-vl", max_pixels=128 * 32 * 32), video_records),
    ):
        encoder = Encoder(builtin(tokenizer), profile)
        examples = [p for p in parse_all(records, image_root) if isinstance(p, Example)]
        for got, want in zip(encoder.encode_batch(examples), one_by_one(general(encoder), examples), strict=True):
            assert_same(got, want)
        assert encoder.path_counts()["tokens:fastokens"] > 0  # the decomposed texts: the HF tokenizer's


def test_worker_builds_the_hf_tokenizer_only_for_a_text_that_needs_it(qwen_tokenizer, image_root):
    """An unpickled encoder (a worker's) encodes with fastokens without rebuilding the HF tokenizer (its probe is
    checked against the ids the parent computed); NFC-rewritten text (labels from offsets) rebuilds it, and
    every result equals the parent's. The native tokenizer stays the one the worker built: the HF tokenizer's
    arrival does not make it build fastokens' again (~1.3 CPU-s per worker, at its first decomposed text)."""
    import pickle

    parent = Encoder(qwen_tokenizer, get_profile("qwen2-vl", max_pixels=64 * 28 * 28))
    worker = pickle.loads(pickle.dumps(parent))
    view = worker.context.tokens
    examples = [p for p in parse_all(_records("plain words"), image_root) if isinstance(p, Example)]
    for got, want in zip(worker.encode_batch(examples), parent.encode_batch(examples), strict=True):
        assert_same(got, want)
    assert "backend" not in vars(view) and worker.path_counts()["tokens:fastokens"] > 0
    native = worker._fastokens.native()
    assert native is not None
    examples = [p for p in parse_all(_records(NFC_EXAMPLE), image_root) if isinstance(p, Example)]
    for got, want in zip(worker.encode_batch(examples), parent.encode_batch(examples), strict=True):
        assert_same(got, want)
    assert "backend" in vars(view) and worker.path_counts()["labels:offsets"] > 0
    assert worker._fastokens.native() is native


# ---------------------------------------------------------------- from_tiktoken's construction (``tiktoken_spec``)


_QWEN_JSON: list[dict] = []


def _qwen_json(qwen_tokenizer) -> dict:
    """Qwen2's tokenizer.json, parsed once (do not change it: copy what an edit changes)."""
    if not _QWEN_JSON:
        _QWEN_JSON.append(json.loads(qwen_tokenizer.backend_tokenizer.to_str()))
    return _QWEN_JSON[0]


def test_tiktoken_spec_is_the_rank_file(qwen_tokenizer):
    """Qwen2's tokenizer.json is TikTokenConverter's of qwen.tiktoken: its spec holds that file byte for byte, the
    Split pattern, the added tokens by id and NFC; the native tokenizer a kept start builds is from it."""
    from packer.models.shared.tokenizer import RANKS

    spec = fastokens_bpe.tiktoken_spec(qwen_tokenizer.backend_tokenizer.to_str())
    head = fastokens_bpe._spec_header(spec)
    assert spec.split("\n", 2)[2].encode() == RANKS["qwen2"].path().read_bytes()
    assert head["pattern"] == RANKS["qwen2"].pattern and head["nfc"] is True
    assert head["special_tokens"]["<|im_start|>"] == qwen_tokenizer.convert_tokens_to_ids("<|im_start|>")
    encoder = Encoder(qwen_tokenizer, get_profile("text"))
    assert encoder.engine_json() == spec  # what kept.keep_engine keeps and ``prepare`` takes a build of


def test_tiktoken_spec_refuses_what_it_cannot_prove(qwen_tokenizer):
    """Each condition broken alone: no spec (from_json_str builds the native tokenizer, as before)."""
    base = _qwen_json(qwen_tokenizer)

    def spec(data):  # tiktoken_spec of the file as parsed (``_spec``), or of a string
        return fastokens_bpe.tiktoken_spec(data) if isinstance(data, str) else fastokens_bpe._spec(data)

    def changed(edit) -> dict:  # a copy of what an edit may change, the rest (vocab) shared
        data = {**base, "model": {**base["model"], "merges": list(base["model"]["merges"])},
                "added_tokens": [dict(t) for t in base["added_tokens"]],
                "pre_tokenizer": json.loads(json.dumps(base["pre_tokenizer"]))}
        edit(data)
        return data

    def swap(data):  # two merges in the other order: HF would merge otherwise than tiktoken
        m = data["model"]["merges"]
        m[10], m[11] = m[11], m[10]

    def drop(data):  # one split of a token no merge: HF never makes that pair, tiktoken does
        del data["model"]["merges"][500]

    def fake(data):  # a merge that is not a split of a token into two (same count)
        data["model"]["merges"][-1] = ["\u0120", "zzzzzzzz"]

    for edit in (swap, drop, fake,
                 lambda d: d["model"].update(ignore_merges=False),
                 lambda d: d["model"].update(dropout=0.1),
                 lambda d: d["model"].update(byte_fallback=True),
                 lambda d: d.update(normalizer={"type": "NFKC"}),
                 lambda d: d["pre_tokenizer"]["pretokenizers"][0]["pattern"].update(Regex="\\w+|\\s+"),
                 lambda d: d["pre_tokenizer"]["pretokenizers"][1].update(add_prefix_space=True),
                 lambda d: d["added_tokens"][0].update(lstrip=True),
                 lambda d: d["added_tokens"][0].update(id=5)):
        assert spec(changed(edit)) is None, edit
    assert spec(changed(lambda d: d.update(normalizer=None))) is not None  # no normalizer: tiktoken's own
    assert spec("{not json") is None and spec(_user_tokenizer().backend_tokenizer.to_str()) is None


def test_a_spec_fastokens_refuses_falls_back_to_the_json(qwen_tokenizer):
    """Where from_tiktoken cannot build it (or fails the probe), the native tokenizer is from_json_str's: the same
    ids, no warning (exact either way)."""
    import warnings

    backend = _user_tokenizer().backend_tokenizer
    engine = FastokensBPE.of(backend)
    assert engine.tiktoken is None
    bad = fastokens_bpe.TIKTOKEN_MAGIC + json.dumps({"pattern": "x", "special_tokens": {}, "nfc": True}) + "\n!!! 0\n"
    broken = FastokensBPE(engine.source, engine.want, bad)
    assert broken.nfc_only and fastokens_bpe.build_native(bad) is None
    texts = ["The quick fox.", "<|user|> quickfox \u6771\u4eac"]
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert _ids(broken, texts) == [e.ids for e in backend.encode_batch(texts, add_special_tokens=False)]


def _rank_splits(vocab: dict[str, int]) -> int:
    """The splits of every token of ``vocab`` into two of its tokens: TikTokenConverter's merges of it."""
    return sum(tok[:k] in vocab and tok[k:] in vocab for tok in vocab for k in range(1, len(tok)))


def test_rank_splits_counts_the_rank_file(qwen_tokenizer):
    """``RANK_SPLITS``: the merges TikTokenConverter derives from qwen.tiktoken, counted from its vocabulary."""
    vocab = _qwen_json(qwen_tokenizer)["model"]["vocab"]
    assert _rank_splits(vocab) == fastokens_bpe.RANK_SPLITS["resources/qwen.tiktoken"]


@pytest.mark.slow
def test_rank_splits_counts_llama4():
    vocab = json.loads(builtin("llama4").backend_tokenizer.to_str())["model"]["vocab"]
    assert _rank_splits(vocab) == fastokens_bpe.RANK_SPLITS["llama4/tokenizer.model"]


def test_a_text_python_calls_nfc_is_one_the_hf_normalizer_leaves_as_it_is():
    """The from_tiktoken engine skips NFC for a text ``unicodedata`` calls NFC already (``fastokens_bpe._nfc``);
    the tokenizer's own NFC (HF tokenizers' tables, another Unicode version than Python's) must leave such a text
    as it is, or its ids would differ silently. Marks of every combining class, characters Python does not know
    (a newer Unicode's: they may be marks there) and composable letters, after a base, in random orders."""
    import random

    rnd = random.Random(0)
    marks = [chr(c) for c in range(0x300, 0x20000) if unicodedata.combining(chr(c))]
    unknown = [chr(c) for c in range(0x300, 0x40000, 7) if unicodedata.category(chr(c)) == "Cn"]
    pool = marks + rnd.sample(unknown, 1000) + list("ae\u00e9\u1100\u1161\u11a8\u0627\u0915")
    hf = normalizers.NFC()
    texts = [rnd.choice("aeA\u0627\u0915\uac00") + "".join(rnd.choices(pool, k=rnd.randint(1, 4)))
             for _ in range(20_000)]
    nfc = [t for t in texts if fastokens_bpe._nfc(t)]
    assert len(nfc) > 5_000 and [hf.normalize_str(t) for t in nfc] == nfc
