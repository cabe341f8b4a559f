"""GLM-4.6V against transformers 5.23.0's own glm46v code: grids and counts from headers against
``Glm46VImageProcessorPil`` (its ``smart_resize``, ``get_number_of_image_patches`` and pixels) on every COCO-mini
image and odd sizes; video sampling against ``Glm46VVideoProcessor.sample_frames`` and the whole
``Glm46VProcessor`` on decoded clips; every path's ids against ``Glm46VProcessor``'s ``input_ids``; positions
against ``Glm46VModel.get_rope_index`` on every root-to-leaf path; the reader's pixels against the processors';
packed == unpacked with videos on the real model (images: tests/models/test_conformance.py); verify; refusals.

``Glm46VVideoProcessor`` imports torchvision, which cannot be installed here: its module is imported with a stub
for that one import line, and the torchvision functions the video path calls (``resize``, ``normalize``,
``grayscale_to_rgb``) are given as the torch ops torchvision runs for a CPU uint8 clip (``TV``); everything else
is the class's own code. The tokenizer is the builtin ``glm-4.6v`` STAND-IN (packer/models/glm46v/tokenizers.py).
"""

from __future__ import annotations

import importlib
import json
import shutil
import sys
import types
from fractions import Fraction
from functools import partial
from pathlib import Path

import av
import numpy as np
import pytest
import torch
from transformers import Glm46VImageProcessorPil
from transformers.models.glm46v import image_processing_pil_glm46v as hf_image
from transformers.models.glm46v.processing_glm46v import Glm46VProcessor
from transformers.video_utils import VideoMetadata

from packer.core.types import ImageRef, VideoRef
from packer.encode.tokenizers import load_tokenizer
from packer.errors import ConfigError, RecordError
from packer.media.images import load_image
from packer.models import get_profile
from packer.models.base import Media
from packer.models.glm46v.reader import video_pixel_values
from packer.models.glm46v.resize import smart_resize
from packer.models.glm46v.tokenizers import GLM_FIRST_ID, GLM_TOKENS, STANDIN_FIRST_ID
from packer.models.glm46v.video import pyav_duration, sample_frames
from packer.report.verify import verify_build
from packer.shards.io import read_shard, write_json_atomic, write_shard
from packer.train.collate import collate
from tests.helpers import stored_table
from tests.media.make_videos import write_clip
from tests.models import released
from tests.models.family_checks import build_records, chat_paths, each_path, image_records, png, write_images

CHECKPOINT = {"shortest_edge": 12544, "longest_edge": 9633792}  # the GLM-V checkpoints' preprocessor_config.json
SETTINGS = {  # profile options -> Glm46VImageProcessorPil's size
    "checkpoint": ({}, CHECKPOINT),
    "class-default": ({"max_pixels": 28 * 28 * 15000}, {"shortest_edge": 12544, "longest_edge": 28 * 28 * 15000}),
    "small": ({"min_pixels": 16 * 28 * 28, "max_pixels": 64 * 28 * 28},
              {"shortest_edge": 16 * 28 * 28, "longest_edge": 64 * 28 * 28}),
}
# odd sizes: 1 px, thin (short side scaled up to 28 first), aspect ratios near and past 200, around the factor and
# the pixel bounds, huge
ODD_SIZES = [(1, 1), (2, 3), (27, 27), (28, 28), (29, 29), (5, 700), (700, 5), (1, 150), (150, 1), (14, 2800),
             (2800, 14), (10, 2000), (13, 2600), (4, 800), (1, 200), (1, 201), (250, 1), (2, 500), (3, 601),
             (56, 56), (55, 57), (83, 113), (640, 480),
             (480, 640), (1000, 999), (2195, 2195), (2196, 2196), (4000, 3000), (6000, 4000), (8192, 64),
             (12000, 9000), (99, 100)]


@pytest.fixture(scope="module")
def tokenizer():
    return load_tokenizer("glm-4.6v")


# ---- the torchvision-backed video processor, with torch doing torchvision's three calls ----------------------


def _tv_resize(video, size, interpolation=None, antialias=True):
    """torchvision v2 ``resize`` of a CPU uint8 tensor, bicubic: torch's own uint8 kernel (antialiased)."""
    from torch.nn.functional import interpolate

    assert interpolation.value == "bicubic" and video.dtype == torch.uint8
    lead = video.shape[:-3]
    flat = video.reshape(-1, *video.shape[-3:])
    out = interpolate(flat, size=list(size), mode="bicubic", align_corners=False, antialias=antialias)
    return out.reshape(*lead, *out.shape[-3:])


def _tv_normalize(tensor, mean, std, inplace=False):
    """torchvision's ``normalize``: ``tensor.sub_(mean).div_(std)`` per channel (a clone unless inplace)."""
    if not inplace:
        tensor = tensor.clone()
    mean = torch.as_tensor(mean, dtype=tensor.dtype).view(-1, 1, 1)
    std = torch.as_tensor(std, dtype=tensor.dtype).view(-1, 1, 1)
    return tensor.sub_(mean).div_(std)


@pytest.fixture(scope="module")
def video_module():
    """transformers' video_processing_glm46v, imported with a stub for its ``torchvision`` import line, and
    torchvision's resize / normalize / grayscale_to_rgb given to the transformers modules that call them."""
    import enum

    import transformers.image_processing_backends as backends
    import transformers.video_processing_utils as video_utils
    from transformers.image_utils import PILImageResampling

    class InterpolationMode(enum.Enum):
        NEAREST, NEAREST_EXACT, BILINEAR, BICUBIC = "nearest", "nearest-exact", "bilinear", "bicubic"
        BOX, HAMMING, LANCZOS = "box", "hamming", "lanczos"

    tvF = types.SimpleNamespace(InterpolationMode=InterpolationMode, resize=_tv_resize, normalize=_tv_normalize,
                                grayscale_to_rgb=lambda video: video)
    names = ("torchvision", "torchvision.transforms", "torchvision.transforms.v2", "torchvision.transforms.v2.functional")
    stubs = {n: types.ModuleType(n) for n in names}
    stubs["torchvision.transforms.v2.functional"].InterpolationMode = InterpolationMode
    for parent, child in zip(names, names[1:], strict=False):
        setattr(stubs[parent], child.rsplit(".", 1)[1], stubs[child])
    saved = {n: sys.modules.get(n) for n in names}
    sys.modules.update(stubs)
    try:
        module = importlib.import_module("transformers.models.glm46v.video_processing_glm46v")
    finally:
        for n, m in saved.items():
            if m is None:
                sys.modules.pop(n, None)
            else:
                sys.modules[n] = m
    patched = {(backends, "tvF"): tvF, (video_utils, "tvF"): tvF,
               (backends, "pil_torch_interpolation_mapping"): {PILImageResampling.BICUBIC: InterpolationMode.BICUBIC}}
    before = {key: getattr(*key, None) for key in patched}
    for (mod, name), value in patched.items():
        setattr(mod, name, value)
    yield module
    for (mod, name), value in before.items():
        setattr(mod, name, value)


@pytest.fixture(scope="module")
def processor(tokenizer, video_module):
    """The real Glm46VProcessor: the PIL image processor with the checkpoints' size, the video processor."""

    class Processor(Glm46VProcessor):  # the auto-class check needs torchvision's registry
        def check_argument_for_proper_class(self, name, arg):
            return None if name == "video_processor" else super().check_argument_for_proper_class(name, arg)

    return Processor(image_processor=released.image_processor("glm-4.6v"), tokenizer=tokenizer,
                     video_processor=video_module.Glm46VVideoProcessor())


# ---- the tokenizer --------------------------------------------------------------------------------------------


def test_tokenizer_is_the_stand_in(tokenizer) -> None:
    """Qwen2's BPE, GLM-4.6V's 36 added tokens after it in GLM's order (each at its GLM id + 314), the names the
    processor reads, and the GLM-V template's layout of turns, images and videos."""
    assert tokenizer("Hello world!").input_ids == [9707, 1879, 0]  # Qwen2's BPE, nothing added
    ids = tokenizer.convert_tokens_to_ids(list(GLM_TOKENS))
    assert ids == list(range(STANDIN_FIRST_ID, STANDIN_FIRST_ID + 36))
    glm = dict(zip(GLM_TOKENS, range(GLM_FIRST_ID, GLM_FIRST_ID + 36), strict=True))
    assert (glm["<|image|>"], glm["<|video|>"], glm["<|begin_of_image|>"], glm["<|end_of_image|>"]) == (
        151363, 151364, 151339, 151340)  # GLM-4.5V / 4.6V config.json's image/video token ids
    assert (tokenizer.image_token, tokenizer.video_token, tokenizer.eos_token, tokenizer.bos_token) == (
        "<|image|>", "<|video|>", "<|endoftext|>", None)
    msgs = [{"role": "system", "content": "Be brief."},
            {"role": "user", "content": [{"type": "image"}, {"type": "text", "text": "What?"}, {"type": "video"}]},
            {"role": "assistant", "content": "A cat."}, {"role": "user", "content": "More?"}]
    assert tokenizer.apply_chat_template(msgs, tokenize=False, add_generation_prompt=True) == (
        "[gMASK]<sop><|system|>\nBe brief.<|user|>\n<|begin_of_image|><|image|><|end_of_image|>What?"
        "<|begin_of_video|><|video|><|end_of_video|><|assistant|>\n<think></think>\nA cat.<|user|>\nMore?<|assistant|>\n")


# ---- images: counts from headers ------------------------------------------------------------------------------


def test_smart_resize_is_transformers(video_module) -> None:
    """packer's smart_resize == transformers' (the image module's and the video module's, the same function) on a
    sweep of sizes, frame counts and bounds; a ValueError there is a RecordError here."""
    rng = np.random.default_rng(0)
    cases = [(2, h, w, 12544, 9633792) for w, h in ODD_SIZES]
    cases += [(int(t), int(h), int(w), int(lo), int(lo * k)) for t, h, w, lo, k in zip(
        rng.integers(2, 80, 400), rng.integers(1, 3000, 400), rng.integers(1, 3000, 400),
        rng.choice([3136, 12544, 50176], 400), rng.choice([1, 4, 64, 1000], 400), strict=True)]
    for t, h, w, lo, hi in cases:
        for hf in (hf_image.smart_resize, video_module.smart_resize):
            try:
                want = hf(t, h, w, temporal_factor=2, factor=28, min_pixels=lo, max_pixels=hi)
            except ValueError:
                with pytest.raises(RecordError):
                    smart_resize(t, h, w, temporal_factor=2, factor=28, min_pixels=lo, max_pixels=hi)
                continue
            assert smart_resize(t, h, w, temporal_factor=2, factor=28, min_pixels=lo, max_pixels=hi) == want


@pytest.mark.parametrize("setting", sorted(SETTINGS))
def test_counts_from_headers_equal_the_processor(setting: str, coco_images) -> None:
    """Grid and count from the header == Glm46VImageProcessorPil's rule (its smart_resize on 2 frames, its
    get_number_of_image_patches) on every COCO-mini image and the odd sizes; verify's grid_num_tokens gives the
    count back from the stored grid; an aspect ratio past 200 is a bad image, as the processor raises."""
    options, size = SETTINGS[setting]
    profile = get_profile("glm-4.6v", **options)
    hf = Glm46VImageProcessorPil(size=size)
    sizes = [profile.image.plan(ImageRef(path=str(p))) for p in coco_images] + ODD_SIZES
    assert len(coco_images) > 200
    grids, counts, refused = [], [], 0
    for w, h in sizes:
        try:
            rh, rw = hf_image.smart_resize(2, h, w, temporal_factor=2, factor=28, min_pixels=size["shortest_edge"],
                                           max_pixels=size["longest_edge"])
        except ValueError:
            with pytest.raises(RecordError, match="aspect ratio"):
                profile.image.grid_thw(w, h)
            refused += 1
            continue
        assert profile.image.grid_thw(w, h) == (1, rh // 14, rw // 14), (w, h)
        n = hf.get_number_of_image_patches(h, w, {}) // 4
        assert profile.image.num_tokens(w, h) == n, (w, h)
        grids.append(profile.image.grid_thw(w, h))
        counts.append(n)
    assert refused == 4  # the short side is scaled up to 28 first: 1x200 passes, 1x201 and 3x601 do not
    assert profile.image.grid_num_tokens(np.array(grids)).tolist() == counts


def test_worked_example_and_grid_rule() -> None:
    profile = get_profile("glm-4.6v")
    assert profile.image.grid_thw(640, 480) == (1, 34, 46) and profile.image.num_tokens(640, 480) == 391
    assert profile.image.num_tokens(12000, 9000) == 6030  # at most 6144 tokens: 2 x area <= 9633792
    grids = np.array([(1, 34, 46), (1, 2, 2), (2, 34, 46), (1, 33, 46), (1, 0, 0)])
    assert profile.image.grid_num_tokens(grids).tolist() == [391, 1, -1, -1, -1]
    assert profile.video.grid_num_tokens(grids).tolist() == [391, 1, 782, -1, -1]
    with pytest.raises(ConfigError, match="min_pixels"):
        get_profile("glm-4.6v", min_pixels=100, max_pixels=50)


@pytest.mark.slow
def test_counts_equal_the_processors_pixels(coco_images) -> None:
    """The processor's real resize of the pixels: image_grid_thw of one COCO image per distinct grid and every odd
    size the processor takes, and pixel_values rows = t * h * w."""
    profile = get_profile("glm-4.6v")
    hf = released.image_processor("glm-4.6v")
    refs = {profile.image.grid_thw(*profile.image.plan(ImageRef(path=str(p)))): ImageRef(path=str(p)) for p in coco_images}
    odd = [ImageRef(data=png(w, h, seed=i)) for i, (w, h) in enumerate(ODD_SIZES) if w * h < 5e6]
    seen = 0
    for ref in [*refs.values(), *odd]:
        image = load_image(ref)
        try:
            out = hf(images=[image], return_tensors="np", do_rescale=False, do_normalize=False)
        except ValueError:
            with pytest.raises(RecordError):
                profile.image.grid_thw(*image.size)
            continue
        grid = tuple(int(x) for x in out["image_grid_thw"][0])
        assert profile.image.grid_thw(*image.size) == grid, image.size
        assert out["pixel_values"].shape == (grid[1] * grid[2], 3 * 2 * 14 * 14)
        seen += 1
    assert seen > 40


# ---- video: frames sampled from the header -----------------------------------------------------------------


def test_sample_frames_is_the_processors(video_module) -> None:
    """sample_frames == Glm46VVideoProcessor.sample_frames on metadata of every regime: shorter than extract_t,
    each rate band (<= 30 s, <= 300 s, longer, past 2400 s and 640 frames), fractional rates, one frame."""
    vp = video_module.Glm46VVideoProcessor()
    rates = [1, 2, 4, 23.976023976023978, 24, 25, 29.97002997002997, 30, 60, 0.5]
    counts = [1, 2, 3, 8, 12, 59, 60, 61, 90, 95, 179, 180, 181, 599, 900, 901, 1800, 9000, 9001, 20000, 90000]
    n = 0
    for fps in rates:
        for total in counts:
            duration = total / fps
            if duration > 4000:
                continue
            meta = VideoMetadata(total_num_frames=total, fps=fps, duration=duration)
            assert sample_frames(total, fps, duration) == tuple(vp.sample_frames(meta).tolist()), (total, fps)
            n += 1
    assert n > 150


@pytest.fixture(scope="module")
def clips(tmp_path_factory) -> dict[str, Path]:
    """Clips of every sampling regime: fewer frames than extract_t (4 fps, 2 s), the 3 fps band at 30 and 30000/1001
    fps with odd sizes, the 1 fps band (35 s), past 300 s (0.5 fps), three frames (an odd count, padded)."""
    root = tmp_path_factory.mktemp("glm_clips")
    specs = {"short": (4, 8, 64, 48), "band3": (30, 95, 321, 241), "ntsc": (Fraction(30000, 1001), 90, 99, 57),
             "band1": (2, 70, 64, 48), "long": (1, 305, 32, 32), "three": (4, 3, 64, 48)}
    return {name: write_clip(root / f"{name}.mp4", fps=fps, frames=n, width=w, height=h, pix_fmt="yuv444p")
            for name, (fps, n, w, h) in specs.items()}


def _decoded(path: Path) -> tuple[np.ndarray, VideoMetadata]:
    """Every frame, and the VideoMetadata transformers' PyAV loader (read_video_pyav) gives the clip."""
    with av.open(str(path)) as c:
        stream = c.streams.video[0]
        n, rate = stream.frames, stream.average_rate
        frames = np.stack([f.to_ndarray(format="rgb24") for f in c.decode(video=0)])
    return frames, VideoMetadata(total_num_frames=int(n), fps=float(rate), duration=float(n / rate))


@pytest.mark.slow
def test_plan_from_the_header_equals_the_processor(clips, processor) -> None:
    """Each clip's plan (frames, grid, tokens, timestamps) from its header == Glm46VProcessor on the decoded clip:
    the frames its video processor samples, its video_grid_thw, and the text replace_video_token writes."""
    from packer.media.video import probe

    profile = get_profile("glm-4.6v", videos=True)
    for name, path in clips.items():
        frames, meta = _decoded(path)
        info = probe(str(path))
        assert (info.num_frames, pyav_duration(info)) == (meta.total_num_frames, meta.duration), name
        plan = profile.video.plan(VideoRef(path=str(path)))
        out = processor.video_processor(videos=[frames], video_metadata=[meta], return_metadata=True,
                                        return_tensors="pt")
        assert list(plan.frame_indices) == out["video_metadata"][0].frames_indices.tolist(), name
        assert tuple(plan.grid_thw) == tuple(out["video_grid_thw"][0].tolist()), name
        want = processor.replace_video_token(out, video_idx=0)
        run = profile.video.run(plan)
        assert run.text == want and run.num_tokens == want.count("<|image|>") and run.lead == 1, name


def test_videos_the_processor_cannot_take_are_refused(tmp_path) -> None:
    """Off on request (videos=false); on (the default): a frame list, sampling options, a clip too short for two
    frames."""
    clip = write_clip(tmp_path / "one.mp4", fps=30, frames=1, width=64, height=48)
    with pytest.raises(RecordError, match="videos are off"):
        get_profile("glm-4.6v", videos=False).video.plan(VideoRef(path=str(clip)))
    profile = get_profile("glm-4.6v")
    assert profile.video.enabled and not get_profile("glm-4.6v", videos=False).video.enabled
    with pytest.raises(RecordError, match="not a list of frame images"):
        profile.video.plan(VideoRef(frames=("a.jpg", "b.jpg")))
    with pytest.raises(RecordError, match=r"no sampling options \(fps\)"):
        profile.video.plan(VideoRef(path=str(clip), options=(("fps", 1.0),)))
    with pytest.raises(RecordError, match="samples 0 frames"):
        profile.video.plan(VideoRef(path=str(clip)))
    media = [Media(ImageRef(path="x.png"), 1), Media(VideoRef(path=str(clip)), 0)]
    with pytest.raises(RecordError, match="no image beside a video"):
        profile.media_runs(media, np.array([-1, 0]))


@pytest.mark.slow
def test_video_pixels_equal_the_processor(clips, processor) -> None:
    """The reader's pixel_values_videos of the planned frames == Glm46VVideoProcessor's (its resize, fused
    normalize, temporal padding and patchify), bit for bit."""
    profile = get_profile("glm-4.6v", videos=True)
    for name in ("band3", "ntsc"):
        frames, meta = _decoded(clips[name])
        plan = profile.video.plan(VideoRef(path=str(clips[name])))
        out = processor.video_processor(videos=[frames], video_metadata=[meta], return_tensors="pt")
        got, grid = video_pixel_values(frames[list(plan.frame_indices)], height=plan.size[0], width=plan.size[1])
        assert grid == tuple(out["video_grid_thw"][0].tolist())
        assert got.dtype == out["pixel_values_videos"].dtype and torch.equal(got, out["pixel_values_videos"]), name


# ---- builds: ids, positions, pixels, verify, the proof with videos --------------------------------------------


def _records() -> list[dict]:
    img = lambda *names: [{"type": "image", "image": n} for n in names]  # noqa: E731
    text = lambda t: [{"type": "text", "text": t}]  # noqa: E731
    vid = lambda name: [{"type": "video", "video": name}]  # noqa: E731
    return [
        *image_records(pair=("wide.png", "thin.png"), tree="small.png", nested="wide.png"),
        {"messages": [{"role": "user", "content": [*vid("band3.mp4"), *text("What happens?")]}],
         "branches": [[{"role": "assistant", "content": "The grey changes."}],
                      [{"role": "user", "content": [*text("And here? "), *vid("ntsc.mp4")]},
                       {"role": "assistant", "content": "More grey."}]]},
        {"messages": [{"role": "user", "content": [*text("Two: "), *vid("short.mp4"), *vid("three.mp4")]},
                      {"role": "assistant", "content": "Two clips."}]},
        {"messages": [{"role": "user", "content": "Look."}],  # an image in one branch, a video in the other
         "branches": [[{"role": "user", "content": [*img("wide.png")]}, {"role": "assistant", "content": "Wide."}],
                      [{"role": "user", "content": [*vid("three.mp4")]}, {"role": "assistant", "content": "Grey."}]]},
        {"messages": [{"role": "user", "content": [*img("small.png"), *vid("short.mp4")]},  # refused: image + video
                      {"role": "assistant", "content": "No."}]},
    ]


VIDEO_RECORDS = {7, 8, 9, 10}  # 1-based lines with a video; 10 is refused on every setting


def _build(root: Path, *, videos: bool) -> dict:
    return build_records(root, _records(), out="videos" if videos else "images", profile="glm-4.6v",
                         max_length=65536, profile_options={"videos": videos})


@pytest.fixture(scope="module")
def files(tmp_path_factory, coco_images, clips) -> Path:
    root = tmp_path_factory.mktemp("glm46v")
    write_images(root, coco_images[0], {"wide.png": (900, 300), "thin.png": (20, 1000), "small.png": (40, 30)})
    for path in clips.values():
        shutil.copy(path, root / path.name)
    return root


@pytest.fixture(scope="module")
def built(files) -> dict:
    """A build with videos off (``videos=false``): every video record refused with the reason, the rest packed."""
    return _build(files, videos=False)


@pytest.fixture(scope="module")
def built_videos(files) -> dict:
    return _build(files, videos=True)


def _processor_inputs(path: list[dict], root: Path, tokenizer, processor) -> dict:
    """Glm46VProcessor's output for one path: its messages through the chat template, its images (PIL) and its
    videos (every decoded frame, with the PyAV loader's metadata: the processor samples them)."""
    def part(c):
        return {"type": c["type"]} if c.get("type") in ("image", "video") else c

    msgs = [{"role": m["role"], "content": m["content"] if isinstance(m["content"], str)
             else [part(c) for c in m["content"]]} for m in path]
    parts = [c for m in path if not isinstance(m["content"], str) for c in m["content"]]
    images = [load_image(ImageRef(path=str(root / c["image"]))) for c in parts if c.get("type") == "image"]
    videos = [_decoded(root / c["video"]) for c in parts if c.get("type") == "video"]
    text = tokenizer.apply_chat_template(msgs, tokenize=False)
    kw = {"images": images or None}
    if videos:
        kw.update(videos=[f for f, _ in videos], video_metadata=[m for _, m in videos])
    return processor(text=[text], return_tensors="pt", **kw)


def _examples(built: dict, tokenizer, processor):
    """(row, path positions, the processor's output) of every root-to-leaf path of the build."""
    for row, _id, _record, positions, path in each_path(built["rows"], _records(),
                                                         partial(chat_paths, image_name=True)):
        yield row, positions, _processor_inputs(path, built["root"], tokenizer, processor)


@pytest.mark.slow
def test_videos_off_refuses_videos_and_verifies(built) -> None:
    """Videos off: each video record rejected with the reason (an image beside a video: the other reason); the
    rest packed, in rows of several examples, and verified against the input."""
    totals = built["result"].manifest["totals"]
    assert totals["examples"] == len(_records()) - len(VIDEO_RECORDS) and totals["rejected"] == len(VIDEO_RECORDS)
    rejects = [json.loads(line) for line in (built["out"] / "rejects.jsonl").read_text().splitlines()]
    assert [(r["line"], r["reason"]) for r in rejects] == [(line, "bad_video") for line in sorted(VIDEO_RECORDS)]
    assert ["videos are off" in r["message"] for r in rejects] == [True, True, True, False]
    assert "no image beside a video" in rejects[3]["message"]
    assert any(len(r["example_ids"]) > 1 for r in built["rows"])
    assert verify_build(built["out"], inputs=[str(built["data"])]).ok


@pytest.mark.slow
def test_ids_and_positions_equal_the_processor_and_get_rope_index(built_videos, tokenizer, processor) -> None:
    """Every root-to-leaf path (images, two images in a turn, a tree with an image in its prefix and one in a
    nested branch, LLaVA, text, a video tree, two videos in a turn, an image and a video in sibling branches):
    its ids == Glm46VProcessor's input_ids, and
    its stored mRoPE rows == Glm46VModel.get_rope_index on the processor's own inputs (mm_token_type_ids,
    image_grid_thw, video_grid_thw)."""
    torch.manual_seed(0)
    proof = get_profile("glm-4.6v").proof()
    names = proof.model_tokens()
    model = proof.tiny_model(token_ids=dict(zip(names, tokenizer.convert_tokens_to_ids(list(names)), strict=True)),
                             vocab_size=len(tokenizer)).model
    totals = built_videos["result"].manifest["totals"]
    assert totals["rejected"] == 1 and totals["examples"] == len(_records()) - 1  # the image beside a video
    seen = videos = 0
    for row, positions, hf in _examples(built_videos, tokenizer, processor):
        assert row["input_ids"][positions].tolist() == hf["input_ids"][0].tolist()
        want, _ = model.get_rope_index(hf["input_ids"], hf["mm_token_type_ids"], image_grid_thw=hf.get("image_grid_thw"),
                                       video_grid_thw=hf.get("video_grid_thw"))
        assert np.array_equal(row["mrope_position_ids"][:, positions], want[:, 0].numpy())
        seen += 1
        videos += "video_grid_thw" in hf
    assert (seen, videos) == (1 + 1 + 3 + 1 + 1 + 1 + 2 + 1 + 2, 4)


@pytest.mark.slow
def test_reader_equals_the_processors(built_videos, processor) -> None:
    """collate of all rows: pixel_values / image_grid_thw == the image processor's rows for each image and the
    video processor's for each video (its temporal patches as (1, h, w) images), in token order."""
    rows, root = built_videos["rows"], built_videos["root"]
    batch = collate(rows)
    entries = sorted([(o, "image", im) for o, im in zip(batch["image_offsets"].tolist(),
                                                         [im for r in rows for im in r["images"]], strict=True)]
                     + [(o, "video", v) for o, v in zip(batch["video_offsets"].tolist(),
                                                       [v for r in rows for v in r["videos"]], strict=True)],
                     key=lambda x: x[0])
    pixels, grids = [], []
    for _, kind, entry in entries:
        name = Path(entry["source"]).name
        if kind == "image":
            out = processor.image_processor(images=[load_image(ImageRef(path=str(root / name)))], return_tensors="pt")
            pixels.append(out["pixel_values"])
            grids.append(out["image_grid_thw"])
        else:
            frames, meta = _decoded(root / name)
            out = processor.video_processor(videos=[frames], video_metadata=[meta], return_tensors="pt")
            t, h, w = out["video_grid_thw"][0].tolist()
            pixels.append(out["pixel_values_videos"])
            grids.append(torch.tensor([[1, h, w]] * t))
    assert torch.equal(batch["pixel_values"], torch.cat(pixels)) and torch.equal(batch["image_grid_thw"], torch.cat(grids))


@pytest.mark.slow
def test_packed_equals_unpacked_with_videos(built_videos, tokenizer) -> None:
    """The rows with videos (handed to the model as images) against every path alone with the processor's video
    inputs (pixel_values_videos, video_grid_thw, mm_token_type_ids 2): per-token losses, total, gradients."""
    import importlib.util

    spec = importlib.util.spec_from_file_location("check_equivalence",
                                                  Path(__file__).resolve().parents[2] / "scripts" / "check_equivalence.py")
    ce = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(ce)
    profile = get_profile("glm-4.6v", videos=True)
    rows = [r for r in built_videos["rows"] if len(r["videos"])]
    token_ids = ce.profile_token_ids(profile, tokenizer)
    (batch,), ids, vocab = ce.compact_vocab([collate(rows)], token_ids)
    assert len(batch["video_offsets"]) == 5 and "pixel_values_videos" not in batch
    torch.manual_seed(0)
    model = profile.proof().tiny_model(token_ids=ids, vocab_size=vocab)
    report = ce.compare(model, batch, ["sdpa_varlen"], profile=profile, token_ids=ids)
    assert report["sdpa_varlen"]["ok"], json.dumps(report)
    assert report["paths"] >= 3 and report["sdpa_varlen"]["grad_missing"] == []


@pytest.mark.slow
def test_verify_with_videos(built_videos) -> None:
    """Rows with videos verify: spans per temporal patch, the video plan, mRoPE recomputed over images and patches,
    and the image placeholder exactly on the images' spans and the videos' patches together (their frames hold it)."""
    report = verify_build(built_videos["out"], inputs=[str(built_videos["data"])])
    assert report.ok, report.lines()
    assert sum(bool(len(r["videos"])) for r in built_videos["rows"]) > 0


@pytest.mark.slow
@pytest.mark.parametrize("fault", ["grid", "position", "stray image token"])
def test_verify_catches_faults(built, tmp_path, fault) -> None:
    """A grid that is not its run's, one mRoPE position off, an <|image|> outside every image: verify says so."""
    out = tmp_path / "out"
    shutil.copytree(built["out"], out)
    manifest = json.loads((out / "manifest.json").read_text())
    entry = manifest["shards"][0]
    rows = read_shard(out / entry["file"]).to_pylist()
    row = next(r for r in rows if r["images"])
    im = row["images"][0]
    if fault == "grid":  # the same count, another layout: only the positions can tell
        im["grid_h"], im["grid_w"] = im["grid_w"], im["grid_h"]
    elif fault == "position":
        row["mrope_position_ids"][3 * (im["offset"] + 1) + 2] += 1  # token-major (T * 3): one token's w position
    else:
        row["input_ids"][0] = row["input_ids"][im["offset"]]
    new = write_shard(stored_table(rows), out / entry["file"], rows_per_row_group=2)
    manifest["shards"][0] = {**entry, "sha256": new["sha256"], "bytes": new["bytes"]}
    write_json_atomic(out / "manifest.json", manifest)
    report = verify_build(out)
    want = {"grid": "mrope_position_ids", "position": "mrope_position_ids", "stray image token": "image tokens"}[fault]
    assert {check for _, check in report.counts} == {want}, report.lines()
