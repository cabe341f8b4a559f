"""Mistral 3 / Pixtral (docs/models/mistral3.md): variable resolution, ``[IMG]`` per merged patch, ``[IMG_BREAK]``
after each row, ``[IMG_END]`` at the end; Mistral's real tekken vocabulary."""

from packer.models.mistral3.profile import Mistral3Profile, image_tokens, token_grid
from packer.models.mistral3.tokenizers import TOKENIZERS

PROFILES = (Mistral3Profile(name="mistral3"),)

__all__ = ["PROFILES", "TOKENIZERS", "Mistral3Profile", "image_tokens", "token_grid"]
