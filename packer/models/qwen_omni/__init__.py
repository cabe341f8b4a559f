"""Qwen2.5-Omni's thinker (docs/models/qwen_omni.md): audio, images, video with its sound, time-aligned mRoPE.

    profile.py     counts from headers, the interleaved layout of a video with its sound, verify's rules
    rope.py        get_rope_index's positions, get_chunked_index, the audio token count
    reader.py      rows -> the thinker's inputs (images, videos; audio refused until the shards carry it)
    proof.py       a tiny Qwen2_5OmniThinkerForConditionalGeneration
    tokenizers.py  the builtin qwen2.5-omni (Qwen2's vocabulary, Omni's added tokens, its chat template)
"""

from packer.models.qwen_omni.profile import QwenOmniProfile
from packer.models.qwen_omni.tokenizers import TOKENIZERS

PROFILES = (QwenOmniProfile(name="qwen2.5-omni"),)

__all__ = ["PROFILES", "TOKENIZERS", "QwenOmniProfile"]
