"""Build configs: every configs/*.yaml builds offline; the command line overrides YAML; the effective config
is what the manifest stores; bad keys and values fail with a message that names them."""

from __future__ import annotations

import dataclasses
import json
import shutil
from pathlib import Path

import click
import numpy as np
import pytest
import yaml
from click.testing import CliRunner

from packer.cli import cli, config_options, config_overrides
from packer.config import BuildConfig, option
from packer.errors import ConfigError
from packer.models import builtin_tokenizers, get_profile, profile_names
from packer.models.base import ModelProfile

REPO = Path(__file__).resolve().parents[1]
CONFIGS = sorted((REPO / "configs").glob("*.yaml"))
WORKED = {  # config -> vision tokens of a 640x480 image under its pixel bounds (worked examples; any config
    # may join, none must: every config is checked against the registry below)
    "coco-caption-trees.yaml": 13 * 18,  # 640x480 scaled into 200704 px: 364x504
    "internvl.yaml": 13 * 256,  # 4x3 tiles of 448 px + a thumbnail
    "llava-1.5.yaml": 576,
    "gemma3.yaml": 256,
    "llava-onevision.yaml": 2929,  # 729 base + 40 rows x (54 + newline)
    "qwen2-vl.yaml": 17 * 23,  # 640x480 -> 644x476 (multiples of 28)
    "qwen2.5-vl.yaml": 17 * 23,
    "qwen3-vl.yaml": 15 * 20,  # 640x480 kept (multiples of 32): 30x40 patches of 16 px
    "molmo2.yaml": 766,  # 640x480 -> 2x2 crops: 212 low-res + 554 high-res tokens
}


def _profile(path: Path) -> ModelProfile:
    return get_profile(BuildConfig.from_yaml(path, inputs=["x.jsonl"], output="out").profile)


@pytest.fixture(scope="module")
def corpus(tmp_path_factory, coco_images) -> dict[str, Path]:
    """A chat, an image chat and a LLaVA record (image files beside the JSONL); text-only for text configs."""
    root = tmp_path_factory.mktemp("cfg")
    shutil.copy(coco_images[0], root / "a.jpg")
    chat = {"messages": [{"role": "user", "content": "Hi there."}, {"role": "assistant", "content": "Hello!"}]}
    image = {"messages": [{"role": "user", "content": [{"type": "image", "image": "a.jpg"}, {"type": "text", "text": "What?"}]},
                          {"role": "assistant", "content": "A picture."}]}
    llava = {"conversations": [{"from": "human", "value": "<image>\nDescribe."}, {"from": "gpt", "value": "Things."}],
             "image": "a.jpg"}
    (root / "text.jsonl").write_text(json.dumps(chat) + "\n")
    (root / "vision.jsonl").write_text("".join(json.dumps(r) + "\n" for r in (chat, image, llava)))
    return {"text": root / "text.jsonl", "vision": root / "vision.jsonl"}


def test_every_config_parses_and_every_profile_has_one():
    configs = {path.name: BuildConfig.from_yaml(path, inputs=["x.jsonl"], output="out") for path in CONFIGS}
    assert set(profile_names()) <= {c.profile for c in configs.values()}  # each registered family ships a YAML
    assert set(WORKED) <= set(configs)
    for name, config in configs.items():
        # every shipped config runs offline, or names no tokenizer because its family has no honest default
        assert config.tokenizer in builtin_tokenizers() or get_profile(config.profile).default_tokenizer is None
        vision = get_profile(config.profile, min_pixels=config.min_pixels, max_pixels=config.max_pixels)
        if vision.image is None:
            assert name not in WORKED
            continue
        tokens = vision.image.num_tokens(640, 480)  # encode's count; verify re-derives it from the stored grid
        assert tokens > 0 and vision.image.grid_num_tokens(np.array([vision.image.grid_thw(640, 480)])).tolist() == [tokens]
        assert WORKED.get(name, tokens) == tokens, name


def test_qwen25_config_counts_like_qwen2():
    """The two Qwen configs differ only in the profile: the same image processor, so the same counts."""
    q2, q25 = (yaml.safe_load((REPO / "configs" / n).read_text()) for n in ("qwen2-vl.yaml", "qwen2.5-vl.yaml"))
    assert {k: v for k, v in q2.items() if k != "profile"} == {k: v for k, v in q25.items() if k != "profile"}
    a, b = get_profile("qwen2-vl"), get_profile("qwen2.5-vl")
    for w, h in [(640, 480), (28, 28), (4000, 300), (1920, 1080)]:
        assert a.image.grid_thw(w, h) == b.image.grid_thw(w, h)


@pytest.mark.slow
@pytest.mark.parametrize("path", CONFIGS, ids=lambda p: p.name)
def test_config_builds_and_manifest_holds_the_effective_config(path, corpus, tmp_path):
    data = corpus["vision" if _profile(path).image is not None else "text"]
    out = tmp_path / "out"
    args = ["build", "--config", str(path), str(data), "-o", str(out), "-q"]
    given = {} if BuildConfig.from_yaml(path, inputs=["x"], output="o").tokenizer else {"tokenizer": "qwen2-vl"}
    if given:  # a family without a default tokenizer refuses to guess
        res = CliRunner().invoke(cli, args)
        assert res.exit_code == 1 and "has no default tokenizer: set `tokenizer:`" in res.output, res.output
    res = CliRunner().invoke(cli, args + [f"--tokenizer={v}" for v in given.values()])
    assert res.exit_code == 0, res.output
    manifest = json.loads((out / "manifest.json").read_text())
    effective = BuildConfig.from_yaml(path, inputs=[str(data)], output=str(out), **given).to_dict()
    assert manifest["config"] == effective
    assert manifest["totals"]["rejected"] == 0
    assert manifest["totals"]["examples"] == (1 if data == corpus["text"] else 3)


def test_command_line_wins_over_yaml(corpus, tmp_path):
    config = REPO / "configs" / "coco-caption-trees.yaml"
    out = tmp_path / "out"
    args = ["build", "--config", str(config), str(corpus["vision"]), "-o", str(out), "-q",
            "--max-length", "1024", "--seed", "7", "--no-balance-vision", "--max-pixels", "50176"]
    res = CliRunner().invoke(cli, args)
    assert res.exit_code == 0, res.output
    got = json.loads((out / "manifest.json").read_text())["config"]
    assert (got["max_length"], got["seed"], got["balance_vision"], got["max_pixels"]) == (1024, 7, False, 50176)
    assert (got["max_vision_tokens"], got["profile"]) == (1536, "qwen2-vl")  # the rest still from the YAML
    assert got["sources"] == [{"name": "", "paths": [str(corpus["vision"])], "weight": 1.0}]


def test_inputs_on_the_command_line_replace_the_yaml_sources(corpus, tmp_path):
    (tmp_path / "c.yaml").write_text(yaml.safe_dump({"profile": "text", "inputs": ["nothing/*.jsonl"]}))
    res = CliRunner().invoke(cli, ["build", "--config", str(tmp_path / "c.yaml"), str(corpus["text"]),
                                   "-o", str(tmp_path / "out"), "-q"])
    assert res.exit_code == 0, res.output
    (tmp_path / "d.yaml").write_text(yaml.safe_dump({"profile": "text", "inputs": [str(corpus["text"])],
                                                     "output": str(tmp_path / "yaml_out")}))
    res = CliRunner().invoke(cli, ["build", "--config", str(tmp_path / "d.yaml"), "-q"])
    assert res.exit_code == 0, res.output  # inputs and output may come from the YAML alone
    assert (tmp_path / "yaml_out" / "manifest.json").exists()


def test_command_line_inputs_or_sources_replace_the_yaml_ones(corpus, tmp_path):
    """INPUTS on the command line replace a YAML `sources:` list, and --source replaces YAML `inputs:`."""
    text = str(corpus["text"])
    (tmp_path / "s.yaml").write_text(yaml.safe_dump({"profile": "text", "sources": [{"name": "a", "paths": ["x/*.jsonl"]}]}))
    (tmp_path / "i.yaml").write_text(yaml.safe_dump({"profile": "text", "inputs": ["x/*.jsonl"]}))
    runs = {"inputs": ["--config", str(tmp_path / "s.yaml"), text],
            "source": ["--config", str(tmp_path / "i.yaml"), "--source", f"chat={text}@2"]}
    expected = {"inputs": [{"name": "", "paths": [text], "weight": 1.0}],
                "source": [{"name": "chat", "paths": [text], "weight": 2.0}]}
    for kind, args in runs.items():
        res = CliRunner().invoke(cli, ["build", *args, "-o", str(tmp_path / kind), "-q"])
        assert res.exit_code == 0, res.output
        assert json.loads((tmp_path / kind / "manifest.json").read_text())["config"]["sources"] == expected[kind]


@pytest.mark.parametrize(
    "content, message",
    [
        ("max_len: 10\n", "error: unknown config keys ['max_len'] ('max_len': did you mean 'max_length'?); "
                          "known keys: algorithm, balance_vision, "
                          "chat_template, columns, dataset_info, datasets, executor, image_root, image_token, inputs, keep_up_to, "
                          "long_docs, long_docs_overlap, "
                          "max_audio_tokens, max_audios, max_examples_per_pack, max_images, max_length, "
                          "max_pixels, max_reject_fraction, max_videos, max_vision_tokens, min_pixels, num_proc, output, "
                          "overlong, overwrite, processor_config, profile, profile_options, ray_address, refine, rows_per_row_group, "
                          "rows_per_shard, seed, "
                          "sources, storage_options, strict, tokenizer, use_audio_in_video\n"),
        ("- a list\n", "error: config {cfg} must be a mapping of option: value\n"),
        ("inputs: [x.jsonl]\nmax_length: 0\n", "error: 'max_length' must be a positive integer, got 0\n"),
        ("inputs: [x.jsonl]\nalgorithm: magic\n", "error: 'algorithm' must be one of bfd, ffd, next-fit, binpacking, got 'magic'\n"),
        ("inputs: [x.jsonl]\nexecutor: spark\n", "error: 'executor' must be one of local, ray, got 'spark'\n"),
        ("inputs: [x.jsonl]\nray_address: auto\n", "error: 'ray_address' is for executor: ray, got executor 'local'\n"),
        ("sources: [{name: a}]\n", "error: each source needs 'name' and 'paths', got {'name': 'a'}\n"),
        ("inputs: [a.jsonl]\nsources: [{name: a, paths: [b.jsonl]}]\n",
         "error: give either 'inputs' or 'sources', not both\n"),
    ],
)
def test_bad_config_files_name_the_problem(tmp_path, content, message):
    cfg = tmp_path / "bad.yaml"
    cfg.write_text(content)
    # no INPUT on the command line, so the YAML's own inputs/sources are what gets checked
    res = CliRunner().invoke(cli, ["build", "--config", str(cfg), "-o", str(tmp_path / "out")])
    assert res.exit_code == 1
    assert res.stderr == message.replace("{cfg}", str(cfg))


def test_missing_config_file_is_a_usage_error(tmp_path):
    res = CliRunner().invoke(cli, ["build", "--config", str(tmp_path / "nope.yaml"), "x.jsonl"])
    assert res.exit_code == 2
    assert f"Error: Invalid value for '--config': File '{tmp_path / 'nope.yaml'}' does not exist." in res.stderr


def test_wrong_value_type_is_a_config_error():
    with pytest.raises(ConfigError, match=r"'max_length' must be int, got 'big' \(str\)"):
        BuildConfig.from_dict({"max_length": "big", "inputs": ["x.jsonl"], "output": "o"})
    with pytest.raises(ConfigError, match="'overwrite' must be bool"):
        BuildConfig.from_dict({"overwrite": "yes", "inputs": ["x.jsonl"], "output": "o"})
    with pytest.raises(ConfigError, match="'max_vision_tokens' must be int | None"):
        BuildConfig.from_dict({"max_vision_tokens": 1.5, "inputs": ["x.jsonl"], "output": "o"})


def test_build_options_are_the_config_fields():
    """`packer build` takes every BuildConfig field made with `option` by its name, its help the field's with the
    field's own default appended (no default copied by hand), and no config-only field."""
    params = {p.name: p for p in cli.commands["build"].params}
    fields = {f.name: f for f in dataclasses.fields(BuildConfig)}
    options = [n for n, f in fields.items() if "help" in f.metadata]
    assert len(options) == 35 and {"sources", "storage_options"} <= set(fields) - set(options)
    # --dataset-info / --dataset expand into sources (config.dataset_sources), as --source does: no field of their own
    assert set(params) == {*options, "inputs", "config_file", "sources", "dataset_info", "datasets", "quiet"}
    for name in options:
        f, help_text = fields[name], params[name].help
        assert help_text.startswith(f.metadata["help"]), name
        if f.default not in (None, dataclasses.MISSING):
            shown = ("on" if f.default else "off") if isinstance(f.default, bool) else f.default
            assert help_text.endswith(f"[default: {shown}]"), name
    assert params["max_length"].help == "Pack capacity in tokens. [default: 4096]"
    assert params["balance_vision"].opts == ["--balance-vision"] and params["balance_vision"].secondary_opts == [
        "--no-balance-vision"]
    assert params["output"].opts == ["-o", "--output"] and params["profile_options"].opts == ["--profile-option"]
    assert params["algorithm"].type.choices == ("bfd", "ffd", "next-fit", "binpacking")


def test_a_new_config_field_is_a_new_option():
    """Adding an option is one field: a config with one more `option` field gets `--dataset-info` from it, and
    the value given reaches the config's overrides (not given: left out, so YAML's value stays)."""
    @dataclasses.dataclass(frozen=True, kw_only=True)
    class Config(BuildConfig):
        dataset_info: str | None = option(None, help="LLaMA-Factory dataset_info.json.")
        extra_epochs: int = option(2, help="Epochs.")

    seen = []

    @click.command()
    @config_options("dataset_info", "extra_epochs", "max_length", config=Config)
    def command(**options):
        seen.append(config_overrides(options, config=Config))

    lines = [" ".join(line.split()) for line in CliRunner().invoke(command, ["--help"]).stdout.splitlines()]
    assert lines[3:6] == ["--max-length INTEGER Pack capacity in tokens. [default: 4096]",  # in field order
                          "--dataset-info TEXT LLaMA-Factory dataset_info.json.",
                          "--extra-epochs INTEGER Epochs. [default: 2]"]
    assert CliRunner().invoke(command, ["--dataset-info", "d.json", "--max-length", "8"]).exit_code == 0
    assert CliRunner().invoke(command, []).exit_code == 0
    assert seen == [{"dataset_info": "d.json", "max_length": 8}, {}]
    res = CliRunner().invoke(command, ["--extra-epochs", "x"])
    assert res.exit_code == 2 and "'x' is not a valid integer" in res.output
