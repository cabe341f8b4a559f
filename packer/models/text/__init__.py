"""Language models without vision (docs/models/text.md), and the builtin ``llama3`` tokenizer."""

from packer.models.text.profile import TextProfile
from packer.models.text.tokenizers import TOKENIZERS

PROFILES = (TextProfile(name="text"),)

__all__ = ["PROFILES", "TOKENIZERS", "TextProfile"]
