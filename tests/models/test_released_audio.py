"""The audio families' counts and features at every boundary (frame edges, 30 s, 300 s) against transformers
5.23's own processors configured from the released preprocessor_config.json (tests/models/released/), not from
packer's profile: Qwen2.5-Omni pads every clip to 300 s and cuts it there (``chunk_length`` 300), Qwen2-Audio at
30 s, Qwen3-Omni pads to the call's longest clip and cuts nothing.

Real clips too: wav/flac files near each boundary at 8-44.1 kHz, counted by packer from their headers and by
the reference users run (librosa.load at 16 kHz, then the processor).
"""

from __future__ import annotations

import numpy as np
import pytest
from transformers import Qwen2_5OmniProcessor, Qwen2AudioProcessor, Qwen3OmniMoeProcessor

from packer.core.types import AudioRef
from packer.encode.tokenizers import load_tokenizer
from packer.models import get_profile
from tests.helpers import tiny_model_report, without_video_processor
from tests.models import released

OMNI = released.load("qwen_omni")["profiles"]
Q2A = released.load("qwen2_audio")["profiles"]["qwen2-audio"]

# frame edges (160 samples), 30 s (480,000) and 300 s (4,800,000), each side of them
EDGES = [161, 320, 321, 16000, 16001, 479839, 479840, 479999, 480000, 480001, 480160, 480161, 503840,
         4799840, 4799999, 4800000, 4800001, 4800160, 4800161, 5000000]


def _processor(cls, name: str, entry: dict):
    tok = load_tokenizer(get_profile(name).default_tokenizer)
    kwargs = {"video_processor": None, "image_processor": None} if cls is not Qwen2AudioProcessor else {}
    if "image_processor" in kwargs:
        kwargs["image_processor"] = released.image_processor(name)
    proc = without_video_processor(cls) if kwargs else cls
    return proc(feature_extractor=released.whisper_extractor(entry), tokenizer=tok, chat_template=tok.chat_template,
                **kwargs)


def _counts(proc, profile, n: int, rng) -> tuple[int, int, int]:
    """(packer's frames, the processor's mask sum, the processor's audio tokens) for one clip of n samples."""
    msgs = [{"role": "user", "content": [{"type": "audio", "audio": "a.wav"}, {"type": "text", "text": "hi"}]}]
    text = proc.apply_chat_template(msgs, tokenize=False, add_generation_prompt=True)
    out = proc(text=text, audio=[rng.standard_normal(n).astype(np.float32) * 0.1], return_tensors="np")
    audio_id = proc.tokenizer.convert_tokens_to_ids(profile.audio_token)
    mine = int(profile.audio.feature_lengths(np.array([n], dtype=np.int64), np.full(1, -1, dtype=np.int64))[0])
    return mine, int(out["feature_attention_mask"].sum()), int((out["input_ids"][0] == audio_id).sum())


def test_released_extractors_are_what_the_fixtures_say() -> None:
    fe = released.whisper_extractor(OMNI["qwen2.5-omni"])
    assert (fe.chunk_length, fe.n_samples, fe.nb_max_frames) == (300, 4_800_000, 30_000)
    fe = released.whisper_extractor(Q2A)
    assert (fe.chunk_length, fe.n_samples, fe.nb_max_frames) == (30, 480_000, 3_000)


@pytest.mark.parametrize("n", EDGES)
def test_qwen25_omni_counts_equal_the_released_processor(n) -> None:
    """Up to 300 s a clip counts whole (31.5 s: 787 tokens, not the 750 of a 30 s cut); past it, its first 300 s:
    7500 tokens, as the processor truncates."""
    profile = get_profile("qwen2.5-omni")
    proc = _processor(Qwen2_5OmniProcessor, "qwen2.5-omni", OMNI["qwen2.5-omni"])
    mine, frames, tokens = _counts(proc, profile, n, np.random.default_rng(n))
    assert mine == frames == min(-(-n // 160), 30000), n
    assert tokens == proc._get_num_audio_tokens(n)
    # a clip the processor gives no token is refused (-1): the model cannot place it
    assert int(profile.audio.num_tokens(np.array([mine]))[0]) == (tokens or -1), n
    if n >= 4_800_000:
        assert tokens == 7500
    if n == 503840:  # 31.49 s
        assert tokens == 787


@pytest.mark.parametrize("n", [961, 16001, 479999, 480000, 480001, 503840, 4800001])
def test_qwen2_audio_counts_equal_the_released_processor(n) -> None:
    profile = get_profile("qwen2-audio")
    proc = _processor(Qwen2AudioProcessor, "qwen2-audio", Q2A)
    mine, frames, tokens = _counts(proc, profile, n, np.random.default_rng(n))
    assert mine == frames == min(-(-n // 160), 3000), n
    assert int(profile.audio.num_tokens(np.array([mine]))[0]) == (tokens if tokens >= 2 else -1), n


@pytest.mark.parametrize("n", [16001, 480001, 4800001])
def test_qwen3_omni_cuts_no_clip(n) -> None:
    """Qwen3-Omni's processor (padding=True, truncation=False) keeps a clip past 30 s and past 300 s whole."""
    from packer.models.qwen_omni.rope3 import audio_tokens, mel_frames

    proc = _processor(Qwen3OmniMoeProcessor, "qwen3-omni", OMNI["qwen3-omni"])
    msgs = [{"role": "user", "content": [{"type": "audio", "audio": "a.wav"}, {"type": "text", "text": "hi"}]}]
    text = proc.apply_chat_template(msgs, tokenize=False, add_generation_prompt=True)
    out = proc(text=text, audio=[np.random.default_rng(n).standard_normal(n).astype(np.float32)], return_tensors="np")
    frames = int(out["feature_attention_mask"].sum())
    assert int(mel_frames(n, n)) == frames == n // 160
    assert int(audio_tokens(frames)) == int((out["input_ids"][0] == proc.audio_token_id).sum())


CLIPS = [(31.5, 44100, "wav"), (30.0, 22050, "flac"), (299.99, 8000, "flac"), (300.0, 16000, "wav"),
         (300.5, 16000, "flac"), (312.25, 11025, "wav")]


@pytest.mark.slow
@pytest.mark.parametrize(("seconds", "sr", "ext"), CLIPS)
def test_real_clips_count_and_featurize_as_the_released_processor(tmp_path, seconds, sr, ext) -> None:
    """A file near 30 s or 300 s: packer's count from its header == librosa.load(sr=16000) + the released
    processor's; the reader's features == the processor's (float32 STFT rounding) over all 30000 frames."""
    import librosa
    import soundfile as sf

    profile = get_profile("qwen2.5-omni")
    proc = _processor(Qwen2_5OmniProcessor, "qwen2.5-omni", OMNI["qwen2.5-omni"])
    rng = np.random.default_rng(int(seconds * 100))
    path = tmp_path / f"clip.{ext}"
    t = np.arange(int(round(seconds * sr))) / sr
    sf.write(path, (0.3 * np.sin(2 * np.pi * 440 * t) + 0.05 * rng.standard_normal(t.size)).astype(np.float32), sr)
    ref = AudioRef(path=str(path))
    plan = profile.audio.plan(ref)
    y, _ = librosa.load(str(path), sr=16000)
    assert plan.num_samples == len(y)
    want = proc.feature_extractor([y], sampling_rate=16000, padding="max_length", return_attention_mask=True,
                                  return_tensors="np")
    assert plan.feature_length == int(want["attention_mask"].sum())
    assert profile.audio.num_tokens(np.array([plan.feature_length]))[0] == proc._get_num_audio_tokens(len(y))
    got = profile.reader().audio_inputs([{"source": str(path), "data": None, "sample_rate": 16000,
                                          "audio_start": None, "audio_end": None, "video": False,
                                          "num_samples": plan.num_samples, "feature_length": plan.feature_length}])
    assert tuple(got["input_features"].shape) == (1, 128, 30000)
    np.testing.assert_array_equal(got["feature_attention_mask"][0].numpy(), want["attention_mask"][0])
    np.testing.assert_allclose(got["input_features"][0].numpy(), want["input_features"][0], rtol=0, atol=1e-4)


@pytest.mark.slow
def test_packed_equals_unpacked_past_30_s(tmp_path) -> None:
    """Qwen2.5-Omni's proof with clips past 30 s (31.5 s: 787 tokens) and past 300 s (cut: 7500 tokens), two
    examples packed in one row: per-token losses and every gradient of a tiny thinker equal each example run alone,
    its features the released extractor's own (``released.released_reader``; the reader's are within float32 STFT
    rounding of them: test_real_clips_count_and_featurize_as_the_released_processor)."""

    import soundfile as sf

    from packer.train.collate import collate
    from packer.train.dataset import PackedDataset
    from tests.helpers import encode_records, write_shardset

    profile = get_profile("qwen2.5-omni")
    tok = load_tokenizer("qwen2.5-omni")
    rng = np.random.default_rng(7)
    for name, seconds, sr in (("long.flac", 31.5, 16000), ("longer.flac", 300.5, 16000)):
        sf.write(tmp_path / name, (0.1 * rng.standard_normal(int(seconds * sr))).astype(np.float32), sr)
    records = [{"messages": [{"role": "user", "content": [{"type": "audio", "audio": name},
                                                          {"type": "text", "text": "What is it?"}]},
                             {"role": "assistant", "content": "Noise."}]} for name in ("long.flac", "longer.flac")]
    encoded = encode_records(tok, profile, records, tmp_path, path="long.jsonl")
    assert [a.num_tokens for e in encoded for a in e.audios] == [787, 7500]
    rows = list(PackedDataset(write_shardset(tmp_path / "shards", encoded, [2], profile="qwen2.5-omni"),
                              shuffle=False))
    with released.released_reader(profile):  # the features the released extractor makes, not the reader's
        batch = collate(rows)
    assert tuple(batch["input_features"].shape) == (2, 128, 30000)
    assert batch["feature_attention_mask"].sum(1).tolist() == [3150, 30000]
    tiny_model_report(profile, tok, batch, paths=2)
