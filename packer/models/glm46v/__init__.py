"""GLM-4.6V (docs/models/glm46v.md): GLM's smart_resize, 2x2 patch merging, 3-D mRoPE, timestamped video runs.

    profile.py     the profile: counts, runs, positions (shared.mrope, Qwen2-VL's rule = GLM's), verify's rules
    resize.py      GLM-4.6V's smart_resize (frames x area bounded)
    video.py       Glm46VVideoProcessor's frame sampling and Glm46VProcessor's video text, from a clip's header
    reader.py      the model's inputs: images (PIL processor), videos in torch, both as images
    proof.py       a tiny Glm46VForConditionalGeneration, one path alone as Glm46VProcessor gives it
    tokenizers.py  the builtin stand-in tokenizer glm-4.6v
"""

from packer.models.glm46v.profile import Glm46VProfile
from packer.models.glm46v.tokenizers import TOKENIZERS

PROFILES = (Glm46VProfile(name="glm-4.6v"),)

__all__ = ["PROFILES", "TOKENIZERS", "Glm46VProfile"]
