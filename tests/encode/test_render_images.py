"""The render's image planning for a rule that never writes blocks (render.py ``_rewrite_images``: each image its
text has a placeholder for planned once, by ``str.count``) against ``rewrite_images``' find loop, its reference:
on random trees of paths with real, missing and repeated images and any count of placeholders, the same images
planned in the same order, the same error, the texts untouched; and the batch finish plans no image again."""

from __future__ import annotations

import copy

from hypothesis import given, settings
from hypothesis import strategies as st

from packer.core.types import ImageRef, Message
from packer.encode.render import Staged, _rewrite_images
from packer.errors import RecordError
from packer.models import get_profile
from tests.formats.conftest import IMG_A, IMG_B

PROFILE = get_profile("qwen2-vl")
TOKEN = PROFILE.image_token
REFS = [ImageRef(path=str(IMG_A)), ImageRef(path=str(IMG_B)), ImageRef(path=str(IMG_A) + ".missing")]


class _Counted(type(PROFILE.image)):  # type: ignore[misc]
    """The profile's own rule, its plans recorded; ``general`` overrides ``blocks`` (the same None) so that
    ``_rewrite_images`` takes ``rewrite_images``' loop."""

    seen: list[ImageRef] = []

    def plan(self, ref):
        type(self).seen.append(ref)
        return super().plan(ref)


class _General(_Counted):
    def blocks(self, size):
        return super().blocks(size)


def _profile(cls):
    """A copy of the profile whose image rule is a copy of its own, of class ``cls``."""
    rule = copy.copy(PROFILE.image)
    object.__setattr__(rule, "__class__", cls)  # a frozen dataclass
    cls.seen = []
    profile = copy.copy(PROFILE)
    object.__setattr__(profile, "image", rule)
    return profile, rule


@settings(max_examples=200, deadline=None)
@given(root=st.lists(st.sampled_from([0, 1, 2, -1]), max_size=3),
       children=st.lists(st.lists(st.sampled_from([0, 1, 2, -1]), max_size=3), max_size=3),
       tokens=st.lists(st.integers(0, 5), min_size=4, max_size=4))
def test_planned_once_as_the_find_loop_plans(root, children, tokens):
    shared = [REFS[k] for k in (0, 1, 2)]  # a tree's paths share their root's ImageRef objects
    root_msg = Message("user", [shared[k] if k >= 0 else "x" for k in root] or ["x"])
    paths = [[root_msg]] + [[root_msg, Message("user", [ImageRef(path=REFS[k].path) if k >= 0 else "y" for k in c] or ["y"])]
                            for c in children]
    texts = [f"a{TOKEN}b" * tokens[k % 4] for k in range(len(paths))]
    out = []
    for cls in (_Counted, _General):
        profile, rule = _profile(cls)
        staged = Staged(texts=list(texts), nodes=[], parents=[], spans=[[] for _ in paths])
        try:
            _rewrite_images(staged, paths, profile)
            err = None
        except RecordError as e:
            err = (e.reason, e.message)
        planned = list(dict.fromkeys(id(r) for r in rule.seen))  # the general loop plans a shared image per path
        out.append((planned, err, staged.texts, cls.seen))
    fast, general = out
    assert fast[:3] == general[:3]
    assert len(fast[3]) == len({id(r) for r in fast[3]})  # each image planned once
