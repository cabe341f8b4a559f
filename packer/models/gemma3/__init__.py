"""Gemma 3 (docs/models/gemma3.md): 256 bidirectional tokens per image, pan-and-scan crops, sliding windows."""

from packer.models.gemma3.profile import Gemma3Profile
from packer.models.gemma3.tokenizers import TOKENIZERS

PROFILES = (Gemma3Profile(name="gemma3"),)

__all__ = ["PROFILES", "TOKENIZERS", "Gemma3Profile"]
