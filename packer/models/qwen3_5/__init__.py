"""Qwen3.5 (docs/models/qwen3_5.md): hybrid linear attention (Gated DeltaNet layers between full-attention layers),
dense and MoE, text and message trees; the linear layers are made exact on packed rows by
``packer.train.linear_state`` (state forking at every branch).

    profile.py      the text profiles (1-D positions; Qwen3.5 repeats them over its 4 rope rows)
    proof.py        tiny Qwen3_5ForCausalLM / Qwen3_5MoeForCausalLM: 3 linear-attention layers + 1 full
    tokenizers.py   the builtin stand-in qwen3.5-standin (Qwen3's vocabulary on the Qwen2 ranks)
"""

from packer.models.qwen3_5.profile import Qwen35Profile
from packer.models.qwen3_5.tokenizers import TOKENIZERS

PROFILES = (
    Qwen35Profile(name="qwen3.5"),
    Qwen35Profile(name="qwen3.5-moe", moe=True),
)

__all__ = ["PROFILES", "TOKENIZERS", "Qwen35Profile"]
