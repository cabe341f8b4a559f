"""The profile registry: names, overrides and their errors, and an import that stays light."""

from __future__ import annotations

import re
import subprocess
import sys

import numpy as np
import pytest

from packer.core.types import ImageRef
from packer.errors import ConfigError
from packer.models import forward_keys, get_profile, profile_names, register_profile
from packer.models.base import Media
from packer.models.text import TextProfile
from tests.conftest import REPO


def test_get_profile() -> None:
    names = profile_names()  # registration order: the CLI's choices and every error's list
    assert names[0] == "qwen2-vl" and len(set(names)) == len(names)
    assert all(get_profile(n).name == n for n in names)
    assert get_profile("qwen2-vl") is get_profile("qwen2-vl")
    assert get_profile("qwen2-vl", min_pixels=None, max_pixels=None) is get_profile("qwen2-vl")
    p = get_profile("qwen2-vl", max_pixels=256 * 28 * 28)
    assert (p.min_pixels, p.max_pixels) == (56 * 56, 256 * 28 * 28)
    assert p.reader().image_processor().size["longest_edge"] == 256 * 28 * 28
    assert p.image.num_tokens(640, 480) <= 256
    with pytest.raises(ConfigError, match=f"unknown profile 'gpt-5'; known profiles: {', '.join(names)}$"):
        get_profile("gpt-5")
    with pytest.raises(ConfigError, match="min_pixels"):
        get_profile("qwen2-vl", min_pixels=100, max_pixels=10)
    dynamic = [n for n in names if "max_pixels" in get_profile(n).overridable]
    assert dynamic[:3] == ["qwen2-vl", "qwen2.5-vl", "qwen3-vl"] and "llava" not in dynamic
    with pytest.raises(ConfigError, match=re.escape(f"['max_pixels'] only apply to profiles {', '.join(dynamic)}, "
                                                    f"not 'llava'; 'llava' takes: image_token, bidirectional_images, "
                                                    "default_tokenizer")):
        get_profile("llava", max_pixels=1000)
    with pytest.raises(ConfigError, match="only apply to profiles qwen2-vl"):
        get_profile("text", min_pixels=1000)
    known = list(dict.fromkeys(k for n in names for k in get_profile(n).overridable))  # every family's knobs
    with pytest.raises(ConfigError, match=re.escape(f"cannot override ['warp_factor'] of profile 'qwen2-vl'; "
                                                    f"overridable: {', '.join(known)}")):
        get_profile("qwen2-vl", warp_factor=16)
    assert get_profile("llava", image_token="<image>").image_token == "<image>"
    text = get_profile("text")
    assert text.image_token is None and not text.positions.mrope
    vision = [n for n in names if get_profile(n).image is not None]
    assert "text" not in vision and {"qwen2-vl", "llava"} <= set(vision)
    assert text.image is None and text.video is None and text.audio is None
    with pytest.raises(ConfigError, match=re.escape(f"profile 'text' has no vision encoder; use "
                                                    f"{', '.join(vision[:-1])} or {vision[-1]}")):
        text.media_runs([Media(ImageRef(path="x.png"), 0)], np.array([-1]))


def test_a_name_is_registered_once() -> None:
    with pytest.raises(ConfigError, match="already registered"):
        register_profile(TextProfile(name="text"))


def test_forward_keys_are_the_families_union() -> None:
    union = tuple(dict.fromkeys(k for n in profile_names() for k in get_profile(n).forward_keys))
    assert forward_keys() == union
    assert forward_keys()[:7] == (
        "input_ids", "position_ids", "pixel_values", "image_grid_thw", "pixel_values_videos", "video_grid_thw",
        "second_per_grid_ts",
    )  # the first family's (qwen2-vl), in its order
    assert {"image_sizes", "batch_num_images", "image_token_pooling", "mm_token_type_ids"} <= set(forward_keys())


def test_import_needs_no_torch_or_transformers() -> None:
    """The CLI reads profile_names() for its choices: importing the registry must stay cheap."""
    code = ("import sys, packer.models as m; m.profile_names(); m.get_profile('qwen2-vl').image.num_tokens(640, 480); "
            "print(sorted(k for k in ('torch', 'transformers') if k in sys.modules))")
    out = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"
