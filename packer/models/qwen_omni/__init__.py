"""Qwen2.5-Omni's and Qwen3-Omni's thinkers (docs/models/qwen_omni.md): audio, images, video with its sound,
time-aligned mRoPE.

    profile.py     counts from headers, the interleaved layout of a video with its sound, verify's rules
    rope.py        get_rope_index's positions, get_chunked_index, the audio token count
    qwen3.py       Qwen3-Omni: clips padded per example, 16 px patches, its video rule, float positions
    rope3.py       Qwen3-Omni's audio count, its video-with-sound layout and float32 get_rope_index
    reader.py      rows -> the thinker's inputs (images, videos, the base Reader's audio features)
    proof.py       a tiny Qwen2_5OmniThinkerForConditionalGeneration / Qwen3OmniMoeThinkerForConditionalGeneration
    tokenizers.py  the builtins qwen2.5-omni and qwen3-omni (Qwen2's vocabulary, each Omni's added tokens, templates)
"""

from packer.models.qwen_omni.profile import QwenOmniProfile
from packer.models.qwen_omni.qwen3 import Qwen3OmniProfile
from packer.models.qwen_omni.tokenizers import TOKENIZERS

PROFILES = (QwenOmniProfile(name="qwen2.5-omni"), Qwen3OmniProfile(name="qwen3-omni"))

__all__ = ["PROFILES", "TOKENIZERS", "Qwen3OmniProfile", "QwenOmniProfile"]
