"""Llama 4 (docs/models/llama4.md): image tiles of a best-fit canvas with a global tile, ``<|patch|>`` runs between
tile separators; Meta's real Llama 4 tokenizer; chunked local attention counted along each tree path."""

from packer.models.llama4.profile import Llama4Profile, canvas, image_tokens, supported_canvases
from packer.models.llama4.tokenizers import TOKENIZERS

PROFILES = (Llama4Profile(name="llama4"),)

__all__ = ["PROFILES", "TOKENIZERS", "Llama4Profile", "canvas", "image_tokens", "supported_canvases"]
