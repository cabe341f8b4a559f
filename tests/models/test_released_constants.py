"""Every registered profile's defaults against the released checkpoint's files, one cited fixture per family
(tests/models/released/<family>.json, compared through ``released.PROFILE_VALUE``, the one mapping)."""

from __future__ import annotations

import pytest

from packer.models import get_profile, profile_names
from tests.models import released

ENTRIES = released.released_profiles()


@pytest.mark.parametrize(("family", "name", "entry"), ENTRIES, ids=[n for _, n, _ in ENTRIES])
def test_profile_defaults_equal_the_released_files(family, name, entry) -> None:
    profile = get_profile(name)
    assert f"models.{family}." in type(profile).__module__
    checked = 0
    for file, spec in entry["files"].items():
        assert spec.get("source"), f"{name} {file}: no source"
        if file == "tokenizer" or file == "config.json":
            continue
        for key, want in spec.get("values", {}).items():
            if key in spec.get("unused", {}):  # recorded, but the released processor's call never reads it
                continue
            get = released.PROFILE_VALUE.get((file, key))
            if get is None:
                assert key in released.RECORDED_ONLY or file != "preprocessor_config.json", (name, file, key)
                continue
            got = get(profile)
            assert got == pytest.approx(want) if isinstance(want, list) else got == want, (name, file, key, got, want)
            checked += 1
    assert checked or not any(f.endswith("config.json") for f in entry["files"])


@pytest.mark.parametrize(("family", "name", "entry"), ENTRIES, ids=[n for _, n, _ in ENTRIES])
def test_builtin_tokenizer_ids_equal_the_released_ones(family, name, entry) -> None:
    from packer.encode.tokenizers import load_tokenizer

    profile = get_profile(name)
    if profile.default_tokenizer is None:
        pytest.skip(f"{name} has no builtin tokenizer")
    tok = load_tokenizer(profile.default_tokenizer)
    for token, want in released.file_values(entry, "tokenizer").items():
        if token in ("eos_token", "pad_token", "bos_token"):
            assert getattr(tok, token) == want, (name, token)
        else:
            assert tok.convert_tokens_to_ids(token) == want, (name, token)
    for key, want in released.file_values(entry, "config.json").items():
        attr = released.TOKEN_KEYS.get(key)
        if attr is not None and getattr(profile, attr, None) is not None:
            assert tok.convert_tokens_to_ids(getattr(profile, attr)) == want, (name, key)
