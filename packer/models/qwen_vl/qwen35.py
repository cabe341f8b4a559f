"""Qwen3.5 (Qwen3.5-0.8B ... 397B-A17B, dense and MoE) as a language model: text, chats and message trees.

What packing must respect in Qwen3.5 is its token mixers, not its inputs: three of every four decoder layers are
Gated DeltaNet linear attention (a causal conv over the last 4 inputs, then a recurrent state), the fourth full
attention with a gate. The full-attention layers take packer's tree mask like any other model; the linear
layers take ``packer.train.linear_state`` (each example from a zero state, each branch from its parent's end
state), which ``use_packed_attention`` hooks in. The rows are the ``text`` family's: 1-D positions, restarting
per example and continuing each branch from its parent; ``Qwen3_5TextModel`` repeats a (1, T) row over its four
rope rows ``[text; t; h; w]``, which is what it does for a text path alone.

Images and video are not taken yet (a record that names one is rejected): Qwen3.5's processor is
``Qwen3VLProcessor`` (transformers 5.23.0, ``processing_auto``), so they would follow the Qwen3-VL rules of
``qwen3.py`` with Qwen3.5's own vision ids (docs/models/qwen_vl.md, "Qwen3.5").
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from packer.models.base import ModelProfile

if TYPE_CHECKING:
    from packer.models.proof import Proof


@dataclass(frozen=True, kw_only=True)
class Qwen35Profile(ModelProfile):
    """Qwen3.5 text: ``Qwen3_5ForCausalLM`` (``moe=True``: ``Qwen3_5MoeForCausalLM``)."""

    moe: bool = False
    """The MoE model class (Qwen3.5-35B-A3B, 122B-A10B, 397B-A17B): the same layers and rows, sparse MLPs."""
    default_tokenizer: str | None = "qwen3.5-standin"

    def proof(self) -> Proof:
        from packer.models.qwen_vl.proof import Qwen35Proof

        return Qwen35Proof(self)
