"""SmolVLM (docs/models/smolvlm.md): Idefics3-style splitting into tiles + a global view, ``<row_i_col_j>`` tokens."""

from packer.models.smolvlm.profile import SmolVLMProfile, prompt_string, tile_grid
from packer.models.smolvlm.tokenizers import TOKENIZERS

PROFILES = (SmolVLMProfile(name="smolvlm"),)

__all__ = ["PROFILES", "TOKENIZERS", "SmolVLMProfile", "prompt_string", "tile_grid"]
