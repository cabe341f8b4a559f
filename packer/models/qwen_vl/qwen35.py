"""Qwen3.5 (Qwen3.5-0.8B ... 397B-A17B, dense and MoE): Qwen3-VL's images and video on a hybrid language model.

What packing must respect in Qwen3.5's language model is its token mixers: three of every four decoder layers
are Gated DeltaNet linear attention (a causal conv over the last 4 inputs, then a recurrent state), the fourth
full attention with a gate. The full-attention layers take packer's tree mask like any other model; the linear
layers take ``packer.train.linear_state`` (each example from a zero state, each branch from its parent's end
state), which ``use_packed_attention`` hooks in. Vision tokens are tokens to both: nothing more is needed there.

Its images and video are Qwen3-VL's (``qwen3.py``), because transformers 5.23.0 runs them with Qwen3-VL's code.
What is the same, and what is not (checked in transformers 5.23.0's source):

- Processor: ``processing_auto`` maps ``qwen3_5`` and ``qwen3_5_moe`` to ``Qwen3VLProcessor`` (Qwen3-VL's own),
  ``image_processing_auto`` to ``Qwen2VLImageProcessor`` / ``Qwen2VLImageProcessorPil`` and
  ``video_processing_auto`` to ``Qwen3VLVideoProcessor``, as for ``qwen3_vl``. The checkpoints'
  preprocessor_config.json configures the image processor as Qwen3-VL's do (patch 16, merge 2, temporal patch
  2, mean = std = 0.5, shortest_edge 65536, longest_edge 16777216): the same grids and counts, the same
  ``<|vision_start|><|image_pad|>*n<|vision_end|>`` runs, the same per-frame ``<t seconds>`` video runs.
- Vision tower: ``Qwen3_5VisionConfig`` is ``Qwen3VLVisionConfig`` without ``deepstack_visual_indexes`` (and
  ``Qwen3_5VisionModel`` deletes the DeepStack mergers): same patch 16, spatial merge 2, temporal patch 2, so
  the same tokens per image; the features enter the language model at the placeholders only.
- Positions: ``Qwen3_5Model.get_rope_index`` and ``get_vision_position_ids`` are Qwen3-VL's line for line
  (videos split per temporal patch, t = 1, the timestamps text between), so the positions rule is Qwen3-VL's;
  ``Qwen3_5TextModel`` takes the same 4-row ``[text; t; h; w]`` position ids and rotates a quarter of each
  head (``partial_rotary_factor``) with interleaved sections: the model's business, not the rows'.
- Token ids: Qwen3.5's config names its own (image 248056, video 248057, vision start / end 248053 / 248054,
  Qwen3-VL's 151655 / 151656 / 151652 / 151653) for the same token NAMES, which is how packer resolves them: a
  real Qwen3.5 tokenizer gives Qwen3.5's ids, the builtin stand-in ``qwen3.5-standin`` Qwen3's (tokenizers.py).
- Text-only data (1-D positions, equal on the three mRoPE rows) trains ``Qwen3_5ForCausalLM`` as it did before
  images were taken: ``Qwen3_5TextModel`` reads the same 4-row (or 2-D) position ids.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, ClassVar

from packer.models.qwen_vl.qwen3 import Qwen3VLProfile

if TYPE_CHECKING:
    from packer.models.proof import Proof


@dataclass(frozen=True, kw_only=True)
class Qwen35Profile(Qwen3VLProfile):
    """Qwen3.5: ``Qwen3_5ForConditionalGeneration`` (``moe=True``: ``Qwen3_5MoeForConditionalGeneration``).

    Images and videos as ``Qwen3VLProfile`` takes them (Qwen3.5's processor is Qwen3-VL's); the batch holds what
    a Qwen3-VL batch holds. Text-only rows also train ``Qwen3_5ForCausalLM`` / ``Qwen3_5MoeForCausalLM``.
    """

    moe: bool = False
    """The MoE model class (Qwen3.5-35B-A3B, 122B-A10B, 397B-A17B): the same layers and rows, sparse MLPs."""
    default_tokenizer: str = "qwen3.5-standin"

    video_rule: ClassVar[str | None] = "qwen3-vl"  # its video processor is Qwen3-VL's: the same video rule

    def proof(self) -> Proof:
        from packer.models.qwen_vl.proof import Qwen35Proof

        return Qwen35Proof(self)
