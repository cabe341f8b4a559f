"""Molmo2 video at build time against transformers 5.23.0's own molmo2 code: frames sampled from the header,
the ``<|video|>`` expansion, and the rejects.

References: ``Molmo2VideoProcessor.sample_frames`` (called on the ``VideoMetadata`` transformers' PyAV loader
reads: ``stream.frames``, ``average_rate``), and the whole ``Molmo2Processor`` on the decoded clip: its
input_ids and video_grids. The video processor's two torchvision calls run in torch (as for images, see
packer/models/molmo2.py). The tokenizer is packer's ``molmo2`` STAND-IN (Qwen2 BPE + Molmo2's special tokens).
"""

from __future__ import annotations

import importlib.util
from fractions import Fraction
from pathlib import Path

import av
import numpy as np
import pytest

from packer.core.types import Example, ImageRef, Message, Node, VideoRef
from packer.encode.encoder import Encoder
from packer.encode.tokenizers import load_tokenizer
from packer.errors import RecordError
from packer.models import get_profile
from tests.media.make_videos import write_clip
from tests.models import released

# (fps, frames, width, height): several rates, 0.1-40 s, odd sizes; a clip shorter than one sampled frame
CLIPS = [(24, 48, 320, 240), (25, 12, 176, 144), (30, 95, 321, 241), (Fraction(30000, 1001), 90, 99, 57),
         (60, 600, 64, 48), (30, 1200, 32, 32), (1, 6, 64, 48), (2, 3, 33, 17), (30, 3, 64, 48)]
OPTIONS = [{}, {"fps": 1}, {"fps": 7.5}, {"max_frames": 8}, {"max_fps": 1}, {"max_frames": 3, "max_fps": 30}]


@pytest.fixture(scope="module")
def clips(tmp_path_factory) -> list[Path]:
    root = tmp_path_factory.mktemp("molmo2_clips")
    return [write_clip(root / f"{i}.mp4", fps=fps, frames=n, width=w, height=h, pix_fmt="yuv444p")
            for i, (fps, n, w, h) in enumerate(CLIPS)]


@pytest.fixture(scope="module")
def profile():
    return get_profile("molmo2")


@pytest.fixture(scope="module")
def tokenizer():
    return load_tokenizer("molmo2")


def _metadata(path: Path):
    """What transformers' PyAV loader (video_utils.read_video_pyav) reads as the clip's metadata."""
    from transformers.video_utils import VideoMetadata

    with av.open(str(path)) as c:
        stream = c.streams.video[0]
        n, fps = stream.frames, float(stream.average_rate)
    return VideoMetadata(total_num_frames=n, fps=fps, duration=n / fps)


@pytest.fixture(scope="module")
def processor(profile, tokenizer):
    """The real Molmo2Processor, its video processor's resize/normalize done by torch (no torchvision)."""
    import torch
    import torch.nn.functional as F
    from transformers.models.molmo2.processing_molmo2 import Molmo2Processor
    from transformers.models.molmo2.video_processing_molmo2 import Molmo2VideoProcessor

    class VideoProcessor(Molmo2VideoProcessor):
        def resize(self, image, size, resample=None, antialias=True, **kwargs):
            return F.interpolate(image, size=(size.height, size.width), mode="bilinear", align_corners=False,
                                 antialias=antialias)

        def normalize(self, image, mean, std, inplace=False, **kwargs):
            mean = torch.as_tensor(mean, dtype=image.dtype).view(-1, 1, 1)
            std = torch.as_tensor(std, dtype=image.dtype).view(-1, 1, 1)
            return (image - mean) / std

    class Processor(Molmo2Processor):  # the auto-class check needs torchvision's registry
        def check_argument_for_proper_class(self, name, arg):
            return None if name == "video_processor" else super().check_argument_for_proper_class(name, arg)

    # the fixture's values (tests/models/released/molmo2.json), named as Molmo2VideoProcessor's arguments
    values = released.file_values(released.entry_of("molmo2"), released.P)
    video = VideoProcessor(num_frames=values["video_num_frames"], max_fps=values["video_max_fps"],
                           size={"height": values["crop_px"], "width": values["crop_px"]})
    return Processor(image_processor=released.image_processor("molmo2"), video_processor=video,
                     tokenizer=tokenizer, chat_template=tokenizer.chat_template)


def _ref(path: Path, **options) -> VideoRef:
    return VideoRef(path=str(path), options=tuple(sorted(options.items())))


def test_sampling_equals_the_processor(profile, processor, clips) -> None:
    """Every clip x option: header-only frame indices, grid and tokens == sample_frames on the loader's metadata."""
    for path in clips:
        for options in OPTIONS:
            plan = profile.video.plan(_ref(path, **options))
            kw = {"fps": options.get("fps"), "max_fps": options.get("max_fps")}
            if "max_frames" in options:
                kw["num_frames"] = options["max_frames"]
            want = processor.video_processor.sample_frames(_metadata(path), **kw).tolist()
            assert list(plan.frame_indices) == want, (path.name, options)
            assert plan.grid_thw == (len(want), 9, 9)
            assert plan.num_tokens == len(want) * 81


def _example(video: VideoRef, question: str = "What happens?") -> Example:
    return Example(root=Node(messages=[Message(role="user", parts=[video, question]),
                                       Message(role="assistant", parts=["Grey frames."])]),
                   kind="messages", path="t.jsonl", line=1)


def test_expansion_equals_the_processor(profile, processor, tokenizer, clips) -> None:
    """Encoder input_ids == Molmo2Processor's on the decoded clip (timestamps, frame tokens); its video_grids
    == the plan's grid; the video's offset is the first token of its text."""
    import torch

    encoder = Encoder(tokenizer, profile)
    for path in clips[:4]:
        enc = encoder.encode(_example(_ref(path)))
        text = tokenizer.apply_chat_template(
            [{"role": "user", "content": [{"type": "video"}, {"type": "text", "text": "What happens?"}]},
             {"role": "assistant", "content": [{"type": "text", "text": "Grey frames."}]}], tokenize=False)
        with av.open(str(path)) as c:
            frames = np.stack([f.to_ndarray(format="rgb24") for f in c.decode(c.streams.video[0])])
        # a torch tensor: a numpy clip indexed by a one-frame sample loses its frame axis in transformers
        ref = processor(text=text, videos=[torch.from_numpy(frames)], video_metadata=[_metadata(path)], return_tensors="np")
        assert enc.input_ids.tolist() == ref["input_ids"][0].tolist(), path.name
        (video,) = enc.videos
        assert tuple(ref["video_grids"][0].tolist()) == video.grid_thw
        assert tokenizer.decode(enc.input_ids[video.offset : video.offset + 4]).startswith("0.0 ")


def test_rejects(profile, tmp_path, clips) -> None:
    """Options Molmo2's processor has no notion of, frame lists and unreadable files: RecordError, no crash."""
    (tmp_path / "text.mp4").write_text("not a video\n")
    cases = [(_ref(clips[0], video_start=1.0), "bad_video"), (_ref(clips[0], fps=0), "bad_video"),
             (VideoRef(frames=("a.jpg", "b.jpg")), "bad_video"), (_ref(tmp_path / "text.mp4"), "bad_video"),
             (_ref(tmp_path / "missing.mp4"), "missing_video")]
    for ref, reason in cases:
        with pytest.raises(RecordError) as e:
            profile.video.plan(ref)
        assert e.value.reason == reason, ref


def _shard_video(path: Path, plan) -> dict:
    """A shard ``videos`` entry's fields the reader reads."""
    return {"source": str(path), "frame_indices": list(plan.frame_indices), "offset": 0,
            "grid_t": plan.grid_thw[0], "grid_h": plan.grid_thw[1], "grid_w": plan.grid_thw[2]}


def test_reader_gives_the_processor_output(profile, processor, clips) -> None:
    """``video_pixel_values`` of the planned frames == the processor on the whole decoded clip (it samples
    itself): pixel_values_videos, video_token_pooling (offsets across two videos) and video_grids."""
    import torch

    chosen = [clips[2], clips[3]]
    plans = [profile.video.plan(_ref(p)) for p in chosen]
    ours = profile.reader().video_pixel_values([_shard_video(p, plan) for p, plan in zip(chosen, plans, strict=True)])
    clips_decoded = []
    for path in chosen:
        with av.open(str(path)) as c:
            clips_decoded.append(torch.from_numpy(np.stack([f.to_ndarray(format="rgb24") for f in c.decode(c.streams.video[0])])))
    ref = processor.video_processor(videos=clips_decoded, video_metadata=[_metadata(p) for p in chosen],
                                    return_tensors="pt")
    for key in ("pixel_values_videos", "video_token_pooling", "video_grids"):
        assert torch.equal(ours[key], ref[key]), key


@pytest.mark.skipif(importlib.util.find_spec("torchvision") is None, reason="needs torchvision (see the issue)")
def test_same_pixels_as_torchvision(profile, clips) -> None:
    """The unmodified Molmo2VideoProcessor (torchvision) gives the pixels the torch-only reader gives."""
    import torch
    from transformers.models.molmo2.video_processing_molmo2 import Molmo2VideoProcessor

    plan = profile.video.plan(_ref(clips[2]))
    ours = profile.reader().video_pixel_values([_shard_video(clips[2], plan)])
    with av.open(str(clips[2])) as c:
        frames = torch.from_numpy(np.stack([f.to_ndarray(format="rgb24") for f in c.decode(c.streams.video[0])]))
    ref = Molmo2VideoProcessor()(videos=[frames], video_metadata=[_metadata(clips[2])], return_tensors="pt")
    torch.testing.assert_close(ours["pixel_values_videos"], ref["pixel_values_videos"], rtol=0, atol=1e-6)
    assert torch.equal(ours["video_token_pooling"], ref["video_token_pooling"])


@pytest.mark.slow
def test_one_video_per_path(profile, tokenizer, clips, coco_images) -> None:
    """Molmo2Processor allows one video per sample and Molmo2Model no image beside it, so an example (one
    root-to-leaf path) with two videos, or a video and an image, is a bad_video reject; a tree whose branches
    each hold their own clip is fine (every path has one)."""
    encoder = Encoder(tokenizer, profile)
    a, b, image = _ref(clips[0]), _ref(clips[1]), ImageRef(path=str(coco_images[0]))

    def turn(*parts) -> list[Message]:
        return [Message(role="user", parts=[*parts, "What happens?"]), Message(role="assistant", parts=["Grey."])]

    def example(root: Node) -> Example:
        return Example(root=root, kind="messages", path="t.jsonl", line=1)

    for bad in (Node(messages=turn(a, b)), Node(messages=turn(a), children=[Node(messages=turn(image))]),
                Node(messages=turn(image), children=[Node(messages=turn(a)), Node(messages=turn("plain"))])):
        with pytest.raises(RecordError) as e:
            encoder.encode(example(bad))
        assert e.value.reason == "bad_video" and "example (path)" in str(e.value)
    branches = encoder.encode(example(Node(messages=[Message(role="system", parts=["Watch."])],
                                           children=[Node(messages=turn(a)), Node(messages=turn(b))])))
    assert len(branches.videos) == 2
