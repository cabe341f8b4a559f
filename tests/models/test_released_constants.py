"""Every registered profile's defaults against the released checkpoint's files, one cited fixture per family
(tests/models/released/<family>.json, compared through ``released.profile_value``, the one mapping)."""

from __future__ import annotations

import pytest

from packer.models import get_profile, profile_names
from tests.models import released

ENTRIES = released.released_profiles()


def test_every_profile_has_a_fixture() -> None:
    """``text`` is a language model alone (no processor files); every other profile is covered."""
    covered = {name for _, name, _ in ENTRIES}
    assert set(profile_names()) - {"text"} == covered, sorted(set(profile_names()) ^ covered)


@pytest.mark.parametrize(("family", "name", "entry"), ENTRIES, ids=[n for _, n, _ in ENTRIES])
def test_profile_defaults_equal_the_released_files(family, name, entry) -> None:
    profile = get_profile(name)
    assert f"models.{family}." in type(profile).__module__
    checked = 0
    for file, spec in entry["files"].items():
        assert spec.get("source"), f"{name} {file}: no source"
        if file in ("tokenizer", "chat_template"):
            continue
        for key, want in spec.get("values", {}).items():
            if key in spec.get("unused", {}):  # recorded, but the released processor's call never reads it
                continue
            get = released.profile_value(family, file, key)
            if get is None:
                assert key in released.RECORDED_ONLY or key in released.TOKEN_KEYS, (name, file, key)
                continue
            got = get(profile)
            assert got == pytest.approx(want) if isinstance(want, list) else got == want, (name, file, key, got, want)
            checked += 1
    assert checked, f"{name}: nothing compared"


@pytest.mark.parametrize(("family", "name", "entry"), ENTRIES, ids=[n for _, n, _ in ENTRIES])
def test_builtin_tokenizer_ids_equal_the_released_ones(family, name, entry) -> None:
    """A real builtin has the released ids; a stand-in has the released token names, each one token (its ids are
    its own: the family's page says so)."""
    from tests.encode.helpers import builtin

    profile = get_profile(name)
    spec = entry["files"]["tokenizer"]
    if profile.default_tokenizer is None:
        assert spec.get("status") == "none"
        return
    tok = builtin(profile.default_tokenizer)
    standin = spec.get("status") == "stand-in"
    for token, want in spec["values"].items():
        if token in ("eos_token", "pad_token", "bos_token"):
            assert getattr(tok, token) == want, (name, token)
        elif standin:
            assert tok.convert_tokens_to_ids(token) not in (None, tok.unk_token_id), (name, token)
        else:
            assert tok.convert_tokens_to_ids(token) == want, (name, token)
    if standin:
        return
    for key, want in released.file_values(entry, "config.json").items():
        attr = released.TOKEN_KEYS.get(key)
        if attr is not None and getattr(profile, attr, None) is not None:
            assert tok.convert_tokens_to_ids(getattr(profile, attr)) == want, (name, key)
