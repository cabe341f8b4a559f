"""The tokenizer transformers builds for a builtin's vocabulary, built here from the same rank file, offline: the
reference the builtins (and the fast engine) must equal.

- Qwen2 ranks: ``transformers.Qwen2Tokenizer(vocab=..., merges=...)`` (NFC, its split, byte-level), the vocabulary
  and merges read from ``qwen.tiktoken`` by transformers' ``TikTokenConverter.extract_vocab_merges_from_model``
  (what Qwen's own vocab.json / merges.txt hold); the stand-ins on Qwen2 ranks (gemma3, glm-4.6v, smolvlm, ...)
  have the same reference, since their text is cut by Qwen2's BPE.
- Llama 3 / Llama 4 ranks: what transformers' ``Llama3Converter`` / ``Llama4Converter`` (convert_llama*_weights_to_hf,
  not shipped in the wheel; transcribed) build: ``TikTokenConverter`` with the split pattern of Meta's own
  ``llama_models`` tokenizer (read from that package), no normalizer, and a post-processor that adds
  ``<|begin_of_text|>``.

Then the spec's added tokens in order (each at its id; ``normalized=False`` as every Qwen / Llama config says).
"""

from __future__ import annotations

from functools import lru_cache
from typing import Any

from packer.models.registry import tokenizer_spec
from packer.models.shared.tokenizer import RANKS


@lru_cache(maxsize=4)
def vocab_merges(ranks: str) -> tuple[dict[str, int], list[tuple[str, str]]]:
    from transformers.convert_slow_tokenizer import TikTokenConverter

    path = str(RANKS[ranks].path())
    return TikTokenConverter(vocab_file=path).extract_vocab_merges_from_model(path)


def meta_pattern(ranks: str) -> str:
    """The split pattern of Meta's own tokenizer for these ranks (``llama_models``)."""
    if ranks == "llama3":
        from llama_models.llama3.tokenizer import Tokenizer

        return Tokenizer.pat_str
    from llama_models.llama4.tokenizer import Tokenizer

    return Tokenizer.O200K_PATTERN


@lru_cache(maxsize=16)
def reference_tokenizer(name: str) -> Any:
    """The reference tokenizers.Tokenizer of builtin ``name`` (module docstring)."""
    from tokenizers import AddedToken, processors

    spec = tokenizer_spec(name)
    if spec.ranks == "qwen2":
        from transformers import Qwen2Tokenizer

        vocab, merges = vocab_merges("qwen2")
        ref = Qwen2Tokenizer(vocab=dict(vocab), merges=list(merges), unk_token=None, eos_token=None, pad_token=None)
        backend = ref.backend_tokenizer
    elif spec.ranks in ("llama3", "llama4"):
        from transformers.convert_slow_tokenizer import TikTokenConverter

        backend = TikTokenConverter(vocab_file=str(RANKS[spec.ranks].path()), pattern=meta_pattern(spec.ranks)).converted()
    else:
        raise ValueError(f"no reference for {name}'s ranks {spec.ranks!r}")
    for group in spec.added:
        tokens = [AddedToken(t, special=group.special, normalized=False) for t in group.tokens]
        (backend.add_special_tokens if group.special else backend.add_tokens)(tokens)
    if spec.ranks in ("llama3", "llama4"):
        bos = "<|begin_of_text|>"
        backend.post_processor = processors.Sequence([
            processors.ByteLevel(trim_offsets=False),
            processors.TemplateProcessing(single=f"{bos} $A", pair=f"{bos}:0 $A:0 {bos}:1 $B:1",
                                          special_tokens=[(bos, backend.token_to_id(bos))]),
        ])
    return backend


def referenced_builtins() -> list[str]:
    """Every builtin with a reference here (all but mistral3, which transformers' own tekken converter builds)."""
    from packer.models.registry import builtin_tokenizers

    return [n for n in builtin_tokenizers() if tokenizer_spec(n).ranks in ("qwen2", "llama3", "llama4")]
