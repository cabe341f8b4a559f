"""Family settings from the command line and YAML (``--profile-option KEY=VALUE``, ``profile_options:``): InternVL
with ``max_tiles=6`` counts what transformers 5.23's ``GotOcr2ImageProcessorPil(max_patches=6)`` tiles, and the
reader, from the manifest alone, gives the processor's pixel values for those tiles."""

from __future__ import annotations

import io
import json
from pathlib import Path

import numpy as np
import pytest
import torch
import transformers
import yaml
from click.testing import CliRunner
from PIL import Image

from packer.cli import cli
from packer.config import BuildConfig, parse_profile_options
from packer.core.types import ImageRef
from packer.errors import ConfigError
from packer.media.images import load_image
from packer.shards.io import open_shards
from packer.train.collate import collate
from packer.train.dataset import PackedDataset

SIZES = [(2000, 100), (100, 900), (896, 672), (300, 200)]  # 12x1, 1x9, 4x3, 3x2 tiles at max 12; 6x1, 1x6, 3x2, 3x2 at 6


def _png(w: int, h: int, seed: int) -> bytes:
    buf = io.BytesIO()
    Image.fromarray(np.random.default_rng(seed).integers(0, 256, (h, w, 3), dtype=np.uint8)).save(buf, format="PNG")
    return buf.getvalue()


def test_parse_profile_options_reads_values_as_yaml_would() -> None:
    got = parse_profile_options(["max_tiles=6", "do_pan_and_scan=True", "ratio=1.5", "image_token=<image>"])
    assert got == {"max_tiles": 6, "do_pan_and_scan": True, "ratio": 1.5, "image_token": "<image>"}
    with pytest.raises(ConfigError, match="KEY=VALUE"):
        parse_profile_options(["max_tiles"])


def test_bad_profile_options_name_the_allowed_keys() -> None:
    base = {"inputs": ["a.jsonl"], "output": "o", "profile": "internvl"}
    with pytest.raises(ConfigError, match=r"no setting \['max_tile'\]; it takes min_tiles, max_tiles"):
        BuildConfig.from_dict({**base, "profile_options": {"max_tile": 6}})
    with pytest.raises(ConfigError, match="'max_tiles' of profile 'internvl' must be int"):
        BuildConfig.from_dict({**base, "profile_options": {"max_tiles": "6"}})
    with pytest.raises(ConfigError, match="min_tiles"):  # the family's own check, at config time
        BuildConfig.from_dict({**base, "profile_options": {"max_tiles": 0}})
    with pytest.raises(ConfigError, match="set it once"):
        BuildConfig.from_dict({**base, "profile": "qwen2-vl", "max_pixels": 9999, "profile_options": {"max_pixels": 1}})
    # unset keeps the stored config (manifest, fingerprint) as before the option existed
    assert "profile_options" not in BuildConfig.from_dict(base).to_dict()


@pytest.mark.slow
def test_internvl_max_tiles_from_cli_and_yaml_matches_the_processor(tmp_path: Path) -> None:
    for i, (w, h) in enumerate(SIZES):
        (tmp_path / f"{i}.png").write_bytes(_png(w, h, i))
    records = [{"messages": [{"role": "user", "content": [{"type": "image", "image": f"{i}.png"},
                                                         {"type": "text", "text": "What?"}]},
                             {"role": "assistant", "content": "Noise."}]} for i in range(len(SIZES))]
    data = tmp_path / "d.jsonl"
    data.write_text("".join(json.dumps(r) + "\n" for r in records))
    (tmp_path / "c.yaml").write_text(yaml.safe_dump({"profile": "internvl", "profile_options": {"max_tiles": 6}}))
    processor = transformers.GotOcr2ImageProcessorPil(  # InternVL3-hf's preprocessor, max_patches 6
        size={"height": 448, "width": 448}, image_mean=[0.485, 0.456, 0.406], image_std=[0.229, 0.224, 0.225],
        resample=3, crop_to_patches=True, min_patches=1, max_patches=6)
    pics = [load_image(ImageRef(path=str(tmp_path / f"{i}.png"))) for i in range(len(SIZES))]
    want = processor(images=pics, return_tensors="pt")
    assert want["num_patches"].tolist() == [7, 7, 7, 7]  # + thumbnail; max_tiles 12 would give 13, 10, 13, 7
    out = tmp_path / "out"
    args = ["build", str(data), "-o", str(out), "--max-length", "16384", "-q", "--profile", "internvl"]
    result = CliRunner().invoke(cli, [*args, "--profile-option", "max_tiles=6"])
    assert result.exit_code == 0, result.output
    config = open_shards(out).manifest.config
    assert config.profile_options == {"max_tiles": 6}
    assert BuildConfig.from_yaml(tmp_path / "c.yaml", inputs=[str(data)], output="x").profile_overrides() == \
        config.profile_overrides()  # the YAML mapping is the same setting
    rows = list(PackedDataset(out, shuffle=False))
    images = [im for r in rows for im in r["images"]]
    order = [int(Path(im["source"]).stem) for im in images]
    tiles = want["num_patches"].tolist()
    assert [im["num_tokens"] for im in images] == [256 * tiles[i] for i in order]
    batch = collate(rows)
    starts = np.cumsum([0] + tiles)
    expected = torch.cat([want["pixel_values"][starts[i] : starts[i + 1]] for i in order])
    assert torch.equal(batch["pixel_values"], expected)
