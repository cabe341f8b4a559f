"""Qwen2-Audio against transformers 5.23.0's own code: the builtin tokenizer against ``Qwen2AudioConfig``'s id and
``Qwen2AudioProcessor``'s template; audio token counts against the processor on clips of every length (below the
refusal, odd lengths, 30 s and past it); every root-to-leaf path of records over real clips (wav, mp3, flac, m4a,
ogg, opus; stereo, odd rates, windows, a clip past 30 s, ShareGPT ``<audio>``) against the processor's
``input_ids``; the reader's features against the processor's; packed == unpacked on a tiny
``Qwen2AudioForConditionalGeneration``.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from transformers import Qwen2AudioConfig, Qwen2AudioProcessor, WhisperFeatureExtractor

from packer.encode.tokenizers import load_tokenizer
from packer.models import get_profile
from packer.models.qwen2_audio.profile import feature_lengths, tokens_from_frames
from tests.helpers import tiny_model_report, token_paths
from tests.models import released

AUD, BOS, EOS = 151646, 151647, 151648


@pytest.fixture(scope="module")
def tok():
    return load_tokenizer("qwen2-audio")


@pytest.fixture(scope="module")
def processor(tok):
    # Qwen/Qwen2-Audio-7B-Instruct's preprocessor_config.json (tests/models/released/qwen2_audio.json): 128 mel
    # bins, chunk_length 30
    entry = released.load("qwen2_audio")["profiles"]["qwen2-audio"]
    return Qwen2AudioProcessor(feature_extractor=released.whisper_extractor(entry), tokenizer=tok)


# ------------------------------------------------------------------ the tokenizer


def test_tokenizer_ids_and_template(tok, processor) -> None:
    assert tok("Hello world!").input_ids == [9707, 1879, 0]  # Qwen2's BPE
    assert tok.convert_tokens_to_ids(["<|AUDIO|>", "<|audio_bos|>", "<|audio_eos|>"]) == [AUD, BOS, EOS]
    assert Qwen2AudioConfig().audio_token_index == AUD
    assert tok.convert_tokens_to_ids(["<|endoftext|>", "<|im_start|>", "<|im_end|>"]) == [151643, 151644, 151645]
    assert len(tok) == 151649
    assert processor.audio_token_id == AUD
    assert Qwen2AudioProcessor(feature_extractor=WhisperFeatureExtractor(), tokenizer=tok,
                               chat_template=None).chat_template == tok.chat_template  # the processor's own default
    msgs = [{"role": "user", "content": [{"type": "audio", "audio": "a.wav"}, {"type": "text", "text": "what?"}]},
            {"role": "assistant", "content": [{"type": "text", "text": "a dog"}]}]
    assert processor.apply_chat_template(msgs, tokenize=False) == (
        "<|im_start|>system\nYou are a helpful assistant.<|im_end|>\n<|im_start|>user\n"
        "Audio 1: <|audio_bos|><|AUDIO|><|audio_eos|>\nwhat?<|im_end|>\n<|im_start|>assistant\na dog<|im_end|>\n")


# ------------------------------------------------------------------ counts


SAMPLE_COUNTS = [961, 1120, 1121, 1600, 15999, 16000, 16001, 16161, 40000, 123457, 479840, 479999, 480000, 480001,
                 560000]


@pytest.mark.slow
def test_audio_tokens_equal_the_processor(processor) -> None:
    """The processor's ``<|AUDIO|>`` count and mask frames for one clip of n samples, against the profile's rule."""
    profile = get_profile("qwen2-audio")
    text = "<|audio_bos|><|AUDIO|><|audio_eos|>hi"
    rng = np.random.default_rng(0)
    for n in SAMPLE_COUNTS:
        out = processor(text=text, audio=[rng.standard_normal(n).astype(np.float32)], return_tensors="np")
        frames = int(out["feature_attention_mask"].sum())
        assert feature_lengths(np.array([n]))[0] == frames, n
        want = int((out["input_ids"][0] == AUD).sum())
        assert profile.audio.num_tokens(np.array([frames]))[0] == want, n
        assert out["input_ids"][0][0] == BOS and out["input_ids"][0][want + 1] == EOS
    assert profile.audio.num_tokens(feature_lengths(np.array([10**7])))[0] == 750  # cut at 30 s


@settings(max_examples=200, deadline=None)
@given(st.integers(min_value=1, max_value=2_000_000))
def test_count_rule(n: int) -> None:
    """Frames are ceil(n / 160) up to 3000; a clip makes two tokens or more exactly from 961 samples on, else -1."""
    profile = get_profile("qwen2-audio")
    frames = int(feature_lengths(np.array([n]))[0])
    assert frames == min(-(-n // 160), 3000)
    tokens = int(profile.audio.num_tokens(np.array([frames]))[0])
    assert tokens == (int(tokens_from_frames(np.array([frames]))[0]) if n >= 961 else -1)
    assert tokens == -1 or 2 <= tokens <= 750


# ------------------------------------------------------------------ real clips, every path


@pytest.fixture(scope="module")
def media(tmp_path_factory) -> Path:
    from tests.media.audio_clips import signal, write_clip, write_four_clips

    root = tmp_path_factory.mktemp("qwen2audio")
    write_four_clips(root)
    write_clip(root / "odd.ogg", signal("speech", 11025, 1.77), 11025)
    write_clip(root / "voice.opus", signal("speech", 48000, 0.93), 48000)
    write_clip(root / "long.wav", signal("speech", 8000, 31.3), 8000)
    return root


def _records() -> list[dict]:
    audio = lambda name, **w: {"type": "audio", "audio": name, **w}  # noqa: E731
    text = lambda t: {"type": "text", "text": t}  # noqa: E731
    return [
        {"messages": [{"role": "user", "content": [audio("speech.wav"), text("What is said?")]},
                      {"role": "assistant", "content": "Hello."}]},
        {"messages": [{"role": "user", "content": [audio("tone.mp3"), audio("short.m4a"), text("Same?")]},
                      {"role": "assistant", "content": "No."}]},
        {"messages": [{"role": "user", "content": "Just text."}, {"role": "assistant", "content": "Yes, text."}]},
        {"messages": [{"role": "user", "content": [audio("noise.flac", audio_start=0.3, audio_end=1.7),
                                                   text("Describe.")]}],
         "branches": [[{"role": "assistant", "content": "A hiss."}],
                      [{"role": "assistant", "content": "Listen:"},
                       {"role": "user", "content": [audio("odd.ogg"), text("And this?")]},
                       {"role": "assistant", "content": "Speech."}]]},
        {"messages": [{"role": "user", "content": [audio("voice.opus"), text("Who?")]},
                      {"role": "assistant", "content": "Someone."}]},
        {"messages": [{"role": "user", "content": "<audio>\nSummarise."}, {"role": "assistant", "content": "A talk."}],
         "audios": ["long.wav"]},
    ]


def _record_paths(record: dict) -> list[list[dict]]:
    """Each root-to-leaf path's messages, a ShareGPT ``<audio>`` made the audio part it stands for."""
    def part(m):
        if isinstance(m["content"], str) and m["content"].startswith("<audio>"):
            return {**m, "content": [{"type": "audio", "audio": record["audios"][0]},
                                     {"type": "text", "text": m["content"][len("<audio>"):]}]}
        return m

    def walk(prefix, node):
        msgs = prefix + [part(m) for m in (node if isinstance(node, list) else node["messages"])]
        branches = [] if isinstance(node, list) else node.get("branches", [])
        return [p for b in branches for p in walk(msgs, b)] or [msgs]

    return walk([], record)


@pytest.mark.slow
def test_every_path_equals_the_processor(tok, processor, media) -> None:
    """Each record's every path: the encoder's ids equal ``Qwen2AudioProcessor(text=apply_chat_template(path),
    audio=the clips as librosa.load(sr=16000) gives them)["input_ids"]``, and its clips' frames the processor's."""
    from packer.encode.encoder import Encoder
    from packer.formats import parse_record
    from packer.media.audio import decode_audio

    encoder = Encoder(tok, get_profile("qwen2-audio"))
    checked = 0
    for i, record in enumerate(_records()):
        enc = encoder.encode(parse_record(record, path="q2a.jsonl", line=i + 1, base_dir=str(media)))
        for msgs, cols in zip(_record_paths(record), token_paths(enc), strict=True):
            clips = [decode_audio(str(media / p["audio"]), target_sr=16000, start=p.get("audio_start"),
                                  end=p.get("audio_end"))
                     for m in msgs if isinstance(m["content"], list) for p in m["content"] if p["type"] == "audio"]
            text = processor.apply_chat_template(msgs, tokenize=False)
            out = processor(text=[text], audio=clips or None, return_tensors="np")
            np.testing.assert_array_equal(enc.input_ids[cols], out["input_ids"][0])
            mine = [a for a in enc.audios if a.offset in set(cols.tolist())]
            assert [a.feature_length for a in mine] == (out["feature_attention_mask"].sum(-1).tolist() if clips else [])
            assert [a.num_samples for a in mine] == [len(c) for c in clips]
            checked += 1
    assert checked == 7
    long = enc.audios[0]
    assert long.num_tokens == 750 and long.feature_length == 3000  # 31.3 s: cut at 30 s as the processor does


def test_a_clip_under_60_ms_is_refused(tok, tmp_path) -> None:
    """961 samples at 16 kHz make two tokens; 40 ms makes one, which the model would take for unexpanded input."""
    from packer.encode.encoder import Encoder
    from packer.errors import RecordError
    from packer.formats import parse_record
    from tests.media.audio_clips import signal, write_clip

    write_clip(tmp_path / "blip.wav", signal("tone", 16000, num_samples=640), 16000)
    record = {"messages": [{"role": "user", "content": [{"type": "audio", "audio": "blip.wav"}]},
                           {"role": "assistant", "content": "A blip."}]}
    with pytest.raises(RecordError, match="at least 961 samples") as e:
        Encoder(tok, get_profile("qwen2-audio")).encode(parse_record(record, path="x.jsonl", line=3,
                                                                     base_dir=str(tmp_path)))
    assert e.value.reason == "bad_audio"


# ------------------------------------------------------------------ built shards: the reader and packed == unpacked


@pytest.fixture(scope="module")
def built(media, tmp_path_factory) -> Path:
    import pyarrow as pa
    import pyarrow.parquet as pq

    from packer.config import BuildConfig
    from packer.pipeline.build import build

    data = media / "data.jsonl"
    data.write_text("".join(json.dumps(r) + "\n" for r in _records()))
    # a datasets.Audio column's storage ({bytes, path}): the clip travels inline in the shards
    clip = {"bytes": (media / "tone.mp3").read_bytes(), "path": "tone.mp3"}
    pq.write_table(pa.table({"messages": [[{"role": "user", "content": "<audio>Say?"},
                                           {"role": "assistant", "content": "A tone."}]],
                             "audios": [[clip]]}), media / "bytes.parquet")
    out = tmp_path_factory.mktemp("q2a-shards") / "out"
    build(BuildConfig.from_inputs([str(data), str(media / "bytes.parquet")], str(out), profile="qwen2-audio",
                                  max_length=1024), progress=False)
    return out


def _rows(out: Path) -> list[dict]:
    from packer.train.dataset import PackedDataset

    return list(PackedDataset(out, shuffle=False))


@pytest.mark.slow
def test_build_stores_every_clip_and_verifies(built, media) -> None:
    """Every record packed (none rejected), and ``packer verify`` (the input accounted for, each clip's span,
    feature length and token count by the family's rule) passes."""
    from packer.report.verify import verify_build

    stats = json.loads((built / "stats.json").read_text())
    assert stats["examples"] == 7 and stats["rejected"] == 0 and stats["audio_clips"] == 8, stats
    report = verify_build(built, inputs=[str(media / "data.jsonl"), str(media / "bytes.parquet")])
    assert report.ok, report.violations[:3]


@pytest.mark.slow
def test_reader_equals_the_processor(built, processor) -> None:
    """``input_features`` / ``feature_attention_mask`` of every clip of the built rows against the processor's
    extractor on the loader's samples: masks equal, features within its float32 STFT's rounding."""
    from packer.errors import ShardError
    from packer.media.audio import decode_audio
    from packer.train.collate import collate

    rows = [r for r in _rows(built) if r.get("audios")]
    batch = collate(rows)
    clips = [a for r in rows for a in r["audios"]]
    assert len(clips) == 8 and batch["input_features"].shape == (8, 128, 3000)  # every clip: none rejected
    assert sum(a["data"] is not None for a in clips) == 1  # the Parquet one, inline
    samples = [decode_audio(a["data"] if a["data"] is not None else a["source"], target_sr=16000,
                            start=a["audio_start"], end=a["audio_end"]) for a in clips]
    want = processor.feature_extractor(samples, sampling_rate=16000, padding="max_length", return_attention_mask=True,
                                       return_tensors="pt")
    assert torch.equal(batch["feature_attention_mask"], want["attention_mask"].to(torch.int32))
    # whisper_log_mel computes in float64, the extractor's torch STFT in float32 (tests/media/test_audio.py: 1e-4)
    torch.testing.assert_close(batch["input_features"], want["input_features"], rtol=0, atol=1e-4)
    ids = batch["input_ids"][0]
    for off, a in zip(batch["audio_offsets"].tolist(), clips, strict=True):
        assert int(ids[off - 1]) == BOS and (ids[off:off + a["num_tokens"]] == AUD).all()
        assert int(ids[off + a["num_tokens"]]) == EOS
    reader = get_profile("qwen2-audio").reader()
    i = next(k for k, a in enumerate(clips) if a["data"] is None)
    inline = {**clips[i], "source": "", "data": Path(clips[i]["source"]).read_bytes()}  # as a datasets.Audio cell
    assert torch.equal(reader.audio_inputs([inline])["input_features"][0], batch["input_features"][i])
    with pytest.raises(ShardError, match="the build counted"):
        reader.audio_inputs([{**clips[i], "num_samples": clips[i]["num_samples"] + 1}])


@pytest.mark.slow
def test_packed_equals_unpacked(built, tok) -> None:
    """The built rows (audio clips of every codec, two clips in one turn, text, a tree with a clip on each level,
    a 30 s clip, a clip inline from Parquet) collated into one batch: per-token losses, the total and every gradient of a tiny
    Qwen2AudioForConditionalGeneration equal each root-to-leaf path run alone with its own clips."""
    from packer.train.collate import collate

    profile = get_profile("qwen2-audio")
    rows = _rows(built)
    assert len(rows) == 2 and sum(len(r["example_ids"]) for r in rows) == 7  # several examples a row
    assert any(len(r["audios"]) >= 3 for r in rows)
    with released.released_reader(profile):  # the released extractor's features, not the reader's
        batch = collate(rows)
    _, model = tiny_model_report(profile, tok, batch, paths=8)
    assert any("audio_tower" in n and p.grad is not None and p.grad.abs().sum() > 0
               for n, p in model.named_parameters()), "the audio tower took part"


@pytest.mark.slow
def test_check_equivalence_script_runs_audio(built, media, capsys) -> None:
    """``scripts/check_equivalence.py --model qwen2-audio`` on the records' JSONL: it builds, reads the clips'
    features and passes (exit 0) with the audio tower in the model."""
    from scripts import check_equivalence as ce

    assert ce.main(["--data", str(media / "data.jsonl"), "--model", "qwen2-audio", "--max-length", "1024",
                    "--backend", "sdpa_varlen"]) == 0
    report = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert report["model_class"] == "Qwen2AudioForConditionalGeneration" and report["rows"] == 2
    assert report["sdpa_varlen"]["ok"]
