"""Video mRoPE (Qwen2-VL, Qwen2.5-VL's time-scaled temporal index) against transformers' own get_rope_index
on every root-to-leaf path of random trees mixing text, images and videos, and verify's loop-free
recomputation (``Positions.expected``) against the encoder's (``Positions.extra``)."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from transformers import Qwen2_5_VLConfig, Qwen2_5_VLModel, Qwen2VLConfig, Qwen2VLModel

from packer.core.tree import tree_position_ids
from packer.core.types import EncodedVideo
from packer.models import get_profile
from tests.models.test_mrope import _TINY_TEXT, _TINY_VISION, IMAGE_PAD, VISION_END, VISION_START, paths

VIDEO_PAD = 151656
TOKEN_IDS = {"image_token": IMAGE_PAD, "video_token": VIDEO_PAD, "vision_start": VISION_START, "vision_end": VISION_END}
# seconds per temporal patch that real clips give: 2 / sample_fps for 2 fps, 29.97 fps sampled at 2, 1 fps, ...
SECONDS = [1.0, 2.0, 0.5, 1.0009999275207520, 2 / 1.4985, 0.8, 2 / 3, 1.3333333333333333]


@pytest.fixture(scope="module")
def models() -> dict[str, torch.nn.Module]:
    """Tiny real models (get_rope_index reads only their configs); Qwen2.5-VL at tokens_per_second 2, the
    released checkpoints' value and the profile's."""
    torch.manual_seed(0)
    qwen2 = Qwen2VLModel(Qwen2VLConfig(text_config=_TINY_TEXT, vision_config=_TINY_VISION))
    qwen25 = Qwen2_5_VLModel(Qwen2_5_VLConfig(
        text_config=_TINY_TEXT, vision_config={**_TINY_VISION, "intermediate_size": 16, "tokens_per_second": 2}
    ))
    assert qwen2.config.video_token_id == qwen25.config.video_token_id == VIDEO_PAD
    return {"qwen2-vl": qwen2, "qwen2.5-vl": qwen25}


def hf_rope(model, ids: list[int], images: list, videos: list, seconds: list[float]) -> np.ndarray:
    """get_rope_index of one unpadded sequence, with the token types the processor gives (image 1, video 2)
    and second_per_grid_ts as the Qwen2.5-VL processor returns them (float32)."""
    input_ids = torch.tensor([ids])
    mm = (input_ids == IMAGE_PAD).int() + 2 * (input_ids == VIDEO_PAD).int()
    kwargs = {
        "image_grid_thw": torch.tensor(images) if images else None,
        "video_grid_thw": torch.tensor(videos) if videos else None,
    }
    if isinstance(model, Qwen2_5_VLModel) and videos:
        kwargs["second_per_grid_ts"] = torch.tensor(seconds, dtype=torch.float32)
    pos, _ = model.get_rope_index(input_ids, mm, **kwargs)
    return pos[:, 0].numpy()


def random_vision_tree(rng: np.random.Generator):
    """(ids, offsets, parents, image grids, videos) of a random tree of text, images and videos; a video in
    the root shared by every branch, some in branches."""
    nodes = []
    for i in range(int(rng.integers(1, 7))):
        parent = -1 if i == 0 else int(rng.integers(0, i))
        node = []
        for _ in range(int(rng.integers(1, 4))):
            r = rng.random()
            if r < 0.3:
                grid = (1, 2 * int(rng.integers(1, 5)), 2 * int(rng.integers(1, 5)))
                node.append(("image", grid, None))
            elif r < 0.6:
                grid = (int(rng.integers(1, 9)), 2 * int(rng.integers(1, 4)), 2 * int(rng.integers(1, 4)))
                node.append(("video", grid, SECONDS[int(rng.integers(0, len(SECONDS)))]))
            else:
                node.append(("text", int(rng.integers(1, 6)), None))
        nodes.append((parent, node))
    ids, offsets, parents, images, videos = [], [], [], [], []
    for parent, node in nodes:
        offsets.append(len(ids))
        parents.append(parent)
        for kind, what, seconds in node:
            if kind == "text":
                ids += [int(x) for x in rng.integers(100, 5000, size=what)]
                continue
            pad = IMAGE_PAD if kind == "image" else VIDEO_PAD
            ids += [VISION_START] + [pad] * (what[0] * what[1] * what[2] // 4) + [VISION_END]
            if kind == "image":
                images.append(what)
            else:
                videos.append(EncodedVideo(
                    source="v.mp4", frames=[], video_start=None, video_end=None, frame_indices=[], video_fps=30.0,
                    grid_thw=what, height=what[1] * 14, width=what[2] * 14, utils_height=what[1] * 14, utils_width=what[2] * 14, offset=len(ids) - 1 - what[0] * what[1] * what[2] // 4,
                    num_tokens=what[0] * what[1] * what[2] // 4, second_per_grid_t=seconds,
                ))
    return np.array(ids), np.array(offsets, np.int32), np.array(parents, np.int32), images, videos


@pytest.mark.parametrize("name", ["qwen2-vl", "qwen2.5-vl"])
def test_video_mrope_matches_get_rope_index_on_every_path(models, name) -> None:
    profile = get_profile(name)
    rng = np.random.default_rng(3)
    for case in range(25):
        ids, offsets, parents, images, videos = random_vision_tree(rng)
        positions = tree_position_ids(len(ids), offsets, parents)
        got = profile.positions.extra(ids, positions, offsets, parents, images, token_ids=TOKEN_IDS, videos=videos)
        ends = np.append(offsets[1:], len(ids))
        for path in paths(parents):
            index = np.concatenate([np.arange(offsets[n], ends[n]) for n in path])
            on_path = set(index.tolist())
            img_offsets = [int(s) for s in np.flatnonzero(np.diff(np.concatenate([[0], ids == IMAGE_PAD])) == 1)]
            path_images = [g for g, s in zip(images, img_offsets, strict=True) if s in on_path]
            path_videos = [v for v in videos if v.offset in on_path]
            want = hf_rope(models[name], ids[index].tolist(), path_images, [v.grid_thw for v in path_videos],
                           [v.second_per_grid_t for v in path_videos])
            np.testing.assert_array_equal(got[:, index], want, err_msg=f"case {case} path {path}")
        # verify's vectorized recomputation agrees
        img_starts = np.flatnonzero(np.diff(np.concatenate([[0], ids == IMAGE_PAD]).astype(int)) == 1)
        again = profile.positions.expected(
            len(ids), offsets, parents, images=dict(offset=img_starts, grid=np.array(images, dtype=np.int64).reshape(-1, 3)),
            videos=dict(offset=np.array([v.offset for v in videos], dtype=np.int64),
                        grid=np.array([v.grid_thw for v in videos], dtype=np.int64).reshape(-1, 3),
                        second_per_grid_t=np.array([v.second_per_grid_t for v in videos])),
            audios=dict(offset=np.zeros(0, np.int64)),
        )
        np.testing.assert_array_equal(again, got, err_msg=f"case {case}")


def test_qwen25_temporal_index_is_scaled_by_time() -> None:
    """One 4-patch video at 1 s per patch: temporal index k * tokens_per_second(2) * 1.0 = 0, 2, 4, 6; Qwen2-VL:
    0, 1, 2, 3; the text after it continues at start + max(h, w) // 2 in both."""
    video = EncodedVideo(source="v.mp4", frames=[], video_start=None, video_end=None, frame_indices=[],
                         video_fps=2.0, grid_thw=(4, 2, 2), height=28, width=28, utils_height=28, utils_width=28, offset=2, num_tokens=4,
                         second_per_grid_t=1.0)
    ids = np.array([7, VISION_START] + [VIDEO_PAD] * 4 + [VISION_END, 8])
    one, root = np.array([0], np.int32), np.array([-1], np.int32)
    rows = {name: get_profile(name).positions.extra(ids, np.arange(8), one, root, [], token_ids=TOKEN_IDS,
                                                    videos=[video])[0].tolist() for name in ("qwen2-vl", "qwen2.5-vl")}
    assert rows == {"qwen2-vl": [0, 1, 2, 3, 4, 5, 3, 4], "qwen2.5-vl": [0, 1, 2, 4, 6, 8, 3, 4]}
