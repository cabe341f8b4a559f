"""The base Reader's features of clips stored with ``padded_samples`` (schema v5): each clip's row of
``WhisperFeatureExtractor`` called on its example's clips with ``padding=True, truncation=False`` (Qwen3-Omni's
processor), from real files; entries without them keep the 30-s padded features."""

from __future__ import annotations

import numpy as np
import pytest

from packer.errors import ShardError
from packer.media.audio import decode_audio
from packer.models import get_profile
from packer.models.shared.audio_features import feature_frames, whisper_log_mel
from tests.media.audio_clips import signal, write_clip

SR = 16000
TORCH_TOL = 1e-4  # tests/media/test_audio.py: whisper_log_mel (float64) against the extractor's float32 STFT
# One example's clips per group: 16,001 samples alone (100 frames) and beside a longer clip (101, its last frame
# half over zeros); a clip that is the longest; clips 100 and 1 samples short of the longest (the reflect padding
# at their end reaches back into the clip); a clip over 30 s (no truncation).
GROUPS = ((16_001,), (16_001, 24_000), (24_000, 23_900, 23_999, 3_333), (481_003, 16_001))
LONG = 3


@pytest.fixture(scope="module")
def clips(tmp_path_factory) -> list[list[tuple[str, np.ndarray]]]:
    """(path, decoded samples) of every clip, group by group: real wav files at 16 kHz."""
    root = tmp_path_factory.mktemp("padded-audio")
    out = []
    for g, group in enumerate(GROUPS):
        files = []
        for k, n in enumerate(group):
            path = write_clip(root / f"g{g}-{k}.wav", signal("speech", SR, num_samples=n, seed=10 * g + k), SR)
            y = decode_audio(str(path), target_sr=SR)
            assert y.shape == (n,)
            files.append((str(path), y))
        out.append(files)
    return out


def _entry(path: str, n: int, padded: int | None, feature_length: int) -> dict:
    return {"source": path, "data": None, "audio_start": None, "audio_end": None, "video": False,
            "sample_rate": SR, "num_samples": n, "feature_length": feature_length, "offset": 0, "num_tokens": 1,
            "padded_samples": padded}


def _check_against_the_extractor(groups: list[list[tuple[str, np.ndarray]]]) -> tuple[list[dict], np.ndarray]:
    """Each group's clips as entries padded to the group's longest, through the reader, against the extractor."""
    from transformers import WhisperFeatureExtractor

    extractor = WhisperFeatureExtractor(feature_size=128)
    reader = get_profile("qwen2.5-omni").reader()
    entries, refs = [], []
    for group in groups:
        lengths = [len(y) for _, y in group]
        frames = feature_frames(lengths, padding=True, truncation=False)
        ref = extractor([y for _, y in group], sampling_rate=SR, padding=True, truncation=False,
                        return_attention_mask=True, return_tensors="np")
        for (path, y), fl, feats, mask in zip(group, frames, ref["input_features"], ref["attention_mask"],
                                              strict=True):
            assert int(mask.sum()) == fl
            entries.append(_entry(path, len(y), max(lengths), fl))
            refs.append((feats, mask))
    got = reader.audio_inputs(entries)
    features, masks = got["input_features"].numpy(), got["feature_attention_mask"].numpy()
    width = max(e["feature_length"] for e in entries)
    assert features.shape == (len(entries), 128, width) and masks.shape == (len(entries), width)
    for i, (e, (ref, ref_mask)) in enumerate(zip(entries, refs, strict=True)):
        fl = e["feature_length"]
        assert np.array_equal(masks[i, :fl], ref_mask[:fl]) and not masks[i, fl:].any() and not ref_mask[fl:].any()
        assert np.abs(features[i, :, :fl] - ref[:, :fl]).max() <= TORCH_TOL, (i, e["num_samples"])
        assert not features[i, :, fl:].any()  # past its mask: zeros the model never reads
    return entries, features


def test_padded_clips_equal_the_extractor_on_their_example(clips):
    entries, features = _check_against_the_extractor(clips[:LONG])
    assert [e["feature_length"] for e in entries[:4]] == [100, 101, 150, 150]  # 16,001 alone, beside 24,000
    assert [e["feature_length"] for e in entries[4:6]] == [150, 150]  # 23,900 and 23,999 beside 24,000
    # the padding changes the values, not only the count: 16,001 samples beside 24,000 differ from alone
    assert np.abs(features[1, :, :100] - features[0, :, :100]).max() > 10 * TORCH_TOL


def test_a_clip_over_30_s_is_not_truncated(clips):
    entries, features = _check_against_the_extractor(clips[LONG:])
    assert features.shape[2] == 481_003 // 160 > 3000 and entries[1]["feature_length"] == 101


def test_unpadded_clips_keep_their_chunk_features(clips):
    """Entries without padded_samples (every other family) are the clip alone padded to the profile's chunk
    (Qwen2.5-Omni's released 300 s); beside a padded one the batch is as wide as its widest (30000 here)."""
    reader = get_profile("qwen2.5-omni").reader()
    (path, y), (path2, y2) = clips[1]
    alone = whisper_log_mel(y, chunk_length=300)
    plain = reader.audio_inputs([_entry(path, len(y), None, int(alone.attention_mask.sum()))])
    assert plain["input_features"].shape == (1, 128, 30000)
    assert np.array_equal(plain["input_features"][0].numpy(), alone.features)
    assert np.array_equal(plain["feature_attention_mask"][0].numpy(), alone.attention_mask)
    mixed = reader.audio_inputs([_entry(path, len(y), None, 101), _entry(path2, len(y2), len(y2), 150)])
    assert mixed["input_features"].shape == (2, 128, 30000)
    assert np.array_equal(mixed["input_features"][0].numpy(), alone.features)
    assert int(mixed["feature_attention_mask"][1].sum()) == 150


def test_padded_entries_that_disagree_are_refused(clips):
    reader = get_profile("qwen2.5-omni").reader()
    (path, y), _ = clips[1]
    with pytest.raises(ShardError, match="padded to 16000 samples, fewer than its 16001"):
        reader.audio_inputs([_entry(path, len(y), len(y) - 1, 100)])
    with pytest.raises(ShardError, match="100 feature frames, the build counted 101"):
        reader.audio_inputs([_entry(path, len(y), len(y), 101)])  # alone: 100, not 101
