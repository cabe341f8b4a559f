"""Qwen2-Audio (docs/models/qwen2_audio.md): a Whisper-large-v3 audio encoder before a Qwen LLM; audio and text.

    profile.py     counts from headers (30 s windows, the conv/pool rule), verify's rules
    (reader: the default one, models/reader.py: Whisper log-mel in numpy)
    proof.py       a tiny Qwen2AudioForConditionalGeneration
    tokenizers.py  the builtin qwen2-audio (Qwen2's vocabulary, Qwen2-Audio's added tokens, its chat template)
"""

from packer.models.qwen2_audio.profile import Qwen2AudioProfile
from packer.models.qwen2_audio.tokenizers import TOKENIZERS

PROFILES = (Qwen2AudioProfile(name="qwen2-audio"),)

__all__ = ["PROFILES", "TOKENIZERS", "Qwen2AudioProfile"]
