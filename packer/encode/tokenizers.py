"""Tokenizers that work offline: the builtins (``--tokenizer NAME``), built once and cached, and any HF tokenizer.

A builtin is a ``TokenizerSpec`` of the family package that owns it (``packer/models/<family>/tokenizers.py``:
ranks from a registry package, added tokens at their real ids, the chat template; docs/models/ says which are
real and which are stand-ins). ``ensure_builtin`` builds it into an ordinary HF tokenizer directory under
``$PACKER_CACHE`` (default ``~/.cache/packer``), versioned by a hash of the ranks file and the spec, so it loads
like any other. Any other name or path goes to ``AutoTokenizer.from_pretrained``.
"""

from __future__ import annotations

import hashlib
import os
import weakref
from functools import lru_cache
from pathlib import Path

from packer.errors import ConfigError
from packer.models.registry import builtin_tokenizers, tokenizer_spec
from packer.models.shared.tokenizer import RANKS


def cache_dir() -> Path:
    """Where packer keeps what it builds once (tokenizers; ``engines/``: fastokens' tokenizer.json of each
    tokenizer a build used, ``pipeline/kept.py``'s ``engine_file``)."""
    return Path(os.environ.get("PACKER_CACHE", Path.home() / ".cache" / "packer"))


_LAYOUT = b"added_tokens_decoder"  # what save_tokenizer writes besides save_pretrained: a change rebuilds every builtin


def builtin_path(name: str) -> Path:
    """The cache directory of a builtin tokenizer, versioned by its ranks file and its whole spec."""
    spec = tokenizer_spec(name)
    h = hashlib.sha256(spec.ranks_file().read_bytes())
    h.update(repr(spec).encode())  # tokens, roles, template: any change rebuilds it
    h.update(repr(RANKS.get(spec.ranks)).encode())  # and what the tokenizer does around the BPE (normalizer, bos)
    h.update(_LAYOUT)
    digest = h.hexdigest()[:12]
    return cache_dir() / "tokenizers" / f"{name}-{digest}"


def ensure_builtin(name: str) -> Path:
    """Build a builtin tokenizer if it is not cached yet; return its directory."""
    path = builtin_path(name)
    if not (path / "tokenizer.json").exists():
        path.parent.mkdir(parents=True, exist_ok=True)
        tokenizer_spec(name).build(path)
    return path


_LOADED: weakref.WeakValueDictionary = weakref.WeakValueDictionary()  # name -> what load_tokenizer gave, while it lives


def loaded_tokenizer(name_or_path: str):
    """The tokenizer ``load_tokenizer`` gave this process for ``name_or_path``, while something (its cache)
    still holds it; else None. A process that holds it makes an encoder from it rather than reading a kept one
    (``Executor.load_encoder``): the load is paid already, as is fastokens' native tokenizer of it."""
    return _LOADED.get(name_or_path)


@lru_cache(maxsize=8)
def load_tokenizer(name_or_path: str):
    """Load a tokenizer: a builtin name (``qwen2-vl``), a local directory, or a hub name."""
    tokenizer = _load_tokenizer(name_or_path)
    try:
        _LOADED[name_or_path] = tokenizer
    except TypeError:  # not weakly referable: never reported loaded
        pass
    return tokenizer


def _load_tokenizer(name_or_path: str):
    if name_or_path in builtin_tokenizers():
        # The builtin is a plain fast tokenizer; AutoTokenizer would parse its 18 MB tokenizer.json once
        # more in Python (~3 s) before the Rust parse, so load the class directly. Importing AutoTokenizer
        # at all imports torch (~2 s), so it is imported only for other tokenizers.
        from transformers import PreTrainedTokenizerFast

        return PreTrainedTokenizerFast.from_pretrained(str(ensure_builtin(name_or_path)))
    from transformers import AutoTokenizer

    try:
        return AutoTokenizer.from_pretrained(name_or_path)
    except (OSError, ValueError) as e:
        raise ConfigError(
            f"cannot load tokenizer {name_or_path!r}: {e}. Pass --tokenizer with a local HF tokenizer "
            f"directory, a hub name you can reach, or one of: {', '.join(builtin_tokenizers())}"
        ) from e


def fingerprint(tokenizer, json: str | None = None) -> str:
    """sha256 of the tokenizer's vocabulary, special tokens and chat template (for the manifest); ``json``: its
    Rust tokenizer's ``to_str()``, made already (an Encoder's ``TokenizerView.json``: ~0.3 CPU-s not spent twice)."""
    h = hashlib.sha256()
    if hasattr(tokenizer, "backend_tokenizer"):
        h.update((json if json is not None else tokenizer.backend_tokenizer.to_str()).encode())
    h.update(str(getattr(tokenizer, "chat_template", "") or "").encode())
    return h.hexdigest()


if __name__ == "__main__":  # `python -m packer.encode.tokenizers` pre-builds the builtins (make setup)
    for _name in builtin_tokenizers():
        print(f"{_name}: {ensure_builtin(_name)}")
