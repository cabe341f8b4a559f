"""LLaVA-1.5 (docs/models/llava.md): a fixed 336-px CLIP, 576 tokens per image."""

from packer.models.llava.profile import LlavaProfile

PROFILES = (LlavaProfile(name="llava"),)

__all__ = ["PROFILES", "LlavaProfile"]
