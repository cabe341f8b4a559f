"""train/ was one flat folder; it is cut by concern (data/, attention/, trainers/). Every old module path still
imports, as the moved module itself, and the string options are checked in one place."""

from __future__ import annotations

import importlib
import json
import subprocess
import sys
from pathlib import Path

import pytest

from packer.errors import ConfigError
from packer.train import MOVED
from packer.train.options import Backend, Loss, Prefix, Reduction, Weighting, check, choices

REPO = Path(__file__).resolve().parents[2]


@pytest.mark.parametrize("old", sorted(MOVED))
def test_old_path_is_the_moved_module(old):
    moved = importlib.import_module(MOVED[old])
    assert importlib.import_module(old) is moved
    assert sys.modules[old] is moved and moved.__name__ == MOVED[old]
    parent, _, leaf = old.rpartition(".")
    assert getattr(importlib.import_module(parent), leaf) is moved  # `import packer.train.loss as m` works too
    assert (REPO / (MOVED[old].replace(".", "/") + ".py")).is_file()
    assert not (REPO / (old.replace(".", "/") + ".py")).exists()  # an alias, not a second file


def test_old_public_names_import_from_their_old_paths():
    # the old backends module is the attention package now
    from packer.train.attention import BACKENDS, packed_attention
    from packer.train.attention.backends import packed_attention as moved
    from packer.train.balance import deal
    from packer.train.data.rank_shares import deal as dealt
    from packer.train.hf import LAYOUT_KWARG, use_packed_attention
    from packer.train.loss import WEIGHTINGS, packed_cross_entropy

    assert packed_attention is moved and deal is dealt and BACKENDS == choices(Backend)[1:]
    assert LAYOUT_KWARG == "packer_layout" and WEIGHTINGS == choices(Weighting)
    assert use_packed_attention.__module__ == "packer.train.attention.hf"
    assert packed_cross_entropy.__module__ == "packer.train.trainers.loss"
    with pytest.raises(ImportError):
        importlib.import_module("packer.train.no_such_module")
    with pytest.raises(AttributeError, match="no attribute 'nope'"):
        importlib.import_module("packer.train.attention").nope  # noqa: B018


@pytest.mark.slow
def test_trainer_paths_of_the_docs_import():
    """The trainers as docs and users import them (a subprocess: a clean sys.modules)."""
    code = ("from packer.train.trl import PackedSFTTrainer, PackedDPOTrainer\n"
            "from packer.train.trainer import PackedTrainer, PackedCollator\n"
            "import packer.train.trainers.trl as t, packer.train.trainers.trainer as u\n"
            "assert PackedSFTTrainer is t.PackedSFTTrainer and PackedTrainer is u.PackedTrainer\n")
    subprocess.run([sys.executable, "-c", code], cwd=REPO, check=True)


def test_import_packer_train_is_light():
    probe = ("import packer.train, packer.train.options, packer.train.keys, packer.train.attention, "
             "packer.train.data, packer.train.trainers, sys, json\n"
             "print(json.dumps([m in sys.modules for m in ('torch', 'transformers', 'trl')]))")
    out = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, cwd=REPO, check=True)
    assert json.loads(out.stdout.strip().splitlines()[-1]) == [False, False, False]


@pytest.mark.parametrize(("name", "option", "value"), [
    ("backend", Backend, "fast"), ("loss", Loss, "mine"), ("weighting", Weighting, "sqrtt"),
    ("prefix", Prefix, "all"), ("reduction", Reduction, "avg"), ("weighting", Weighting, None),
])
def test_an_option_outside_its_values_names_them(name, option, value):
    allowed = ", ".join(repr(v) for v in choices(option))
    with pytest.raises(ConfigError, match=f"^'{name}' must be one of {allowed}; got {value!r}$"):
        check(name, value, option)
    for ok in choices(option):
        assert check(name, ok, option) == ok


def test_entry_points_check_their_options():
    import torch

    from packer.train.attention.hf import implementation_name
    from packer.train.trainers.loss import packed_cross_entropy

    with pytest.raises(ConfigError, match="'backend' must be one of"):
        implementation_name("flash2")
    layout = {"cu_seqlens": torch.tensor([0, 2], dtype=torch.int32)}
    with pytest.raises(ConfigError, match="'prefix' must be one of 'once', 'path'; got 'paths'"):
        packed_cross_entropy(torch.zeros(2, 3), torch.tensor([-100, 1]), layout, prefix="paths")
