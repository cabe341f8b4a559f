"""Gemma 4 (docs/models/gemma4.md): images as up to 280 soft tokens by their size, videos as 32 time-stamped frames."""

from packer.models.gemma4.profile import Gemma4Profile
from packer.models.gemma4.tokenizers import TOKENIZERS

PROFILES = (Gemma4Profile(name="gemma4"),)

__all__ = ["PROFILES", "TOKENIZERS", "Gemma4Profile"]
