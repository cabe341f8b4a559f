"""Text-only models: no images (a record that names one is rejected), 1-D positions, no pixel values.

Everything is ``ModelProfile``'s default: the base class is a model without vision.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

from packer.models.base import ModelProfile


@dataclass(frozen=True, kw_only=True)
class TextProfile(ModelProfile):
    """A language model without a vision encoder."""

    hf_model_class: ClassVar[str | None] = "Qwen2ForCausalLM"  # the builtin tokenizer's; any *ForCausalLM works
