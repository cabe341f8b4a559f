"""The guard against a profile's guess: a build whose ``--tokenizer`` is a checkpoint directory is refused where
the directory's processor files (written here from the released fixtures, tests/models/released/) set a value
the profile would count with otherwise, and goes through once the build follows them or sets the value itself."""

from __future__ import annotations

import json

import pytest

from packer.config import BuildConfig
from packer.encode.tokenizers import load_tokenizer
from packer.errors import ConfigError
from tests.models import released


def _checkpoint(tmp_path, family: str, profile: str, **changes):
    """A checkpoint directory: the builtin tokenizer's files plus the released processor files, with ``changes``
    (dotted keys) applied to its preprocessor_config.json."""
    entry = released.load(family)["profiles"][profile]
    path = released.checkpoint_dir(tmp_path / profile, entry)
    load_tokenizer(released_tokenizer(profile)).save_pretrained(str(path))
    if changes:
        pre = json.loads((path / "preprocessor_config.json").read_text())
        pre.update(changes)
        (path / "preprocessor_config.json").write_text(json.dumps(pre))
    return path


def released_tokenizer(profile: str) -> str:
    from packer.models import get_profile

    return get_profile(profile).default_tokenizer


def _config(tmp_path, profile: str, tokenizer, **options) -> BuildConfig:
    return BuildConfig.from_inputs([str(tmp_path / "x.jsonl")], str(tmp_path / "out"), profile=profile,
                                   tokenizer=str(tokenizer), **options)


@pytest.mark.parametrize(("family", "profile"), [("qwen_omni", "qwen2.5-omni"), ("qwen_vl", "qwen2-vl"),
                                                 ("qwen_vl", "qwen2.5-vl"), ("qwen_vl", "qwen3-vl"),
                                                 ("qwen2_audio", "qwen2-audio"), ("gemma3", "gemma3"),
                                                 ("glm46v", "glm-4.6v"), ("smolvlm", "smolvlm"),
                                                 ("gemma4", "gemma4"), ("mistral3", "mistral3")])
def test_the_released_files_pass(tmp_path, family, profile) -> None:
    """A checkpoint directory holding the released files agrees with the profile's defaults."""
    _config(tmp_path, profile, _checkpoint(tmp_path, family, profile))


def test_a_30_s_chunk_is_refused_then_followed(tmp_path) -> None:
    """The issue's bug, from the other side: a Qwen2.5-Omni checkpoint whose extractor says 30 s is not counted
    with the profile's 300 s; the build that follows it (or keeps 300 s explicitly) goes through."""
    ckpt = _checkpoint(tmp_path, "qwen_omni", "qwen2.5-omni", chunk_length=30, n_samples=480000, nb_max_frames=3000)
    with pytest.raises(ConfigError, match=r"preprocessor_config.json sets chunk_length 30; profile 'qwen2.5-omni' "
                                          r"would count with audio_chunk_length 300: pass --profile-option "
                                          r"audio_chunk_length=30"):
        _config(tmp_path, "qwen2.5-omni", ckpt)
    followed = _config(tmp_path, "qwen2.5-omni", ckpt, profile_options={"audio_chunk_length": 30})
    from packer.models import get_profile

    profile = get_profile("qwen2.5-omni", **followed.profile_overrides())
    assert int(profile.audio.feature_lengths(__import__("numpy").array([10**7]), __import__("numpy").full(1, -1))[0]) == 3000
    assert profile.reader().audio_chunk_length == 30
    _config(tmp_path, "qwen2.5-omni", ckpt, profile_options={"audio_chunk_length": 300})


def test_a_key_the_released_call_never_reads_is_not_compared(tmp_path) -> None:
    """Qwen3-Omni's processor pads to the longest clip without truncation: any chunk_length is fine."""
    _config(tmp_path, "qwen3-omni", _checkpoint(tmp_path, "qwen_omni", "qwen3-omni", chunk_length=30))


def test_pixel_bounds_that_differ_are_refused(tmp_path) -> None:
    ckpt = _checkpoint(tmp_path, "qwen_vl", "qwen2-vl", max_pixels=1003520)
    with pytest.raises(ConfigError, match=r"sets max_pixels 1003520; profile 'qwen2-vl' would count with "
                                          r"max_pixels 12845056: pass --max-pixels 1003520"):
        _config(tmp_path, "qwen2-vl", ckpt)
    _config(tmp_path, "qwen2-vl", ckpt, max_pixels=1003520)


def test_a_nested_size_is_read(tmp_path) -> None:
    """Qwen3-VL's bounds live in ``size``; SmolVLM's size.longest_edge is an edge, not an area."""
    ckpt = _checkpoint(tmp_path, "qwen_vl", "qwen3-vl", size={"shortest_edge": 65536, "longest_edge": 1 << 22})
    with pytest.raises(ConfigError, match=r"sets size.longest_edge 4194304; profile 'qwen3-vl' would count with "
                                          r"max_pixels 16777216"):
        _config(tmp_path, "qwen3-vl", ckpt)
    ckpt = _checkpoint(tmp_path, "smolvlm", "smolvlm", size={"longest_edge": 2048})
    with pytest.raises(ConfigError, match=r"would count with longest_edge 1536: pass --profile-option "
                                          r"longest_edge=2048"):
        _config(tmp_path, "smolvlm", ckpt)


def test_processor_config_names_a_directory_or_one_file(tmp_path) -> None:
    """``processor_config`` (YAML ``processor_config:``) is checked as a --tokenizer directory is, and may name
    one file; a tokenizer that is a builtin name does not hide it."""
    ckpt = _checkpoint(tmp_path, "qwen_omni", "qwen2.5-omni", chunk_length=30)
    for where in (ckpt, ckpt / "preprocessor_config.json"):
        with pytest.raises(ConfigError, match=r"sets chunk_length 30"):
            BuildConfig.from_inputs([str(tmp_path / "x.jsonl")], str(tmp_path / "out"), profile="qwen2.5-omni",
                                    processor_config=str(where))
    with pytest.raises(ConfigError, match=r"not a processor file"):
        BuildConfig.from_inputs([str(tmp_path / "x.jsonl")], str(tmp_path / "out"), profile="qwen2.5-omni",
                                processor_config=str(ckpt / "tokenizer.json"))
    with pytest.raises(ConfigError, match=r"'processor_config': .* does not exist"):
        BuildConfig.from_inputs([str(tmp_path / "x.jsonl")], str(tmp_path / "out"), profile="qwen2.5-omni",
                                processor_config=str(tmp_path / "missing"))
    ok = BuildConfig.from_inputs([str(tmp_path / "x.jsonl")], str(tmp_path / "out"), profile="qwen2.5-omni",
                                 processor_config=str(ckpt), profile_options={"audio_chunk_length": 30})
    assert ok.to_dict()["processor_config"] == str(ckpt)
    assert "processor_config" not in BuildConfig.from_inputs(["x.jsonl"], "out").to_dict()  # fingerprints kept


def test_a_setting_no_option_changes_is_refused_as_another_model(tmp_path) -> None:
    ckpt = _checkpoint(tmp_path, "qwen_vl", "qwen2-vl", patch_size=16)
    with pytest.raises(ConfigError, match=r"sets patch_size 16; profile 'qwen2-vl' counts with patch_size 14, "
                                          r"which no build option changes"):
        _config(tmp_path, "qwen2-vl", ckpt)


def test_an_unreadable_processor_file_names_itself(tmp_path) -> None:
    ckpt = _checkpoint(tmp_path, "qwen_vl", "qwen2-vl")
    (ckpt / "preprocessor_config.json").write_text("{not json")
    with pytest.raises(ConfigError, match=r"preprocessor_config.json: cannot read"):
        _config(tmp_path, "qwen2-vl", ckpt)


def test_the_cli_refuses_with_the_fix(tmp_path) -> None:
    from click.testing import CliRunner

    from packer.cli import cli

    ckpt = _checkpoint(tmp_path, "qwen_omni", "qwen2.5-omni", chunk_length=30)
    (tmp_path / "x.jsonl").write_text('{"messages": [{"role": "user", "content": "hi"}]}\n')
    result = CliRunner().invoke(cli, ["build", str(tmp_path / "x.jsonl"), "-o", str(tmp_path / "out"),
                                      "--profile", "qwen2.5-omni", "--tokenizer", str(ckpt)])
    assert result.exit_code != 0
    assert "audio_chunk_length=30" in result.output
