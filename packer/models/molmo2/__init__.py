"""Molmo2 (docs/models/molmo2.md): overlapping crops laid out row by row, one bidirectional image block, video."""

from packer.models.molmo2.profile import Molmo2Profile
from packer.models.molmo2.tokenizers import TOKENIZERS

PROFILES = (Molmo2Profile(name="molmo2"),)

__all__ = ["PROFILES", "TOKENIZERS", "Molmo2Profile"]
