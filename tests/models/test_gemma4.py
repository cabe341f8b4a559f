"""Gemma 4 against transformers 5.23.0's own code: soft-token counts from headers against the processors' resize rule
(``get_aspect_ratio_preserving_size``, ``Gemma4Processor._get_num_multimodal_tokens``) and ``Gemma4ImageProcessorPil``'s
real output on every COCO-mini image and odd sizes; every example's ids against ``Gemma4Processor``'s input_ids
for that path's conversation (images and videos expanded by the processor itself); the reader's pixels against
the image and video processors'; verify's frame checks; the refusals. Packed == unpacked on the real model:
tests/models/test_conformance.py (and here: why ``use_bidirectional_attention`` "vision" is refused).

``Gemma4VideoProcessor`` cannot be imported without torchvision (its class annotations name ``tvF``), so the tests
run its module's own source with torchvision's calls (``resize``, ``normalize``, ``grayscale_to_rgb``) done by
the torch functions torchvision runs for them (``tests.helpers.gemma4_video_processor_class``). The tokenizer is the builtin
``gemma4`` STAND-IN (packer/models/gemma4/tokenizers.py).
"""

from __future__ import annotations

import json
import shutil
from fractions import Fraction
from pathlib import Path

import numpy as np
import pytest
import torch
from PIL import Image
from transformers import Gemma4ImageProcessorPil, Gemma4Processor
from transformers.models.gemma4.image_processing_pil_gemma4 import get_aspect_ratio_preserving_size
from transformers.video_utils import VideoMetadata, default_sample_indices_fn

from packer.core.types import ImageRef, VideoRef
from packer.encode.tokenizers import load_tokenizer
from packer.errors import ConfigError, RecordError
from packer.media.images import load_image
from packer.media.video import decode_frames, probe
from packer.models import get_profile
from packer.models.gemma4.resize import SUPPORTED_SOFT_TOKENS, target_size
from packer.models.gemma4.tokenizers import GEMMA4_FIRST_ID, GEMMA4_TOKENS
from packer.models.gemma4.video import sample_indices, timestamp
from packer.report.verify import verify_build
from packer.train.collate import collate
from tests.media.make_videos import write_clip
from tests.models import family_checks as fc
from tests.models import released

# odd sizes (width, height): 1 px, extreme strips (the budget's one-token-high branch), exact budgets, a side that
# rounds to exactly a whole token (1000x700: 960x672 = 20 x 14 = 280), just off whole tokens, huge
ODD_SIZES = [(1, 1), (2, 3), (3, 2), (1, 700), (700, 1), (10000, 1), (1, 10000), (5000, 10), (10, 5000),
             (48, 48), (47, 49), (912, 672), (640, 480), (480, 640), (1000, 700), (700, 1000), (85, 238),
             (13440, 48), (4000, 3000), (99, 100), (1537, 1535)]


# ------------------------------------------------------------------ the processors, without torchvision


def _released_video_processor():
    return released.gemma4_video_processor()


class _Processor(Gemma4Processor):
    """Gemma4Processor taking the video processor above (its class check looks transformers' classes up by name,
    which needs torchvision for a video processor)."""

    def check_argument_for_proper_class(self, argument_name, argument):
        if argument_name == "video_processor":
            from transformers.video_processing_utils import VideoProcessorMixin

            assert isinstance(argument, VideoProcessorMixin)
            return type(argument)
        return super().check_argument_for_proper_class(argument_name, argument)


@pytest.fixture(scope="module")
def tok():
    return load_tokenizer("gemma4")


@pytest.fixture(scope="module")
def processor(tok):
    # google/gemma-4-*-it processor_config.json: the classes' defaults (image 280 soft tokens, video 32 frames of
    # 70), image_seq_length 280
    return _Processor(feature_extractor=released.audio_extractor("gemma4"), image_processor=released.image_processor("gemma4"),
                      tokenizer=tok, video_processor=_released_video_processor(), image_seq_length=280)


# ------------------------------------------------------------------ the tokenizer


def test_tokenizer_is_the_stand_in(tok) -> None:
    """Qwen2's BPE, Gemma 4's special tokens after it, the names Gemma4Processor reads, and the template's text."""
    assert tok("Hello world!").input_ids == [9707, 1879, 0]  # Qwen2's BPE, nothing added
    assert tok.convert_tokens_to_ids(list(GEMMA4_TOKENS)) == list(range(GEMMA4_FIRST_ID, GEMMA4_FIRST_ID + 23))
    assert (tok.bos_token, tok.eos_token, tok.pad_token) == ("<bos>", "<eos>", "<pad>")
    assert (tok.image_token, tok.boi_token, tok.eoi_token, tok.audio_token, tok.boa_token, tok.eoa_token) == (
        "<|image|>", "<|image>", "<image|>", "<|audio|>", "<|audio>", "<audio|>")
    assert tok.tokenize("a<|turn>b<|video|>") == ["a", "<|turn>", "b", "<|video|>"]
    conv = [{"role": "system", "content": "  Be brief. "},
            {"role": "user", "content": [{"type": "text", "text": " Look: "}, {"type": "image"},
                                         {"type": "text", "text": "and"}, {"type": "video"}]},
            {"role": "assistant", "content": "<|channel>thought\nhmm<channel|> A cat. "},
            {"role": "user", "content": "Sure?"},
            {"role": "assistant", "content": [{"type": "text", "text": "Yes."}]}]
    assert tok.apply_chat_template(conv, tokenize=False, add_generation_prompt=True) == (
        "<bos><|turn>system\nBe brief.<turn|>\n"
        "<|turn>user\nLook:\n\n<|image|>\n\nand\n\n<|video|>\n\n<turn|>\n"
        "<|turn>model\nA cat.<turn|>\n<|turn>user\nSure?<turn|>\n<|turn>model\nYes.<turn|>\n<|turn>model\n")
    assert tok.apply_chat_template(conv[1:2], tokenize=False).startswith("<bos><|turn>user\nLook:")  # no system turn


@pytest.mark.parametrize("conv, tools, message", [
    ([{"role": "user", "content": "Hi"}], [{"type": "function", "function": {"name": "f"}}], "renders no tools"),
    ([{"role": "user", "content": "Hi"}, {"role": "assistant", "content": None,
                                          "tool_calls": [{"function": {"name": "f", "arguments": {}}}]}], None,
     "renders no tool calls"),
    ([{"role": "system", "content": [{"type": "image"}]}, {"role": "user", "content": "Hi"}], None, "text only"),
])
def test_template_refuses_what_it_does_not_render(tok, conv, tools, message) -> None:
    with pytest.raises(Exception, match=message):
        tok.apply_chat_template(conv, tools=tools, tokenize=False)


# ------------------------------------------------------------------ counts from headers


def test_resize_rule_is_the_processors() -> None:
    """``resize.target_size`` == transformers' ``get_aspect_ratio_preserving_size`` for every budget, on a sweep
    of small sizes (every branch and rounding) and the odd sizes."""
    sizes = [(w, h) for w in range(1, 130, 7) for h in range(1, 300, 11)] + ODD_SIZES
    for budget in SUPPORTED_SOFT_TOKENS:
        for w, h in sizes:
            want = get_aspect_ratio_preserving_size(height=h, width=w, patch_size=16, max_patches=budget * 9,
                                                    pooling_kernel_size=3)
            assert target_size(h, w, patch_size=16, max_soft_tokens=budget, pooling=3) == want, (w, h, budget)


@pytest.mark.parametrize("options", [{}, {"max_soft_tokens": 70}, {"max_soft_tokens": 1120}])
def test_counts_from_headers_equal_the_processor_rule(options, coco_images, processor) -> None:
    """num_tokens from the header == Gemma4Processor._get_num_multimodal_tokens on every COCO-mini image and the
    odd sizes; the grid gives it back (verify), stats' patches are 9 per token; a video's frames use 70."""
    profile = get_profile("gemma4", **options)
    sizes = [profile.image.plan(ImageRef(path=str(p))) for p in coco_images] + ODD_SIZES
    assert len(coco_images) > 200
    want = processor._get_num_multimodal_tokens(image_sizes=[(h, w) for w, h in sizes], **options)
    got = [profile.image.num_tokens(w, h) for w, h in sizes]
    assert got == want["num_image_tokens"]
    grids = np.array([profile.image.grid_thw(w, h) for w, h in sizes])
    assert profile.image.grid_num_tokens(grids).tolist() == got
    assert profile.image.units(grids)[1].tolist() == [9 * n for n in got]
    assert len(set(got)) > 5 and max(got) <= profile.max_soft_tokens  # the count depends on the size
    videos = processor._get_num_multimodal_tokens(video_sizes=[(32, h, w) for w, h in sizes])["num_video_tokens"]
    frames = [target_size(h, w, patch_size=16, max_soft_tokens=70, pooling=3) for w, h in sizes]  # video.plan's
    assert profile.video.grid_num_tokens(np.array([(32, fh // 48, fw // 48) for fh, fw in frames])).tolist() == videos


def test_grid_num_tokens_refuses_grids_no_image_gives() -> None:
    profile = get_profile("gemma4")
    grids = np.array([(1, 14, 19), (1, 1, 280), (1, 16, 16), (1, 17, 17), (2, 14, 19), (1, 0, 5), (1, 1, 281)])
    assert profile.image.grid_num_tokens(grids).tolist() == [266, 280, 256, -1, -1, -1, -1]
    frames = np.array([(32, 7, 9), (1, 7, 9), (32, 8, 9), (0, 7, 9)])
    assert profile.video.grid_num_tokens(frames).tolist() == [32 * 63, 63, -1, -1]


@pytest.mark.slow
def test_counts_equal_the_processors_pixels(coco_images) -> None:
    """Gemma4ImageProcessorPil on the decoded pixels: its num_soft_tokens_per_image and real patches equal the
    header's count, on one COCO image per distinct grid and every odd size (small ones as real files)."""
    profile = get_profile("gemma4")
    proc = Gemma4ImageProcessorPil()
    coco = {profile.image.grid_thw(*profile.image.plan(ImageRef(path=str(p)))): ImageRef(path=str(p)) for p in coco_images}
    odd = [ImageRef(data=fc.png(w, h, seed=i)) for i, (w, h) in enumerate(ODD_SIZES) if w * h <= 4_000_000]
    refs = list(coco.values()) + odd
    assert len(coco) > 3
    for ref in refs:
        w, h = profile.image.plan(ref)
        out = proc(images=[load_image(ref)], return_tensors="np")
        n = profile.image.num_tokens(w, h)
        assert out["num_soft_tokens_per_image"][0] == n, (w, h)
        assert int((out["image_position_ids"][0] >= 0).all(-1).sum()) == 9 * n
        _, rows, cols = profile.image.grid_thw(w, h)
        assert out["image_position_ids"][0, 9 * n - 1].tolist() == [3 * cols - 1, 3 * rows - 1]  # (x, y) last patch


# ------------------------------------------------------------------ video plans


def test_frame_sampling_is_the_processors() -> None:
    for total in (1, 5, 31, 32, 33, 100, 301, 10_000):
        for n in (1, 7, 32):
            if n <= total:
                md = VideoMetadata(total_num_frames=total, fps=30.0)
                assert sample_indices(total, n).tolist() == default_sample_indices_fn(md, num_frames=n).tolist()
    with pytest.raises(RecordError, match="asks more frames"):
        sample_indices(8, 32)
    assert [timestamp(s) for s in (0.0, 0.999, 59.99, 60.0, 61.5, 3599.9, 3600.0)] == [
        "00:00", "00:00", "00:59", "01:00", "01:01", "59:59", "60:00"]


@pytest.fixture(scope="module")
def clips(tmp_path_factory) -> dict[str, Path]:
    """A noisy 40-frame clip at 2 fps (20 s, 48x64), an 8-frame one, and one at 1/3 fps (3 minutes)."""
    root = tmp_path_factory.mktemp("gemma4-clips")
    rng = np.random.default_rng(0)
    noisy = [rng.integers(0, 256, (48, 64, 3), dtype=np.uint8) for _ in range(40)]
    return {"clip": write_clip(root / "clip.mp4", fps=2, frames=40, width=64, height=48, images=noisy),
            "short": write_clip(root / "short.mp4", fps=4, frames=8, width=64, height=48),
            "slow": write_clip(root / "slow.mp4", fps=Fraction(1, 3), frames=60, width=96, height=32)}


def test_video_plans_from_the_header(clips) -> None:
    profile = get_profile("gemma4")
    plan = profile.video.plan(VideoRef(path=str(clips["clip"])))
    assert plan.frame_indices == tuple(np.arange(32) * 40 // 32)
    assert plan.size == (336, 432) and plan.grid_thw == (32, 7, 9) and plan.num_tokens == 32 * 63
    run = profile.video.run(plan)
    assert run.text.startswith("00:00 <|image>" + "<|video|>" * 63 + "<image|> 00:00 <|image>")
    assert run.text.count("<|image>") == 32 and run.text.endswith("<image|>") and " 00:19 <|image>" in run.text
    short = profile.video.plan(VideoRef(path=str(clips["short"])))  # fewer frames than 32: all of them
    assert short.frame_indices == tuple(range(8))
    five = profile.video.plan(VideoRef(path=str(clips["clip"]), options=(("nframes", 5),)))
    assert five.frame_indices == (0, 8, 16, 24, 32)
    slow = profile.video.plan(VideoRef(path=str(clips["slow"])))
    assert profile.video.run(slow).text.split(" <|image>")[-1].endswith("<image|>")
    assert profile.video.run(slow).text.endswith(" 02:54 <|image>" + "<|video|>" * 56 + "<image|>")  # 58 / (1/3) s
    bad = [(VideoRef(path=str(clips["short"]), options=(("nframes", 9),)), "asks more frames"),
           (VideoRef(path=str(clips["clip"]), options=(("fps", 2),)), "takes no fps"),
           (VideoRef(path=str(clips["clip"]), options=(("nframes", 2.5),)), "positive integer"),
           (VideoRef(frames=("a.png", "b.png")), "not from a list of frame images")]
    for ref, message in bad:
        with pytest.raises(RecordError, match=message):
            profile.video.plan(ref)


# ------------------------------------------------------------------ refusals


def test_settings_packer_cannot_pack_are_refused() -> None:
    with pytest.raises(ConfigError, match="sliding-window layers only"):
        get_profile("gemma4", use_bidirectional_attention="vision")
    with pytest.raises(ConfigError, match="cannot be packed exactly"):
        get_profile("gemma4", use_bidirectional_attention="all")
    with pytest.raises(ConfigError, match="bidirectional_images"):
        get_profile("gemma4", bidirectional_images=True)  # another family's knob
    with pytest.raises(ConfigError, match="must be one of"):
        get_profile("gemma4", max_soft_tokens=256)
    with pytest.raises(ConfigError, match="video_num_frames"):
        get_profile("gemma4", video_num_frames=0)
    assert get_profile("gemma4", use_bidirectional_attention=None).use_bidirectional_attention is None


# ------------------------------------------------------------------ a build against the processor


def _paths(record: dict) -> list[list[dict]]:
    """Each root-to-leaf path's messages of a record (packer's node order); a LLaVA record's image turn names its
    image (``_image``)."""
    paths = fc.chat_paths(record)
    if "conversations" in record:
        return [[{**m, "_image": record["image"]} if isinstance(m["content"], list) else m for m in paths[0]]]
    return paths


def _media(path: list[dict], root: Path) -> tuple[list[Image.Image], list[tuple[np.ndarray, VideoMetadata, dict]]]:
    """The path's images (decoded) and videos (every frame decoded, the header's metadata, the part's options)."""
    images, videos = [], []
    for m in path:
        for part in m["content"] if isinstance(m["content"], list) else ():
            if part.get("type") == "image":
                images.append(load_image(ImageRef(path=str(root / part.get("image", m.get("_image", ""))))))
            elif part.get("type") == "video":
                info = probe(str(root / part["video"]))
                frames = decode_frames(info.path, range(info.num_frames))
                meta = VideoMetadata(total_num_frames=info.num_frames, fps=info.fps, width=info.width,
                                     height=info.height, duration=info.num_frames / info.fps)
                videos.append((frames, meta, {k: v for k, v in part.items() if k not in ("type", "video")}))
    return images, videos


def _processor_ids(path: list[dict], root: Path, tok, processor) -> tuple[list[int], list[int]]:
    """Gemma4Processor's input_ids and mm_token_type_ids for one path: its messages rendered by the chat template (media as parts), the
    images and whole clips (with their metadata) given to the processor, which samples and expands them."""
    msgs = [{"role": m["role"], "content": [{"type": p["type"]} if p.get("type") in ("image", "video") else p
                                            for p in m["content"]] if isinstance(m["content"], list) else m["content"]}
            for m in path]
    text = tok.apply_chat_template(msgs, tokenize=False)
    images, videos = _media(path, root)
    kwargs: dict = {}
    if images:
        kwargs["images"] = [images]
    if videos:
        assert len({json.dumps(o) for *_, o in videos}) == 1  # one set of options per call
        kwargs.update(videos=[v for v, _, _ in videos], video_metadata=[m for _, m, _ in videos])
        options = videos[0][2]
        short = min(m.total_num_frames for _, m, _ in videos)
        kwargs["num_frames"] = options.get("nframes", min(32, short))
    out = processor(text=[text], add_special_tokens=False, return_tensors="np", **kwargs)
    return out["input_ids"][0].tolist(), out["mm_token_type_ids"][0].tolist()


@pytest.fixture(scope="module")
def built(tmp_path_factory, coco_images, clips):
    """A build over a COCO image, odd sizes, two images in one turn, a tree with its image in the prefix and a
    nested branch, an image in a later turn, a LLaVA record, text, videos (a 40-frame clip, an 8-frame one, one
    with "nframes") under a QA tree and beside an image, in rows of several examples."""
    root = tmp_path_factory.mktemp("gemma4")
    fc.write_images(root, coco_images[0], {"wide.png": (900, 300), "line.png": (1, 700), "round.png": (1000, 700),
                                        "small.png": (40, 30)})
    for name, clip in clips.items():
        shutil.copy(clip, root / f"{name}.mp4")
    img = lambda *names: [{"type": "image", "image": n} for n in names]  # noqa: E731
    text = lambda t: [{"type": "text", "text": t}]  # noqa: E731
    records = [
        *fc.image_records(tree="round.png"),
        {"messages": [{"role": "user", "content": [{"type": "video", "video": "clip.mp4"}, *text("What happens?")]}],
         "branches": [[{"role": "assistant", "content": "Noise flickers."}], [{"role": "assistant", "content": "TV."}]]},
        {"messages": [{"role": "user", "content": [*img("small.png"), {"type": "video", "video": "short.mp4"},
                                                   *text("Same?")]}, {"role": "assistant", "content": "No."}]},
        {"messages": [{"role": "user", "content": [{"type": "video", "video": "clip.mp4", "nframes": 5},
                                                   *text("Five frames.")]}, {"role": "assistant", "content": "Yes."}]},
    ]
    return fc.build_records(root, records, profile="gemma4", max_length=4096)


@pytest.mark.slow
def test_expansion_equals_the_processor(built, tok, processor) -> None:
    """Every root-to-leaf path of every example == Gemma4Processor's input_ids for that path's conversation (its
    images, and its whole clips sampled by the video processor), the entries at its mm_token_type_ids; the build
    verifies against its input."""
    assert built["result"].manifest["totals"]["rejected"] == 0
    assert verify_build(built["root"] / "out", inputs=[str(built["data"])]).ok
    rows, root = built["rows"], built["root"]
    assert len(rows) > 1 and any(len(r["example_ids"]) > 1 for r in rows)
    seen = 0
    for row, example_id, _record, positions, path in fc.each_path(rows, built["records"], _paths):
        want, types_ = _processor_ids(path, root, tok, processor)
        assert row["input_ids"][positions].tolist() == want, (example_id, path)
        # the stored entries are the processor's media tokens: images type 1, video frames type 2
        media = np.zeros(len(row["input_ids"]), dtype=np.int64)
        for im in row["images"]:
            media[im["offset"] : im["offset"] + im["num_tokens"]] = 1
        media[row["input_ids"] == tok.convert_tokens_to_ids("<|video|>")] = 2
        assert media[positions].tolist() == types_
        seen += 1
    assert seen == 1 + 1 + 3 + 1 + 1 + 1 + 2 + 1 + 1


@pytest.mark.slow
def test_reader_equals_the_processors(built, clips) -> None:
    """collate of every row: pixel_values / image_position_ids == Gemma4ImageProcessorPil on the images in token
    order; pixel_values_videos / video_position_ids / num_frames_per_video == Gemma4VideoProcessor's own code on the
    whole clips (it samples the frames itself); the proof cuts the batch per image and video the same way."""
    rows, root = built["rows"], built["root"]
    batch = collate(rows)
    images = [im for r in rows for im in r["images"]]
    decoded = [load_image(ImageRef(path=str(root / Path(im["source"]).name))) for im in images]
    want = Gemma4ImageProcessorPil()(images=decoded, return_tensors="pt")
    for key in ("pixel_values", "image_position_ids"):
        assert batch[key].dtype == want[key].dtype and torch.equal(batch[key], want[key]), key
    videos = [v for r in rows for v in r["videos"]]
    assert len(videos) == 3  # the tree's clip is stored once, in its prefix
    clips_in, metas, counts = [], [], []
    for v in videos:
        info = probe(v["source"])
        clips_in.append(decode_frames(info.path, range(info.num_frames)))
        metas.append(VideoMetadata(total_num_frames=info.num_frames, fps=info.fps, width=info.width,
                                   height=info.height, duration=info.num_frames / info.fps))
        counts.append(len(v["frame_indices"]))
    vp = _released_video_processor()
    parts = [vp(videos=[c], video_metadata=[m], num_frames=n, return_tensors="pt") for c, m, n in
             zip(clips_in, metas, counts, strict=True)]
    for key in ("pixel_values_videos", "video_position_ids"):
        got, ref = batch[key], torch.cat([p[key] for p in parts])
        assert got.dtype == ref.dtype and torch.equal(got, ref), key
    assert batch["num_frames_per_video"].tolist() == counts and sorted(counts) == [5, 8, 32]
    assert (batch["pixel_values_videos"].abs().sum((1, 2)) > 0).all()  # noise frames, upscaled: not blank


@pytest.mark.slow
@pytest.mark.parametrize("fault", ["frame token", "stray video token", "frames", "frame size", "offset"])
def test_verify_checks_every_frame(built, tmp_path, tok, fault) -> None:
    """A frame's token broken, a stray <|video|>, fewer frames sampled than the grid has, a stored frame size that
    is not the grid's, or an entry not at its run: verify says so."""
    out = tmp_path / "out"
    shutil.copytree(built["root"] / "out", out)
    text_id = tok("x").input_ids[0]
    video_id = tok.convert_tokens_to_ids("<|video|>")

    def change(row: dict, v: dict) -> None:
        first = row["input_ids"].index(video_id, v["offset"])
        if fault == "frame token":
            row["input_ids"][first + 10] = text_id
        elif fault == "stray video token":
            row["input_ids"][0] = video_id
        elif fault == "frames":  # a frame less decoded than the grid's
            v["frame_indices"] = v["frame_indices"][:-1]
        elif fault == "frame size":
            v["width"] += 48
        else:
            v["offset"] = first + 1

    fc.rewrite_first(out, lambda row: row["videos"][0] if row["videos"] else None, change, missing="no video")
    report = verify_build(out)
    assert not report.ok
    want = {"frame token": "video spans", "stray video token": "video tokens", "frames": "video plan",
            "frame size": "video plan", "offset": "video spans"}[fault]
    assert {check for _, check in report.counts} == {want}, report.lines()


@pytest.mark.slow
def test_vision_bidirectional_checkpoints_cannot_be_packed_exactly(built, tok) -> None:
    """Why ``use_bidirectional_attention="vision"`` (31B, 26B-A4B) is refused: on a tiny model with it set, each path
    alone (the processor's ``mm_token_type_ids``: blocks on the sliding-window layers only) differs from the packed
    row both without spans (images causal everywhere) and with each image's and frame's run as a bidirectional span
    (packer applies spans on every layer, the full-attention ones too). The same model unset is exact."""
    import importlib.util as iu

    spec = iu.spec_from_file_location("check_equivalence", Path(__file__).resolve().parents[2] / "scripts" /
                                      "check_equivalence.py")
    ce = iu.module_from_spec(spec)
    spec.loader.exec_module(ce)
    profile = get_profile("gemma4")
    # the shortest row holding images and a clip's frames: every kind of run the spans cover, at the fewest tokens
    # (each path alone and the packed row run several times over; the longest row cost ~2.5x as much)
    row = min((r for r in built["rows"] if r["images"] and r["videos"]), key=lambda r: len(r["input_ids"]))
    with released.released_reader(profile):  # the released image processor, not the profile's
        rows = collate([row])
    (batch,), ids, vocab = ce.compact_vocab([rows], ce.profile_token_ids(profile, tok))
    model = profile.proof().tiny_model(token_ids=ids, vocab_size=vocab)
    assert ce.compare(model, batch, ["sdpa_varlen"], profile=profile, token_ids=ids)["sdpa_varlen"]["ok"]
    model.config.text_config.use_bidirectional_attention = "vision"  # Gemma4Model reads it at every forward
    ref = ce.reference(model, batch, profile, ids)
    soft = (batch["input_ids"][0] == ids["<|image|>"]) | (batch["input_ids"][0] == ids["<|video|>"])
    edges = torch.diff(soft.to(torch.int8), prepend=torch.zeros(1, dtype=torch.int8), append=torch.zeros(1, dtype=torch.int8))
    spans = torch.stack([(edges == 1).nonzero()[:, 0], (edges == -1).nonzero()[:, 0]], dim=1)  # (S, 2) every run
    for name, extra in (("causal", {}), ("spans", {"bidirectional_spans": spans})):
        got = ce.compare(model, {**batch, **extra}, ["sdpa_varlen"], ref=ref)["sdpa_varlen"]
        assert not got["ok"] and got["loss_max_rel"] > 1e-4, (name, got)
