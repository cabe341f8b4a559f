"""LLaVA-OneVision (docs/models/llava_onevision.md): anyres tiling decided by the images on each path."""

from packer.models.llava_onevision.anyres import anyres_pinpoints
from packer.models.llava_onevision.profile import LlavaOnevisionProfile
from packer.models.llava_onevision.tokenizers import TOKENIZERS

PROFILES = (LlavaOnevisionProfile(name="llava-onevision"),)

__all__ = ["PROFILES", "TOKENIZERS", "LlavaOnevisionProfile", "anyres_pinpoints"]
