"""packer.media.video (probe, decode) and packer.models.shared.qwen_video_plan (the Qwen rules): header-only video
plans equal what Qwen's own pipeline gives after decoding the clip.

The reference (tests/media/qwen_reference.py) transcribes qwen-vl-utils 0.0.14's decoding path, decodes every
frame of each clip with PyAV to count them, and uses transformers 5.23.0's own resize code; packer's plan comes
from the container headers alone. Every test video is generated here with PyAV (make_videos.py).
"""

from __future__ import annotations

import pickle
import random

import av
import numpy as np
import pytest
import torch
from PIL import Image

from packer.errors import RecordError
from packer.media.video import decode_frame_list, decode_frames, probe, probe_frame_list
from packer.models.shared.qwen_video_plan import (
    END_SLACK_S,
    VideoRequest,
    get_video_family,
    linspace_indices,
    plan_frame_list,
    plan_video,
    qwen3_video_text,
    qwen25_temporal_positions,
)
from tests.media import qwen_reference as ref
from tests.media.make_videos import GOOD, level, make_test_videos

FAMILIES = {
    "qwen2-vl": get_video_family("qwen2-vl"),
    "qwen2.5-vl": get_video_family("qwen2.5-vl"),
    # Qwen2.5-VL-7B-Instruct's preprocessor_config.json bounds, which transformers 5 loads for video too
    "qwen2-vl-checkpoint": get_video_family("qwen2-vl", min_pixels=3136, max_pixels=12845056),
    "qwen2-vl-capped": get_video_family("qwen2-vl", cap_pixels_per_frame=True),
    "qwen3-vl": get_video_family("qwen3-vl"),
    "qwen3-vl-resize": get_video_family("qwen3-vl", processor_resize=True),
    "qwen3-vl-resize-capped": get_video_family("qwen3-vl", processor_resize=True, cap_pixels_per_frame=True),
}

# Record options of a video part, as a dataset writes them; several fail on some clips, in both pipelines.
REQUESTS = [
    {},
    {"fps": 1.0},
    {"fps": 30.0},
    {"fps": 0.25},
    {"nframes": 8},
    {"nframes": 5},  # round(2.5) = 2 -> 4 frames
    {"nframes": 7},  # round(3.5) = 4 -> 8 frames
    {"fps": 2, "min_frames": 6, "max_frames": 10},
    {"fps": 10, "max_frames": 16},
    {"fps": 0},  # qwen-vl-utils samples min_frames
    {"fps": 0.1, "min_frames": 0},
    {"resized_height": 100},  # alone: ignored, as qwen-vl-utils ignores it
    {"video_start": 0.3, "video_end": 0.9},
    {"video_start": 0.25},
    {"video_end": 1.4},
    {"video_start": 1.0, "video_end": 2.5, "fps": 4},
    {"min_pixels": 3136, "max_pixels": 50176},
    {"max_pixels": 50176},  # below the default min_pixels: qwen-vl-utils asserts
    {"max_pixels": 200000},
    {"total_pixels": 2_000_000},
    {"resized_height": 100, "resized_width": 150},
    {"min_pixels": 200704, "max_pixels": 602112},
]


@pytest.fixture(scope="session")
def videos(tmp_path_factory, coco_images):
    return make_test_videos(tmp_path_factory.mktemp("videos"), coco_images)


@pytest.fixture(scope="session")
def decoded(videos):
    """Every good clip decoded frame by frame (the reference's stand-in for decord)."""
    return {name: ref.AllFrames(str(videos[name])) for name in GOOD}


@pytest.fixture(scope="session")
def same_size_photos(coco_images):
    """Five COCO photos of 640x480 (an odd count: the list is padded) and one of another size."""
    sizes = {p: Image.open(p).size for p in coco_images}
    same = [str(p) for p in coco_images if sizes[p] == (640, 480)][:5]
    other = next(str(p) for p in coco_images if sizes[p][0] / sizes[p][1] < 1)  # a portrait photo
    assert len(same) == 5
    return same, other


def _compare(plan, want: ref.Reference, *, list_length: int | None = None) -> list[str]:
    """Differences between a plan and the reference; a frame list's plan indexes the list (padded with its
    last frame), the reference's metadata the padded clip."""
    if list_length is not None:
        want.indices = [min(i, list_length - 1) for i in want.indices]
    got = {
        "indices": list(plan.frame_indices), "total_frames": plan.total_frames, "video_fps": plan.video_fps,
        "sample_fps": plan.sample_fps, "utils_size": plan.utils_size, "size": plan.size, "grid": plan.grid_thw,
        "tokens": plan.num_tokens, "second_per_grid_t": plan.second_per_grid_t,
        "timestamps": None if plan.timestamps is None else list(plan.timestamps),
    }
    return [f"{k}: packer {v!r} != reference {getattr(want, k)!r}" for k, v in got.items() if v != getattr(want, k)]


@pytest.mark.slow
@pytest.mark.parametrize("family", sorted(FAMILIES))
@pytest.mark.parametrize("name", GOOD)
def test_header_plan_equals_decoded_reference(videos, decoded, name, family):
    """Every request on every clip: packer's frames, sizes, grid, tokens and times equal the reference's
    exactly (float fields bit for bit), and where qwen-vl-utils raises packer rejects with bad_video."""
    fam = FAMILIES[family]
    info = probe(str(videos[name]))
    assert info.num_frames == len(decoded[name])  # the header's count is the decoded count
    failures, planned = [], 0
    for options in REQUESTS:
        ele = {"type": "video", "video": str(videos[name]), **options}
        try:
            want = ref.reference(ele, fam, decoded[name])
        except (ValueError, AssertionError) as e:
            want = e
        try:
            plan = plan_video(info, VideoRequest.from_part(ele), fam)
        except RecordError as e:
            if e.reason != "bad_video":
                failures.append(f"{options}: {e}")
            elif not isinstance(want, Exception):
                # packer is stricter in one documented place only: an end far past the clip
                end = options.get("video_end")
                if end is None or end <= info.num_frames / info.fps + END_SLACK_S:
                    failures.append(f"{options}: packer rejects ({e}), the reference plans {want.grid}")
            continue
        if isinstance(want, Exception):
            failures.append(f"{options}: the reference raises {want!r}, packer plans {plan.grid_thw}")
            continue
        planned += 1
        failures += [f"{options}: {m}" for m in _compare(plan, want)]
    assert not failures, "\n".join(failures)
    assert planned >= 8


@pytest.mark.slow
def test_header_count_equals_decoded_count(videos, decoded):
    """The count packer reads (mp4 header, or Matroska/WebM packets, no decoding) is the count that decodes;
    where a header lies - an mp4 cut short after its index, listing frames that are gone - probe rejects."""
    for name in GOOD:
        info = probe(str(videos[name]))
        assert info.num_frames == len(decoded[name]), name
        assert info.frames_from == ("packets" if name.endswith((".mkv", ".webm")) else "header"), name
        with av.open(str(videos[name])) as container:  # a plain open (its stream probe decodes) agrees
            stream = container.streams.best("video")
            assert float(stream.average_rate) == info.fps and stream.codec_context.width == info.width, name
        assert (info.width, info.height) == decoded[name].frames[0].shape[1::-1], name
    path = str(videos["truncated_faststart.mp4"])
    with av.open(path) as container:  # the header still lists all 60 frames
        header = container.streams.video[0].frames
        frames = 0
        with pytest.raises(av.error.InvalidDataError):
            for _ in container.decode(video=0):
                frames += 1
    assert header == 60 and frames < 60
    with pytest.raises(RecordError, match=r"bad_video: .*truncated: box 'mdat' at byte \d+ needs \d+ bytes, the file has"):
        probe(path)


def test_vfr_clip_uses_the_average_rate(videos):
    """A variable-rate clip is sampled by frame index at its average rate, as decord does (its frames are not
    evenly spaced in time: the plan's times are the average-rate times qwen-vl-utils also assumes)."""
    info = probe(str(videos["vfr_4s_64x48.mp4"]))
    assert info.num_frames == 40 and info.fps == pytest.approx(11.116, abs=1e-3)
    plan = plan_video(info, VideoRequest(), FAMILIES["qwen2.5-vl"])
    assert len(plan.frame_indices) == 2 * int(40 / info.fps * 2 / 2)  # 7.2 -> 6 frames
    assert plan.frame_indices == (0, 8, 16, 23, 31, 39)


@pytest.mark.slow
@pytest.mark.parametrize("name", GOOD)
def test_qwen3_grid_from_the_real_hf_processor(videos, decoded, name):
    """Qwen3-VL's grid from transformers' own Qwen3VLVideoProcessor (do_resize=False, as Qwen3-VL's README
    calls it after qwen-vl-utils), fed the reference's sampled frames at the resized size."""
    from transformers.models.qwen3_vl.video_processing_qwen3_vl import Qwen3VLVideoProcessor

    fam = FAMILIES["qwen3-vl"]
    want = ref.reference({"type": "video", "video": str(videos[name])}, fam, decoded[name])
    frames = torch.nn.functional.interpolate(want.frames.float(), size=want.utils_size, mode="bilinear")
    out = Qwen3VLVideoProcessor()(
        videos=[frames], do_resize=False, do_convert_rgb=False, do_rescale=False, do_normalize=False,
        do_sample_frames=False, cap_pixels_per_frame=False, return_tensors="pt",
    )
    plan = plan_video(probe(str(videos[name])), VideoRequest(), fam)
    assert tuple(out["video_grid_thw"][0].tolist()) == plan.grid_thw
    assert out["pixel_values_videos"].shape[0] == plan.grid_thw[0] * plan.grid_thw[1] * plan.grid_thw[2]


@pytest.mark.parametrize("family", ["qwen2-vl", "qwen2.5-vl", "qwen2-vl-capped", "qwen3-vl", "qwen3-vl-resize-capped"])
def test_frame_list_plan_equals_reference(same_size_photos, family):
    """A list of COCO photos as a video: qwen-vl-utils' list branch (per-image resize, padding to an even
    count, then the clip resize) against packer's plan from the image headers."""
    fam = FAMILIES[family]
    paths, _ = same_size_photos
    sizes = probe_frame_list(paths)
    failures = []
    for options in [{}, {"sample_fps": 1}, {"min_pixels": 3136, "max_pixels": 50176},
                    {"resized_height": 280, "resized_width": 420}, {"raw_fps": 30, "sample_fps": 2}]:
        ele = {"type": "video", "video": paths, **options}
        plan = plan_frame_list(sizes, VideoRequest.from_part(ele), fam)
        failures += [f"{options}: {m}" for m in _compare(plan, ref.reference(ele, fam), list_length=len(paths))]
    assert not failures, "\n".join(failures)
    plan = plan_frame_list(sizes, VideoRequest(), fam)
    assert plan.frame_indices == (0, 1, 2, 3, 4, 4)


def test_frame_list_reads_fps_as_sample_fps(same_size_photos):
    """qwen-vl-utils reads only sample_fps for a list; packer also takes fps: same grid, its own timing."""
    paths, _ = same_size_photos
    sizes = probe_frame_list(paths)
    fam = FAMILIES["qwen2.5-vl"]
    with_fps = plan_frame_list(sizes, VideoRequest(fps=4), fam)
    default = plan_frame_list(sizes, VideoRequest(), fam)
    assert with_fps.grid_thw == default.grid_thw
    assert (with_fps.second_per_grid_t, default.second_per_grid_t) == (0.5, 1.0)


def test_frame_list_rejects(same_size_photos, tmp_path):
    paths, portrait = same_size_photos
    fam = FAMILIES["qwen2-vl"]
    with pytest.raises(RecordError, match=r"bad_video: the frame list's images resize to different sizes"):
        plan_frame_list(probe_frame_list([*paths[:2], portrait]), VideoRequest(), fam)
    with pytest.raises(RecordError, match=r"missing_image: frame image '.*nope.jpg' does not exist"):
        probe_frame_list([paths[0], str(tmp_path / "nope.jpg")])
    (tmp_path / "text.jpg").write_text("not an image")
    with pytest.raises(RecordError, match=r"bad_image: frame .*text.jpg is not a readable image"):
        probe_frame_list([str(tmp_path / "text.jpg")])
    with pytest.raises(RecordError, match=r"bad_video: the video's frame list is empty"):
        probe_frame_list([])


def test_decode_frame_list_is_rgb_like_qwen(tmp_path):
    rgba = Image.new("RGBA", (4, 2), (10, 20, 30, 0))  # fully transparent: white, as qwen-vl-utils composites it
    rgba.save(tmp_path / "a.png")
    Image.new("L", (4, 2), 77).save(tmp_path / "b.png")
    a, b = decode_frame_list([str(tmp_path / "a.png"), str(tmp_path / "b.png")])
    assert a.shape == b.shape == (2, 4, 3) and (a == 255).all() and (b == 77).all()


@pytest.mark.parametrize(
    "name, match",
    [
        ("audio_only.m4a", r"bad_video: .*audio_only.m4a has no video stream \(streams: audio aac\)"),
        ("audio_with_cover.mp3", r"bad_video: .* has no video stream \(streams: audio mp3\w*, video mjpeg \(cover image\)\)"),
        ("no_frames.mkv", r"bad_video: .*no_frames.mkv has a video stream with no frames"),
        ("truncated_faststart.mp4", r"bad_video: .*truncated_faststart.mp4 is truncated: box 'mdat'"),
        ("truncated_moov_last.mp4", r"bad_video: .*truncated_moov_last.mp4 is not a readable video container"),
        ("text.mp4", r"bad_video: .*text.mp4 is not a readable video container"),
        ("empty.mp4", r"bad_video: video '.*empty.mp4' is an empty file"),
    ],
)
def test_unusable_files_are_rejected_with_a_reason(videos, name, match):
    with pytest.raises(RecordError, match=match) as err:
        probe(str(videos[name]))
    again = pickle.loads(pickle.dumps(err.value.located("data.jsonl", 7)))  # crosses a worker pool intact
    assert str(again).startswith("data.jsonl:7: bad_video: ")


def test_missing_and_directory(tmp_path):
    with pytest.raises(RecordError, match=r"missing_video: video file '.*nope.mp4' does not exist"):
        probe(str(tmp_path / "nope.mp4"))
    with pytest.raises(RecordError, match=r"bad_video: video '.*' is not a regular file"):
        probe(str(tmp_path))
    with pytest.raises(RecordError, match=r"missing_video"):
        decode_frames(str(tmp_path / "nope.mp4"), [0])


def test_plan_rejects(videos):
    """Clips and options Qwen's pipeline cannot sample are rejects that say why, never a crash."""
    fam = FAMILIES["qwen2-vl"]
    clip = probe(str(videos["24fps_2s_320x240.mp4"]))  # 48 frames, 2.0 s
    cases = [
        (probe(str(videos["one_frame.mp4"])), VideoRequest(), r"the clip holds 1 frame; Qwen samples at least 2"),
        (probe(str(videos["ratio_225_900x4.mp4"])), VideoRequest(), r"900x4 px have an aspect ratio above 200"),
        (clip, VideoRequest(video_start=2.0), r"video_start 2.0 s is at or after the clip's end \(2.000 s"),
        (clip, VideoRequest(video_end=2.0 + END_SLACK_S + 0.5), r"video_end 3.5 s is more than 1.0 s past the clip's end"),
        (clip, VideoRequest(video_start=1.0, video_end=1.02), r"holds frames 24..24 of 48: fewer than 2"),
        (clip, VideoRequest(nframes=50), r"50 frames asked of a clip of 48; lower nframes"),
        (clip, VideoRequest(nframes=1), r"nframes 1 rounds to 0; Qwen samples at least 2"),
        (clip, VideoRequest(fps=0.1, min_frames=0), r"fps 0.1 over 48 frames at 24 fps gives 0 frames; Qwen samples"),
        (clip, VideoRequest(max_pixels=50176), r"max_pixels 50176 is below min_pixels 100352"),
    ]
    for info, request, match in cases:
        with pytest.raises(RecordError, match=rf"bad_video: .*{match}"):
            plan_video(info, request, fam)
    # within the slack an end past the clip is clamped, as qwen-vl-utils clamps it
    assert plan_video(clip, VideoRequest(video_end=2.0 + END_SLACK_S), fam).frame_indices[-1] == 47


@pytest.mark.parametrize(
    "part, match",
    [
        ({"fps": "2"}, r"wrong_type: video option 'fps' must be a number, got str '2'"),
        ({"nframes": True}, r"wrong_type: video option 'nframes' must be a number, got bool"),
        ({"fps": 2, "nframes": 4}, r"bad_video: give a video either 'fps' or 'nframes', not both"),
        ({"video_start": -1}, r"bad_video: video_start must be >= 0 seconds, got -1"),
        ({"video_start": 3, "video_end": 2}, r"bad_video: video_end 2 s must be after video_start 3 s"),
        ({"resized_height": 0, "resized_width": 10}, r"bad_video: video option 'resized_height' must be > 0, got 0"),
        ({"sample_fps": -2}, r"bad_video: video option 'sample_fps' must be > 0, got -2"),
    ],
)
def test_request_options_are_checked(part, match):
    with pytest.raises(RecordError, match=match):
        VideoRequest.from_part({"type": "video", "video": "a.mp4", **part})


@pytest.mark.parametrize("name", GOOD)
def test_decode_frames_seeks_to_the_same_pixels(videos, decoded, name):
    """decode_frames (seek + decode only what is needed) returns exactly the frames a full decode gives at
    those indices: the plan's, unsorted, repeated, the last frame."""
    frames = decoded[name].frames
    n = len(frames)
    rng = random.Random(name)
    plan = plan_video(probe(str(videos[name])), VideoRequest(), FAMILIES["qwen2-vl"])
    for indices in [list(plan.frame_indices), [n - 1, 0, n // 2, n // 2], sorted(rng.sample(range(n), min(n, 7)))]:
        got = decode_frames(str(videos[name]), indices)
        assert got.dtype == np.uint8 and got.shape == (len(indices), *frames[0].shape)
        assert all(np.array_equal(got[k], frames[i]) for k, i in enumerate(indices)), indices
    if not name.startswith("slideshow"):  # flat frames: each shows its own index
        assert [round(float(f.mean())) for f in decode_frames(str(videos[name]), [0, 1, n - 1])] == pytest.approx(
            [level(0), level(1), level(n - 1)], abs=3
        )
    with pytest.raises(RecordError, match=rf"bad_video: .*frame {n} asked, the clip has {n}"):
        decode_frames(str(videos[name]), [0, n])


def test_linspace_indices_is_torch_linspace_bit_for_bit():
    """qwen-vl-utils' torch.linspace(start, end, n).round().long(), without torch: 5,000 random ranges
    including long clips (values above 2**14, where float64 disagrees)."""
    rng = random.Random(0)
    for _ in range(5_000):
        start = rng.randint(0, 20_000)
        end = start + rng.randint(1, 60_000)
        steps = rng.randint(1, min(end - start + 1, 1_000))
        want = torch.linspace(start, end, steps).round().long().numpy()
        assert np.array_equal(linspace_indices(start, end, steps), want), (start, end, steps)


def test_qwen25_temporal_positions_match_torch():
    """get_vision_position_ids' temporal row: (arange(t) * (tokens_per_second * second_per_grid_t)).long()
    with second_per_grid_ts a float32 tensor (modeling_qwen2_5_vl.py:1027, modeling_qwen2_vl.py:881)."""
    for t, spg in [(10, 1.0), (7, 2 / 2.0047), (40, 2 / 3.3333333), (5, 0.0833333), (300, 2 / 29.97)]:
        interval = 2 * torch.tensor(spg, dtype=torch.float32)
        want = (torch.arange(t) * interval).long().numpy()
        assert np.array_equal(qwen25_temporal_positions(t, spg, tokens_per_second=2), want)


def test_qwen3_video_text_holds_every_token(videos):
    plan = plan_video(probe(str(videos["24fps_2s_320x240.mp4"])), VideoRequest(), FAMILIES["qwen3-vl"])
    text = qwen3_video_text(plan)
    # 4 frames (0, 16, 31, 47) at 24 fps; 320x240 is below 128 * 32**2 px, so it grows to 448x320
    assert plan.grid_thw == (2, 20, 28) and plan.tokens_per_frame == 140
    assert text.count("<|video_pad|>") == plan.num_tokens == 280
    per_frame = "<|vision_start|>" + "<|video_pad|>" * 140 + "<|vision_end|>"
    assert text == "<0.3 seconds>" + per_frame + "<1.6 seconds>" + per_frame  # (0+16)/2/24 s, (31+47)/2/24 s
    with pytest.raises(ValueError, match="qwen3-vl"):
        qwen3_video_text(plan_video(probe(str(videos["24fps_2s_320x240.mp4"])), VideoRequest(), FAMILIES["qwen2-vl"]))


def test_probe_is_cached_per_file_version(videos, tmp_path):
    path = tmp_path / "clip.mp4"
    path.write_bytes(videos["24fps_2s_320x240.mp4"].read_bytes())
    first = probe(str(path))
    assert probe(str(path)) is first
    path.write_bytes(videos["25fps_0.5s_176x144.mp4"].read_bytes())  # rewritten: another size, re-read
    assert probe(str(path)).num_frames == 12


def test_worked_example_in_the_module_docstring():
    from packer.media.video import VideoInfo

    info = VideoInfo(path="clip.mp4", width=640, height=480, num_frames=300, fps=30.0, duration=10.0,
                     time_base=None, start_time=0.0, frames_from="header", codec="h264")
    plan = plan_video(info, VideoRequest(), FAMILIES["qwen2-vl"])
    assert plan.frame_indices[:4] == (0, 16, 31, 47) and plan.frame_indices[-2:] == (283, 299)
    assert (plan.utils_size, plan.size, plan.grid_thw, plan.num_tokens) == ((476, 644), (476, 644), (10, 34, 46), 3910)
    assert (plan.sample_fps, plan.second_per_grid_t) == (2.0, 1.0)
