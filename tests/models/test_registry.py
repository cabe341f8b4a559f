"""The profile registry: names, overrides and their errors, and an import that stays light."""

from __future__ import annotations

import json
import re
import subprocess
import sys

import numpy as np
import pytest

from packer.core.types import ImageRef
from packer.errors import ConfigError
from packer.models import builtin_tokenizers, forward_keys, get_profile, profile_names, register_profile
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


def _fresh(code: str) -> str:
    return subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, check=True).stdout


def test_profile_families_name_every_family_profile() -> None:
    """``FAMILIES``' line of each family (what lets a profile's name import its family alone) lists its
    ``PROFILES``, in order: a family imported directly, in a fresh process, registers nothing else."""
    code = ("import importlib, json\nfrom packer.models import FAMILIES, PROFILE_FAMILIES\n"
            "pairs = [(p.name, f) for f in FAMILIES for p in importlib.import_module(f'packer.models.{f}').PROFILES]\n"
            "print(json.dumps([pairs, list(PROFILE_FAMILIES.items())]))")
    pairs, table = json.loads(_fresh(code))
    assert table == pairs


def test_a_profile_imports_its_own_family_only() -> None:
    """``get_profile(name)`` and a config naming it import that family; listing (``profile_names``, the builtin
    tokenizers) imports the rest, in the order an eager import of every family gave."""
    code = ("import json, sys\nimport packer.models as m\nfrom packer.config import BuildConfig\n"
            "fams = lambda: sorted({k.split('.')[2] for k in sys.modules if k.count('.') == 2 and "
            "k.startswith('packer.models.') and k.split('.')[2] in m.FAMILIES})\n"
            "before = fams()\nm.get_profile('text', image_token=None)\n"
            "BuildConfig.from_inputs(['x.jsonl'], 'out', profile='text')\none = fams()\n"
            "names, tokenizers = m.profile_names(), m.builtin_tokenizers()\n"
            "print(json.dumps([before, one, fams(), names, tokenizers]))")
    before, one, every, names, tokenizers = json.loads(_fresh(code))
    assert before == [] and one == ["text"] and len(every) == len(_families())
    assert tuple(names) == profile_names() and tuple(tokenizers) == builtin_tokenizers()


def _families() -> tuple[str, ...]:
    from packer.models import FAMILIES

    return FAMILIES


def test_family_tokenizers_name_every_family_tokenizer() -> None:
    """``FAMILY_TOKENIZERS``' line of each family (what lets a builtin tokenizer's name import its family alone)
    lists its ``TOKENIZERS``, in order, and no family without one has a line: each family imported directly, in a
    fresh process."""
    code = ("import importlib, json\nfrom packer.models import FAMILIES, FAMILY_TOKENIZERS, TOKENIZER_FAMILIES\n"
            "lines = {f: [s.name for s in getattr(importlib.import_module(f'packer.models.{f}'), 'TOKENIZERS', ())]"
            " for f in FAMILIES}\n"
            "print(json.dumps([{f: n for f, n in lines.items() if n}, {f: list(n) for f, n in FAMILY_TOKENIZERS.items()},"
            " list(TOKENIZER_FAMILIES.items()), list(FAMILIES)]))")
    lines, table, pairs, families = json.loads(_fresh(code))
    assert table == lines and list(table) == [f for f in families if f in table]  # FAMILIES order
    assert pairs == [[n, f] for f, names in lines.items() for n in names]


def test_a_tokenizer_imports_its_own_family_only() -> None:
    """A builtin tokenizer's spec and directory (what a build's start asks for its kept encoder's key) import its
    family alone; the names need none; an unknown name lists every builtin."""
    code = ("import json, sys\nimport packer.models as m\nfrom packer.models.registry import tokenizer_spec\n"
            "from packer.pipeline.output import tokenizer_source\n"
            "fams = lambda: sorted({k.split('.')[2] for k in sys.modules if k.count('.') == 2 and "
            "k.startswith('packer.models.') and k.split('.')[2] in m.FAMILIES})\n"
            "names = m.builtin_tokenizers()\nnone = fams()\n"
            "spec = tokenizer_spec('llama3').name\ntokenizer_source('llama3')\none = fams()\n"
            "print(json.dumps([names, none, spec, one]))")
    names, none, spec, one = json.loads(_fresh(code))
    assert tuple(names) == builtin_tokenizers() and none == [] and spec == "llama3" and one == ["text"]
    from packer.models.registry import tokenizer_spec

    with pytest.raises(ConfigError, match=f"unknown builtin tokenizer 'gpt-5'; builtins: {', '.join(names)}$"):
        tokenizer_spec("gpt-5")


def test_a_family_whose_tokenizers_differ_from_its_line_is_refused(monkeypatch: pytest.MonkeyPatch) -> None:
    import packer.models.registry as registry
    from packer.models import text

    monkeypatch.setattr(registry, "_BUILTIN_TOKENIZERS", {**registry._BUILTIN_TOKENIZERS, "llama3": "gemma3"})
    with pytest.raises(ConfigError, match=r"family text's TOKENIZERS \['llama3'\] are not its line"):
        registry._register_builtin("text", text)
