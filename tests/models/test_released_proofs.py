"""The proofs read their batches through the released processors (``released.released_reader``): the image processor
and the audio extractor the released files configure (tests/models/released/), not ones made from packer's profile.
Here: every family's reader gives what its released processor gives on adversarial sizes, and a profile default
that drifts from the released file fails the proof (a pixel bound, the issue's 30 s audio chunk)."""

from __future__ import annotations

import io
from fractions import Fraction

import numpy as np
import pytest
import torch
from PIL import Image

from packer.core.types import ImageRef
from packer.encode.tokenizers import load_tokenizer
from packer.models import get_profile, profile_names
from tests.helpers import encode_records, tiny_model_report, write_shardset
from tests.models import released

IMAGE_PROFILES = [n for n in profile_names() if get_profile(n).image is not None]
# odd sizes: prime sides, extreme aspect ratios, one pixel off a 28 / 32 px patch multiple, a tile and a half
SIZES = [(97, 61), (61, 97), (449, 448), (29, 28), (1000, 251)]


def _png(width: int, height: int, seed: int) -> bytes:
    rng = np.random.default_rng(seed)
    buf = io.BytesIO()
    Image.fromarray(rng.integers(0, 256, (height, width, 3), dtype=np.uint8)).save(buf, format="PNG")
    return buf.getvalue()


@pytest.mark.parametrize("name", IMAGE_PROFILES)
def test_reader_pixels_are_the_released_processors(name) -> None:
    """The reader's batch of odd-sized images (its own processor, made from the profile) equals the released image
    processor's, every tensor bit for bit: same counts, same pixels."""
    profile = get_profile(name)
    refs = [ImageRef(data=_png(w, h, seed=i)) for i, (w, h) in enumerate(SIZES)]
    ours = profile.reader().pixel_values(refs)
    with released.released_reader(profile):
        theirs = profile.reader().pixel_values(refs)
    assert set(ours) == set(theirs) and ours
    for key, value in ours.items():
        if torch.is_tensor(value):
            assert value.shape == theirs[key].shape and torch.equal(value, theirs[key]), (name, key)


def _rows(tmp_path, profile, tok, records, *, pack: list[int]):
    """Rows of a shard set of ``records`` (media under ``tmp_path``) encoded with ``profile``."""
    from packer.train.dataset import PackedDataset

    encoded = encode_records(tok, profile, records, tmp_path, path="x.jsonl")
    out = tmp_path / f"shards-{profile.name}-{id(profile)}"
    return list(PackedDataset(write_shardset(out, encoded, pack, profile=profile.name), shuffle=False))


@pytest.mark.slow
def test_a_drifted_pixel_bound_fails_the_proof(tmp_path) -> None:
    """A Qwen2-VL profile whose max_pixels is not the released one counts a 300 x 200 image as 54 tokens; the released
    processor gives it 77, and the model refuses the packed batch. Given the same bound (a build's explicit
    ``--max-pixels``, passed to the processor as users do), the proof holds."""
    from packer.train.collate import collate

    drifted = get_profile("qwen2-vl", max_pixels=64 * 28 * 28)
    tok = load_tokenizer("qwen2-vl")
    (tmp_path / "a.png").write_bytes(_png(300, 200, seed=0))
    record = {"messages": [{"role": "user", "content": [{"type": "image", "image": "a.png"},
                                                        {"type": "text", "text": "What is it?"}]},
                           {"role": "assistant", "content": "Noise."}]}
    rows = _rows(tmp_path, drifted, tok, [record], pack=[1])
    assert drifted.image.num_tokens(300, 200) == 54 != get_profile("qwen2-vl").image.num_tokens(300, 200) == 77
    with released.released_reader(drifted):
        batch = collate(rows)
    assert batch["image_grid_thw"].tolist() == [[1, 14, 22]]  # the released processor's 77 tokens
    with pytest.raises(ValueError, match="do not match"):
        tiny_model_report(drifted, tok, batch, paths=1)
    with released.released_reader(drifted, max_pixels=64 * 28 * 28, min_pixels=drifted.min_pixels):
        batch = collate(rows)
    tiny_model_report(drifted, tok, batch, paths=1)


def test_a_drifted_audio_chunk_fails_the_proof(tmp_path) -> None:
    """The issue's bug, through the proof's reader: a Qwen2.5-Omni profile with Whisper's 30 s chunk counts a 31.5 s
    clip as 3000 frames; the released extractor (300 s) gives 3150, and the batch is refused. The released
    profile's count is the extractor's."""
    import soundfile as sf

    from packer.train.collate import collate

    sf.write(tmp_path / "long.flac", (0.1 * np.random.default_rng(0).standard_normal(504_000)).astype(np.float32),
             16000)
    record = {"messages": [{"role": "user", "content": [{"type": "audio", "audio": "long.flac"},
                                                        {"type": "text", "text": "What is it?"}]},
                           {"role": "assistant", "content": "Noise."}]}
    tok = load_tokenizer("qwen2.5-omni")
    drifted = get_profile("qwen2.5-omni", audio_chunk_length=30)
    rows = _rows(tmp_path, drifted, tok, [record], pack=[1])
    with released.released_reader(drifted), pytest.raises(AssertionError, match="gives 3150 feature frames, the "
                                                                                 "build counted 3000"):
        collate(rows)
    profile = get_profile("qwen2.5-omni")
    rows = _rows(tmp_path, profile, tok, [record], pack=[1])
    with released.released_reader(profile):
        assert collate(rows)["feature_attention_mask"].sum().item() == 3150


# the families whose image count is the processor's grid under pixel bounds: tokens = patches / merge_size ** 2
BOUNDED = [n for n in IMAGE_PROFILES if hasattr(get_profile(n), "min_pixels")]


def _bound_sizes(processor) -> list[tuple[int, int]]:
    """(width, height) next to the released processor's bounds: a square at min_pixels and max_pixels and one
    pixel either side, one patch (times merge) and one pixel either side, a side of 1, aspect ratios 199:1."""
    import math

    f = processor.patch_size * processor.merge_size
    lo, hi = math.isqrt(processor.size["shortest_edge"]), math.isqrt(processor.size["longest_edge"])
    return [(lo, lo), (lo - 1, lo), (lo, lo + 1), (hi, hi), (hi + 1, hi), (hi, hi - 1), (hi + 1, hi + 1),
            (f, f), (f - 1, f + 1), (f + 1, f - 1), (1, 1), (1, 7), (199 * f, f), (f, 199 * f), (7 * f + 1, 3 * f - 1)]


@pytest.mark.parametrize("name", BOUNDED)
def test_counts_at_the_released_pixel_bounds_equal_the_processors(name) -> None:
    """Every size near the released min/max pixels and the patch edges: the profile's token count equals the
    released image processor's grid (``get_number_of_image_patches``, its own smart_resize) / merge_size ** 2;
    an aspect ratio past 200 is refused by both."""
    from packer.errors import RecordError

    profile, processor = get_profile(name), released.image_processor(name)
    merge = processor.merge_size ** 2
    for w, h in _bound_sizes(processor):
        assert profile.image.num_tokens(w, h) == processor.get_number_of_image_patches(h, w, {}) // merge, (w, h)
    f = processor.patch_size * processor.merge_size
    with pytest.raises(ValueError):
        processor.get_number_of_image_patches(f, 201 * f, {})
    with pytest.raises(RecordError):
        profile.image.num_tokens(201 * f, f)


# (fps, frames) of clips at the sampling edges: fewer frames than qwen-vl-utils' 4-frame floor, an odd count, one
# past a temporal patch, 2 fps exactly (the sampling rate), a 29.97 fps clip whose sampled count rounds.
CLIPS = [(25, 3), (25, 5), (2, 9), (4, 8), (Fraction(30000, 1001), 61)]


@pytest.mark.slow
@pytest.mark.parametrize("name", sorted(released.QWEN_VIDEO))
def test_video_counts_at_the_sampling_edges_equal_the_released_processor(tmp_path, name) -> None:
    """Clips at the frame-sampling edges, planned by the profile (qwen-vl-utils' sampling and size), their frames
    through the released video processor with what the family's processor passes it (``do_sample_frames=False``,
    as the model card runs it after qwen-vl-utils): its grid is the plan's and its pixels the reader's."""
    from packer.core.types import VideoRef
    from packer.media.video import decode_frames
    from tests.media.make_videos import write_clip
    from tests.models.test_qwen_video import qwen_vl_utils_resize

    profile = get_profile(name)
    processor, call, mp = released.qwen_video_processor(name)
    try:
        for i, (fps, frames) in enumerate(CLIPS):
            path = write_clip(tmp_path / f"c{i}.mp4", fps=fps, frames=frames, width=94, height=62)
            plan = profile.video.plan(VideoRef(path=str(path)))
            decoded = decode_frames(str(path), plan.frame_indices)
            out = processor(videos=[qwen_vl_utils_resize(decoded, plan.utils_size)], do_sample_frames=False,
                            do_resize=profile.video.family().processor_resize, return_tensors="pt", **call)
            assert out["video_grid_thw"][0].tolist() == list(plan.grid_thw), (fps, frames)
            assert int(out["video_grid_thw"][0].prod()) // processor.merge_size ** 2 == plan.num_tokens
            stored = {"source": str(path), "frames": None, "frame_indices": list(plan.frame_indices),
                      "height": plan.size[0], "width": plan.size[1], "utils_height": plan.utils_size[0],
                      "utils_width": plan.utils_size[1], "second_per_grid_t": plan.second_per_grid_t,
                      "video_start": None, "video_end": None}
            got = profile.reader().video_pixel_values([stored])
            assert torch.equal(got["pixel_values_videos"], out["pixel_values_videos"]), (fps, frames)
    finally:
        mp.undo()
