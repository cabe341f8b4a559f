"""The text proof: any transformers ``*ForCausalLM`` (``model_class=``), by default the builtin tokenizer's."""

from __future__ import annotations

from packer.models.proof import Proof


class TextProof(Proof):
    model_class = "Qwen2ForCausalLM"  # the builtin tokenizer's; any *ForCausalLM works (tiny_model(model_class=...))
