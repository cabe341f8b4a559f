"""InternVL 2.5 / 3 (docs/models/internvl.md): 448-px tiles plus a thumbnail, ``<img>``...``</img>``."""

from packer.models.internvl.profile import InternVLProfile, num_tiles, tile_layout
from packer.models.internvl.tokenizers import TOKENIZERS

PROFILES = (InternVLProfile(name="internvl"),)

__all__ = ["PROFILES", "TOKENIZERS", "InternVLProfile", "num_tiles", "tile_layout"]
