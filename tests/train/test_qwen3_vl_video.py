"""Qwen3-VL video end to end: the timestamped expansion against transformers' own ``Qwen3VLProcessor``, the
positions against ``Qwen3VLModel.get_rope_index`` on every root-to-leaf path, ``packer verify``, and packed ==
unpacked with videos (a clip under several QA branches) on the real tiny ``Qwen3VLForConditionalGeneration``.

Clips are written with PyAV (tests/media/make_videos.py); frames and sizes come from the build's header-only
plans, which tests/media/test_video.py checks against qwen-vl-utils and the HF video processors.
"""

from __future__ import annotations

import json
import re
import shutil
from fractions import Fraction
from functools import partial
from types import SimpleNamespace

import numpy as np
import pytest
import torch
from transformers.models.qwen3_vl.processing_qwen3_vl import Qwen3VLProcessor
from transformers.video_utils import VideoMetadata

from packer.config import BuildConfig
from packer.encode.tokenizers import load_tokenizer
from packer.pipeline.build import build
from packer.report.verify import verify_build
from packer.train.attention.layout import PackedLayout
from packer.train.data.collate import collate
from packer.train.data.dataset import PackedDataset
from tests.media.make_videos import write_clip
from tests.train.test_equivalence import _check, _tiny, ce

VIDEO_PAD, IMAGE_PAD = 151656, 151655
SMALL = {"min_pixels": 32 * 32 * 4, "max_pixels": 32 * 32 * 12}  # qwen-vl-utils' per-part bounds: small frames


@pytest.fixture(scope="module")
def clips(tmp_path_factory, coco_images):
    root = tmp_path_factory.mktemp("q3video")
    write_clip(root / "a.mp4", fps=25, frames=60, width=160, height=120)  # 2.4 s: 4 frames -> 2 patches
    write_clip(root / "b.mp4", fps=Fraction(30000, 1001), frames=45, width=98, height=130)  # 29.97 fps
    (root / "c.jpg").write_bytes(coco_images[0].read_bytes())
    video = lambda name, **kw: {"type": "video", "video": name, **SMALL, **kw}  # noqa: E731
    records = [
        {"messages": [{"role": "user", "content": [video("a.mp4"), {"type": "text", "text": "What happens?"}]},
                      {"role": "assistant", "content": "The grey changes."}]},
        # one clip, several QA branches (a video message tree), 4 fps over 1.5 s -> 6 frames -> 3 patches
        {"messages": [{"role": "user", "content": [{"type": "text", "text": "Watch "}, video("b.mp4", fps=4)]}],
         "branches": [[{"role": "assistant", "content": "One."}],
                      [{"role": "assistant", "content": "Two, longer."}],
                      {"messages": [{"role": "assistant", "content": "Grey"}],
                       "branches": [[{"role": "user", "content": "More?"}, {"role": "assistant", "content": "No."}],
                                    [{"role": "user", "content": "And?"}, {"role": "assistant", "content": "Yes."}]]}]},
        # a video and an image in one turn
        {"messages": [{"role": "user", "content": [{"type": "image", "image": "c.jpg"}, video("a.mp4", fps=1),
                                                   {"type": "text", "text": "Same?"}]},
                      {"role": "assistant", "content": "No."}]},
        {"messages": [{"role": "user", "content": "Hi"}, {"role": "assistant", "content": "Hello"}]},
    ]
    data = root / "d.jsonl"
    data.write_text("".join(json.dumps(r) + "\n" for r in records))
    config = BuildConfig.from_inputs([str(data)], str(root / "out"), profile="qwen3-vl", max_length=2048,
                                     min_pixels=32 * 32 * 4, max_pixels=32 * 32 * 16)
    build(config, progress=False)
    return {"records": records, "rows": list(PackedDataset(root / "out", shuffle=False)), "out": root / "out",
            "data": data}


def _examples(rows):
    """(row, example index, token range) of every example, in row order."""
    for row in rows:
        cu = np.asarray(row["cu_seqlens"])
        for k in range(len(cu) - 1):
            yield row, k, (int(cu[k]), int(cu[k + 1]))


def _hf_text(tok, record: dict, videos: list[dict], images: list[dict]) -> str:
    """transformers 5.23.0: apply the chat template, then replace each <|image_pad|> / <|video_pad|> in order
    (the regex of ``ProcessorMixin._replace_special_mm_tokens``) with ``replace_image_token`` /
    ``Qwen3VLProcessor.replace_video_token``'s text."""
    text = tok.apply_chat_template(record["messages"], tokenize=False)
    fake = SimpleNamespace(video_processor=SimpleNamespace(merge_size=2, temporal_patch_size=2),
                           image_processor=SimpleNamespace(merge_size=2), image_token="<|image_pad|>",
                           vision_start_token="<|vision_start|>", vision_end_token="<|vision_end|>",
                           video_token="<|video_pad|>")
    fake._calculate_timestamps = partial(Qwen3VLProcessor._calculate_timestamps, fake)
    grid = lambda items: torch.tensor([[x["grid_t"], x["grid_h"], x["grid_w"]] for x in items])  # noqa: E731
    video_inputs = {"video_grid_thw": grid(videos) if videos else None,
                    "video_metadata": [VideoMetadata(total_num_frames=0, fps=v["video_fps"],
                                                     frames_indices=list(v["frame_indices"])) for v in videos]}
    image_inputs = {"image_grid_thw": grid(images) if images else None}
    replacements = {
        "image": iter([Qwen3VLProcessor.replace_image_token(fake, image_inputs, i) for i in range(len(images))]),
        "video": iter([Qwen3VLProcessor.replace_video_token(fake, video_inputs, i) for i in range(len(videos))]),
    }
    pattern = re.compile(r"(?P<image><\|image_pad\|>)|(?P<video><\|video_pad\|>)")
    return pattern.sub(lambda m: next(replacements[m.lastgroup]), text)


@pytest.mark.slow
def test_expansion_matches_qwen3vl_processor(clips) -> None:
    """Linear examples: packer's tokens equal the tokenizer run on transformers' expanded text."""
    tok = load_tokenizer("qwen3-vl")
    checked = 0
    for row, k, (a, b) in _examples(clips["rows"]):
        ids = np.asarray(row["input_ids"][a:b])
        videos = [v for v in row["videos"] if a <= v["offset"] < b]
        images = [im for im in row["images"] if a <= im["offset"] < b]
        record = clips["records"][int(row["example_ids"][k].rsplit(":", 1)[1]) - 1]  # "d.jsonl:3" -> line 3
        if not videos or "branches" in record:
            continue
        expected = tok(_hf_text(tok, record, videos, images), add_special_tokens=False).input_ids
        assert ids.tolist() == expected
        checked += 1
    assert checked == 2


def _rope(model, ids: np.ndarray, videos: list[dict], images: list[dict]) -> np.ndarray:
    input_ids = torch.tensor(ids)[None]  # (1, L)
    mm = (input_ids == IMAGE_PAD).int() + 2 * (input_ids == VIDEO_PAD).int()  # create_mm_token_type_ids
    vgrid = torch.tensor([[v["grid_t"], v["grid_h"], v["grid_w"]] for v in videos]) if videos else None
    igrid = torch.tensor([[i["grid_t"], i["grid_h"], i["grid_w"]] for i in images]) if images else None
    pos, _ = model.get_rope_index(input_ids, mm, image_grid_thw=igrid, video_grid_thw=vgrid)
    return pos[:, 0].numpy()


@pytest.mark.slow
def test_positions_match_get_rope_index_on_every_path(clips) -> None:
    from transformers import Qwen3VLConfig, Qwen3VLModel

    torch.manual_seed(0)
    model = Qwen3VLModel(Qwen3VLConfig(
        text_config=dict(hidden_size=16, intermediate_size=32, num_hidden_layers=1, num_attention_heads=2,
                         num_key_value_heads=1, head_dim=8,
                         rope_parameters={"rope_type": "default", "rope_theta": 5e6, "mrope_section": [2, 1, 1],
                                          "mrope_interleaved": True}),
        vision_config=dict(depth=1, hidden_size=16, intermediate_size=16, num_heads=2, out_hidden_size=16,
                           num_position_embeddings=16, deepstack_visual_indexes=[0])))
    paths = 0
    for row in clips["rows"]:
        batch = collate([dict(row, load_images=False)])
        layout = PackedLayout.from_batch(batch)
        mrope = np.asarray(row["mrope_position_ids"])
        ids = np.asarray(row["input_ids"])
        for nodes in ce.leaf_paths(layout):
            tokens = np.concatenate([np.arange(*r) for r in [ce._node_ranges(layout)[n] for n in nodes]])
            on_path = set(tokens.tolist())
            videos, images = ([x for x in row[k] if x["offset"] in on_path] for k in ("videos", "images"))
            expected = _rope(model, ids[tokens], videos, images)
            np.testing.assert_array_equal(mrope[:, tokens], expected, err_msg=str(nodes))
            paths += 1
    assert paths == 7  # 3 linear examples + the video tree's 4 leaves


def test_verify_accepts_the_build_and_catches_faults(clips, tmp_path) -> None:
    from tests.report.test_verify import _mutate

    report = verify_build(clips["out"], inputs=[str(clips["data"])])
    assert not report.violations and report.examples == 4, report.violations[:3]

    def second_patch(row: dict) -> int:  # a token of the tree video's second temporal patch
        v = next(v for v in row["videos"] if v["grid_t"] == 3)
        runs = np.flatnonzero(np.diff(np.concatenate([[0], np.asarray(row["input_ids"]) == VIDEO_PAD, [0]])) == 1)
        return int(runs[runs >= v["offset"]][1])

    def shift_position(row: dict) -> None:
        row["mrope_position_ids"][3 * second_patch(row) + 1] += 1  # token-major (t, h, w): its h position

    def drop_video_token(row: dict) -> None:
        row["input_ids"][second_patch(row)] = 0

    def miscount(row: dict) -> None:
        row["videos"][0]["num_tokens"] += 1

    for change, check in ((shift_position, "mrope_position_ids"), (drop_video_token, "video"), (miscount, "video")):
        out = tmp_path / change.__name__
        shutil.copytree(clips["out"], out)
        _mutate(out, lambda row: any(v["grid_t"] == 3 for v in row["videos"]), change)
        report = verify_build(out)
        assert any(check in c for _, c in report.counts), (change.__name__, report.counts)


def test_packed_equals_unpacked_with_video_trees(clips) -> None:
    batches, model, ctx = _tiny("qwen3-vl", [collate([r]) for r in clips["rows"]], load_tokenizer("qwen3-vl"))
    assert any("pixel_values_videos" in b and (b["node_parents"] >= 0).sum() >= 4 for b in batches)
    for batch in batches:
        _check(ce.compare(model, batch, ["sdpa", "sdpa_varlen"], **ctx), ["sdpa", "sdpa_varlen"])
