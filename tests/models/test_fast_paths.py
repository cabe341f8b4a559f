"""Models' fast code against slow references (moved from the encode tests with the code they check).

- ``mrope_position_ids`` (cached image grids, int32 throughout) equals a per-token loop written from
  get_rope_index's rules.
- The image-size cache answers like a fresh header read and notices a rewritten file.
"""

from __future__ import annotations

import shutil

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from PIL import Image

from packer.core.tree import mrope_position_ids
from packer.core.types import ImageRef
from packer.errors import RecordError
from packer.models.vision import get_profile, read_image_size

IMAGE_PAD = 151655

def mrope_reference(ids, offsets, parents, grids, image_token_id, merge) -> np.ndarray:
    """get_rope_index's rules token by token: text +1 on all rows; an image's (t, h, w) grid from current_pos,
    then current_pos += max(h, w) // merge; a node continues from its parent's final current_pos."""
    length = len(ids)
    ends = [*offsets[1:], length]
    out = np.zeros((3, length), dtype=np.int64)
    after: dict[int, int] = {}
    k = 0
    for n in range(len(offsets)):
        cur = 0 if parents[n] < 0 else after[parents[n]]
        i = offsets[n]
        while i < ends[n]:
            if ids[i] == image_token_id:
                t, h, w = grids[k]
                k += 1
                for ti in range(t):
                    for hi in range(h // merge):
                        for wi in range(w // merge):
                            out[:, i] = (cur + ti, cur + hi, cur + wi)
                            i += 1
                cur += max(h, w) // merge
            else:
                out[:, i] = cur
                cur += 1
                i += 1
        after[n] = cur
    return out


@settings(max_examples=200, deadline=None, derandomize=True, database=None)
@given(data=st.data(), merge=st.sampled_from([1, 2]))
def test_mrope_equals_per_token_reference(data, merge):
    n_nodes = data.draw(st.integers(1, 6))
    parents = [-1] + [data.draw(st.integers(0, i - 1)) for i in range(1, n_nodes)]
    ids: list[int] = []
    offsets: list[int] = []
    grids: list[tuple[int, int, int]] = []
    for _ in range(n_nodes):
        offsets.append(len(ids))
        for _ in range(data.draw(st.integers(0, 3))):
            if data.draw(st.booleans()):
                t, h, w = data.draw(st.integers(1, 2)), merge * data.draw(st.integers(1, 4)), merge * data.draw(st.integers(1, 4))
                grids.append((t, h, w))
                ids += [IMAGE_PAD] * (t * h * w // merge**2)
                ids.append(7)  # an image run ends at a text token
            else:
                ids += data.draw(st.lists(st.integers(0, 1000), min_size=1, max_size=5))
    got = mrope_position_ids(np.array(ids, dtype=np.int32), np.array(offsets), np.array(parents), grids,
                             image_token_id=IMAGE_PAD, spatial_merge_size=merge)
    want = mrope_reference(ids, offsets, parents, grids, IMAGE_PAD, merge)
    assert got.dtype == np.int32 and got.shape == (3, len(ids))
    np.testing.assert_array_equal(got, want)


def test_image_size_cache_sees_rewrites(coco_images, tmp_path):
    profile = get_profile("qwen2-vl")
    path = tmp_path / "x.jpg"
    shutil.copy(coco_images[0], path)
    ref = ImageRef(path=str(path))
    first = profile.image_size(ref)
    assert first == read_image_size(ref) == Image.open(coco_images[0]).size
    assert profile.image_size(ref) == first  # cached
    Image.open(coco_images[0]).resize((33, 21)).save(path)  # a new file at the same path
    assert profile.image_size(ref) == (33, 21)
    path.write_bytes(path.read_bytes()[:100])  # truncated: an error every time, never a cached size
    for _ in range(2):
        with pytest.raises(RecordError, match="bad_image"):
            profile.image_size(ref)
    path.unlink()
    with pytest.raises(RecordError, match="missing_image"):
        profile.image_size(ref)
