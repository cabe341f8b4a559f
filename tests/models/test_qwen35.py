"""Qwen3.5's images and video (``qwen3.5``, ``qwen3.5-moe``: Qwen3-VL's rules, checked against Qwen3.5's own
classes in transformers 5.23.0): vision token counts against the image processor transformers maps ``qwen3_5``
to, configured as the checkpoints' preprocessor_config.json (every COCO-mini image, odd sizes); input_ids against
``Qwen3VLProcessor`` (Qwen3.5's processor) run with the stand-in tokenizer on images and a video; positions
against ``Qwen3_5Model.get_rope_index`` on every root-to-leaf path of a build whose trees hold images and videos;
and packed == unpacked on a tiny ``Qwen3_5ForConditionalGeneration`` with those rows (3 Gated DeltaNet layers and
1 full-attention layer, a vision tower). The conformance test runs both profiles' proofs on its own corpus too.
"""

from __future__ import annotations

import json
from fractions import Fraction

import numpy as np
import pytest
import torch
from PIL import Image
from transformers import Qwen3_5Config, Qwen3_5Model, Qwen3_5MoeConfig
from transformers.models.auto.image_processing_auto import IMAGE_PROCESSOR_MAPPING_NAMES
from transformers.models.auto.processing_auto import PROCESSOR_MAPPING_NAMES
from transformers.models.auto.video_processing_auto import VIDEO_PROCESSOR_MAPPING_NAMES
from transformers.models.qwen3_vl.processing_qwen3_vl import Qwen3VLProcessor
from transformers.processing_utils import ProcessorMixin
from transformers.video_utils import VideoMetadata

from packer.config import BuildConfig
from packer.core.types import ImageRef
from packer.encode.tokenizers import load_tokenizer
from packer.errors import RecordError
from packer.media.images import load_image
from packer.models import family_of, get_profile
from packer.models.qwen_vl.qwen3 import Qwen3VLProfile
from packer.pipeline.build import build
from packer.report.verify import verify_build
from packer.train.collate import collate
from packer.train.dataset import PackedDataset
from packer.train.layout import PackedLayout
from tests.conftest import COCO
from tests.media.make_videos import write_clip
from tests.models import released
from tests.train.test_equivalence import _check, _tiny, ce

IMAGE_FILES = sorted(p for d in ("train2017", "val2017", "unlabelled") for p in (COCO / d).glob("*.jpg"))

SMALL = {"min_pixels": 32 * 32 * 4, "max_pixels": 32 * 32 * 16}  # the build's bounds: small images, fast tests
VIDEO_SMALL = {"min_pixels": 32 * 32 * 4, "max_pixels": 32 * 32 * 12}  # qwen-vl-utils' per-part bounds


def _image_processor(**size):
    assert IMAGE_PROCESSOR_MAPPING_NAMES["qwen3_5"]["pil"] == "Qwen2VLImageProcessorPil"
    return released.image_processor("qwen3.5", **size)  # the released files (tests/models/released/qwen_vl.json)


def test_transformers_runs_qwen35_with_qwen3vl_classes() -> None:
    """What the profile follows: Qwen3.5's processor, image and video processors are Qwen3-VL's; its config's
    vision tower is Qwen3-VL's without DeepStack; its vision ids are its own, for the same token names."""
    for model_type in ("qwen3_5", "qwen3_5_moe"):
        assert PROCESSOR_MAPPING_NAMES[model_type] == PROCESSOR_MAPPING_NAMES["qwen3_vl"] == "Qwen3VLProcessor"
        assert IMAGE_PROCESSOR_MAPPING_NAMES[model_type] == IMAGE_PROCESSOR_MAPPING_NAMES["qwen3_vl"]
        assert VIDEO_PROCESSOR_MAPPING_NAMES[model_type] == VIDEO_PROCESSOR_MAPPING_NAMES["qwen3_vl"]
    for config in (Qwen3_5Config(), Qwen3_5MoeConfig()):
        v = config.vision_config
        assert (v.patch_size, v.spatial_merge_size, v.temporal_patch_size) == (16, 2, 2)
        assert not hasattr(v, "deepstack_visual_indexes")
        assert (config.image_token_id, config.video_token_id, config.vision_start_token_id,
                config.vision_end_token_id) == (248056, 248057, 248053, 248054)
    for name in ("qwen3.5", "qwen3.5-moe"):
        profile = get_profile(name)
        assert isinstance(profile, Qwen3VLProfile) and (profile.video is not None) and profile.positions.mrope
        assert (profile.patch_size, profile.merge_size, profile.temporal_patch_size) == (16, 2, 2)
        assert (profile.min_pixels, profile.max_pixels) == (65536, 16777216)
        assert profile.image_mean == profile.image_std == (0.5, 0.5, 0.5)
        assert profile.video.family() == get_profile("qwen3-vl").video.family()
        assert family_of(profile) == "qwen_vl" and profile.default_tokenizer == "qwen3.5-standin"
    assert get_profile("qwen3.5-moe").proof().model_class == "Qwen3_5MoeForConditionalGeneration"


# ---- counts: every COCO-mini image and odd sizes ------------------------------------------------------------


@pytest.mark.slow
def test_every_coco_image_matches_the_image_processor() -> None:
    """Every COCO-mini image's header-only grid and count equal the processor's (run on one decoded image per
    size: the grid depends on the size alone)."""
    processor = _image_processor()
    for name in ("qwen3.5", "qwen3.5-moe"):
        profile = get_profile(name)
        by_size: dict[tuple[int, int], list[ImageRef]] = {}
        for p in IMAGE_FILES:
            ref = ImageRef(path=str(p))
            by_size.setdefault(profile.image.plan(ref), []).append(ref)
        sizes = list(by_size)
        decoded = [Image.open(by_size[s][0].path).convert("RGB") for s in sizes]
        out = processor(images=decoded, return_tensors="np", do_rescale=False, do_normalize=False)
        for (w, h), grid in zip(sizes, out["image_grid_thw"].tolist(), strict=True):
            for ref in by_size[(w, h)]:
                assert profile.image.grid_thw(*profile.image.plan(ref)) == tuple(grid)
            assert profile.image.num_tokens(w, h) == grid[0] * grid[1] * grid[2] // 4
    assert len(IMAGE_FILES) > 200


@pytest.mark.parametrize("size", [(1, 1), (31, 33), (32, 32), (255, 257), (640, 480), (1000, 5), (5, 999),
                                  (4096, 4096), (4097, 4095), (6000, 4000), (8000, 45), (300, 60000)])
def test_odd_sizes_match_the_image_processor(size) -> None:
    w, h = size
    processor = _image_processor()
    profile = get_profile("qwen3.5")
    if max(w, h) / min(w, h) > 200:
        with pytest.raises(RecordError, match="aspect ratio"):
            profile.image.grid_thw(w, h)
        return
    t, gh, gw = profile.image.grid_thw(w, h)
    assert processor.get_number_of_image_patches(h, w, {}) == t * gh * gw
    if w * h <= 1_000_000:  # a real processor run where it is cheap
        out = processor(images=[Image.new("RGB", (w, h))], return_tensors="np", do_rescale=False, do_normalize=False)
        assert out["image_grid_thw"].tolist() == [[t, gh, gw]]


def test_pixel_values_match_the_image_processor() -> None:
    profile = get_profile("qwen3.5")
    refs = [ImageRef(path=str(p)) for p in IMAGE_FILES[:2]]
    out = profile.reader().pixel_values(refs)
    expected = _image_processor()(images=[Image.open(r.path).convert("RGB") for r in refs], return_tensors="pt")
    assert out["image_grid_thw"].tolist() == expected["image_grid_thw"].tolist()
    assert torch.equal(out["pixel_values"], expected["pixel_values"])


# ---- a build with images and videos in trees --------------------------------------------------------------


@pytest.fixture(scope="module")
def rows(tmp_path_factory, coco_images):
    root = tmp_path_factory.mktemp("qwen35")
    write_clip(root / "a.mp4", fps=25, frames=60, width=160, height=120)  # 2.4 s: 4 frames -> 2 patches
    write_clip(root / "b.mp4", fps=Fraction(30000, 1001), frames=45, width=98, height=130)
    for i, name in enumerate(("c.jpg", "d.jpg")):
        (root / name).write_bytes(coco_images[i].read_bytes())
    video = lambda name, **kw: {"type": "video", "video": name, **VIDEO_SMALL, **kw}  # noqa: E731
    image = lambda name: {"type": "image", "image": name}  # noqa: E731
    records = [
        {"messages": [{"role": "user", "content": [image("c.jpg"), {"type": "text", "text": "Describe it."}]},
                      {"role": "assistant", "content": "A photograph."}]},
        {"messages": [{"role": "user", "content": [video("a.mp4"), {"type": "text", "text": "What happens?"}]},
                      {"role": "assistant", "content": "The grey changes."}]},
        # an image, a clip and another image in one turn
        {"messages": [{"role": "user", "content": [image("d.jpg"), video("a.mp4", fps=1), {"type": "text", "text": "vs"},
                                                   image("c.jpg")]},
                      {"role": "assistant", "content": "Not the same."}]},
        # a video QA tree: one clip, several branches, one nested
        {"messages": [{"role": "user", "content": [{"type": "text", "text": "Watch "}, video("b.mp4", fps=4)]}],
         "branches": [[{"role": "assistant", "content": "One."}],
                      [{"role": "assistant", "content": "Two, longer."}],
                      {"messages": [{"role": "assistant", "content": "Grey"}],
                       "branches": [[{"role": "user", "content": "More?"}, {"role": "assistant", "content": "No."}],
                                    [{"role": "user", "content": "And?"}, {"role": "assistant", "content": "Yes."}]]}]},
        # an image tree whose branches bring an image and a video of their own
        {"messages": [{"role": "user", "content": [image("d.jpg"), {"type": "text", "text": "Caption it."}]}],
         "branches": [[{"role": "assistant", "content": "A scene."}],
                      [{"role": "assistant", "content": "Look."},
                       {"role": "user", "content": [image("c.jpg"), {"type": "text", "text": "And this?"}]},
                       {"role": "assistant", "content": "Another."}],
                      [{"role": "assistant", "content": "Now a clip."},
                       {"role": "user", "content": [video("a.mp4")]}, {"role": "assistant", "content": "Grey."}]]},
        {"messages": [{"role": "user", "content": "Hi"}, {"role": "assistant", "content": "Hello"}]},
        {"text": "A plain document with loss on every token."},
    ]
    data = root / "d.jsonl"
    data.write_text("".join(json.dumps(r) + "\n" for r in records))
    config = BuildConfig.from_inputs([str(data)], str(root / "out"), profile="qwen3.5", max_length=256, **SMALL)
    result = build(config, progress=False)
    assert result.manifest["totals"]["rejected"] == 0, (root / "out" / "rejects.jsonl").read_text()
    report = verify_build(root / "out", inputs=[str(data)])
    assert report.ok, report.lines()
    return {"records": records, "rows": list(PackedDataset(root / "out", shuffle=False)), "root": root}


def _examples(rows):
    """(row, example index, token range) of every example, in row order."""
    for row in rows:
        cu = np.asarray(row["cu_seqlens"])
        for k in range(len(cu) - 1):
            yield row, k, (int(cu[k]), int(cu[k + 1]))


class PlannedVideos:
    """The video processor's part of ``Qwen3VLProcessor.__call__`` for the clips the build planned: their
    ``video_grid_thw`` and metadata (fps, sampled frame indices), which ``replace_video_token`` turns into the
    timestamped text. Stands in for ``Qwen3VLVideoProcessor``, which needs torchvision (not installed here);
    the plans' frames and sizes are checked against qwen-vl-utils and that processor in tests/media/test_video.py."""

    merge_size, temporal_patch_size = 2, 2

    def __init__(self, videos: list[dict]):
        self.videos = videos

    def __call__(self, videos, **kwargs):
        assert len(videos) == len(self.videos)
        return {"video_grid_thw": torch.tensor([[v["grid_t"], v["grid_h"], v["grid_w"]] for v in self.videos]),
                "video_metadata": [VideoMetadata(total_num_frames=0, fps=v["video_fps"],
                                                 frames_indices=list(v["frame_indices"])) for v in self.videos]}


def _processor(tok, videos: list[dict], monkeypatch) -> Qwen3VLProcessor:
    """Qwen3.5's processor (``Qwen3VLProcessor``) with the stand-in tokenizer, the image processor as the build
    configured it and ``PlannedVideos`` for its video processor (its class check skipped: without torchvision
    transformers' video processor mapping is a placeholder)."""
    check = ProcessorMixin.check_argument_for_proper_class
    monkeypatch.setattr(ProcessorMixin, "check_argument_for_proper_class",
                        lambda self, name, arg: None if name == "video_processor" else check(self, name, arg))
    return Qwen3VLProcessor(image_processor=_image_processor(**SMALL), tokenizer=tok,
                            video_processor=PlannedVideos(videos), chat_template=tok.chat_template)


def test_input_ids_equal_the_processor(rows, monkeypatch) -> None:
    """Every linear example with images or a video: packer's tokens equal ``Qwen3VLProcessor``'s input_ids on the
    chat template's text, its images (the processor resizing them) and its clip; grids and mm_token_type_ids too."""
    tok = load_tokenizer("qwen3.5-standin")
    checked = 0
    for row, k, (a, b) in _examples(rows["rows"]):
        record = rows["records"][int(row["example_ids"][k].rsplit(":", 1)[1]) - 1]
        images = [im for im in row["images"] if a <= im["offset"] < b]
        videos = [v for v in row["videos"] if a <= v["offset"] < b]
        if "branches" in record or not (images or videos):
            continue
        text = tok.apply_chat_template(record["messages"], tokenize=False)
        pil = [load_image(ImageRef(path=str(rows["root"] / p["image"])))
               for m in record["messages"] if isinstance(m["content"], list) for p in m["content"] if p["type"] == "image"]
        clips = [np.zeros((len(v["frame_indices"]), 4, 4, 3), np.uint8) for v in videos]
        out = _processor(tok, videos, monkeypatch)(text=[text], images=pil or None, videos=clips or None)
        ids = np.asarray(row["input_ids"][a:b])
        assert ids.tolist() == out["input_ids"][0]
        mm = (ids == tok.convert_tokens_to_ids("<|image_pad|>")) + 2 * (ids == tok.convert_tokens_to_ids("<|video_pad|>"))
        assert mm.tolist() == out["mm_token_type_ids"][0]
        if images:
            assert [[im["grid_t"], im["grid_h"], im["grid_w"]] for im in images] == out["image_grid_thw"].tolist()
        checked += 1
    assert checked == 3  # an image, a clip, two images and a clip


def test_positions_equal_get_rope_index_on_every_path(rows) -> None:
    """Each root-to-leaf path's mRoPE rows equal ``Qwen3_5Model.get_rope_index`` on that path alone (its images,
    its videos, the processor's mm_token_type_ids)."""
    torch.manual_seed(0)
    model = Qwen3_5Model(Qwen3_5Config(
        text_config=dict(hidden_size=16, intermediate_size=32, num_hidden_layers=1, num_attention_heads=2,
                         num_key_value_heads=1, head_dim=8, linear_num_key_heads=1, linear_num_value_heads=1,
                         linear_key_head_dim=8, linear_value_head_dim=8, vocab_size=64),
        vision_config=dict(depth=1, hidden_size=16, intermediate_size=16, num_heads=2, out_hidden_size=16,
                           num_position_embeddings=16)))
    tok = load_tokenizer("qwen3.5-standin")
    image_pad, video_pad = tok.convert_tokens_to_ids(["<|image_pad|>", "<|video_pad|>"])
    paths = vision_paths = 0
    for row in rows["rows"]:
        layout = PackedLayout.from_batch(collate([dict(row, load_images=False)]))
        mrope, ids = np.asarray(row["mrope_position_ids"]), np.asarray(row["input_ids"])
        ranges = ce._node_ranges(layout)
        for nodes in ce.leaf_paths(layout):
            tokens = np.concatenate([np.arange(*ranges[n]) for n in nodes])
            on_path = set(tokens.tolist())
            videos, images = ([x for x in row[k] if x["offset"] in on_path] for k in ("videos", "images"))
            grid = lambda items: torch.tensor([[x["grid_t"], x["grid_h"], x["grid_w"]] for x in items]) if items else None  # noqa: E731
            input_ids = torch.tensor(ids[tokens])[None]
            mm = (input_ids == image_pad).int() + 2 * (input_ids == video_pad).int()
            expected, _ = model.get_rope_index(input_ids, mm, image_grid_thw=grid(images), video_grid_thw=grid(videos))
            np.testing.assert_array_equal(mrope[:, tokens], expected[:, 0].numpy(), err_msg=str(nodes))
            paths += 1
            vision_paths += bool(images or videos)
    assert paths == 12 and vision_paths == 10  # 5 linear + the video tree's 4 leaves + the image tree's 3


@pytest.mark.slow
def test_packed_equals_unpacked_with_images_and_video_trees(rows) -> None:
    """A tiny ``Qwen3_5ForConditionalGeneration``: every row packed (the linear layers' state forked at each
    branch, the full layer's tree mask, the vision tower per image and clip) equals each path alone with the
    model's own positions and kernels: per-token losses, total and every gradient."""
    batches, model, ctx = _tiny("qwen3.5", [collate([r]) for r in rows["rows"]], load_tokenizer("qwen3.5-standin"))
    assert type(model).__name__ == "Qwen3_5ForConditionalGeneration"
    assert sum(type(m).__name__ == "Qwen3_5GatedDeltaNet" for m in model.modules()) == 3
    assert len(batches) > 1 and any(len(b["example_ids"]) > 1 for b in batches)
    assert any("pixel_values_videos" in b and (b["node_parents"] >= 0).sum() >= 4 for b in batches)  # video tree
    assert any("pixel_values_videos" in b and "pixel_values" in b for b in batches)
    for batch in batches:
        _check(ce.compare(model, batch, ["sdpa", "sdpa_varlen"], **ctx), ["sdpa", "sdpa_varlen"])


def test_standin_tokenizer_is_qwen3vl_under_its_name() -> None:
    """The stand-in's ids are Qwen3's (qwen3-vl's), not Qwen3.5's: the vision tokens are found by name."""
    standin, qwen3 = load_tokenizer("qwen3.5-standin"), load_tokenizer("qwen3-vl")
    names = ["<|image_pad|>", "<|video_pad|>", "<|vision_start|>", "<|vision_end|>", "<|im_end|>", "<think>"]
    assert standin.convert_tokens_to_ids(names) == qwen3.convert_tokens_to_ids(names) == [
        151655, 151656, 151652, 151653, 151645, 151667]
    assert standin.chat_template == qwen3.chat_template and len(standin) == len(qwen3) == 151669
