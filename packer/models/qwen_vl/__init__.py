"""Qwen2-VL, Qwen2.5-VL, Qwen3-VL and Qwen3.5 (docs/models/qwen_vl.md): dynamic resolution, 3-D mRoPE, video.

    profile.py       Qwen2-VL / Qwen2.5-VL profiles: smart_resize grids, mRoPE, video plans, tiny models
    qwen3.py         Qwen3-VL: 16-px patches, per-frame timestamped video runs
    qwen35.py        Qwen3.5 (dense, MoE): hybrid linear attention, made exact by packer.train.linear_state
    (shared with Qwen2.5-Omni, in packer/models/shared/: qwen_resize.py smart_resize, qwen_video_plan.py
    qwen-vl-utils' frame sampling + the HF video processor's sizes from a clip's header, qwen_video_pixels.py the
    video processor's pixels without torchvision)
    tokenizers.py    builtin tokenizers qwen2-vl, qwen2.5, qwen3-vl, qwen3.5-standin (a stand-in)
"""

from packer.models.qwen_vl.profile import Qwen25VLProfile, QwenVLProfile
from packer.models.qwen_vl.qwen3 import Qwen3VLProfile
from packer.models.qwen_vl.qwen35 import Qwen35Profile
from packer.models.qwen_vl.tokenizers import TOKENIZERS

PROFILES = (
    QwenVLProfile(name="qwen2-vl"),
    Qwen25VLProfile(name="qwen2.5-vl", tokens_per_second=2),
    Qwen3VLProfile(name="qwen3-vl"),
    Qwen35Profile(name="qwen3.5"),
    Qwen35Profile(name="qwen3.5-moe", moe=True),
)

__all__ = ["PROFILES", "TOKENIZERS", "Qwen25VLProfile", "Qwen35Profile", "Qwen3VLProfile", "QwenVLProfile"]
