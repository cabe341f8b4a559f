"""The Qwen2 vocabulary's added tokens, shared by every family whose language model is a Qwen (Qwen-VL, and the
InternVL, Molmo2 and LLaVA-OneVision LLMs): the ``qwen2`` ranks (``shared.tokenizer.RANKS``) end at 151642,
and these follow with their real ids.
"""

from __future__ import annotations

# Appended in this order so each gets its real Qwen2-VL id: <|endoftext|> = 151643 ... <|video_pad|> = 151656.
QWEN2_VL_SPECIAL_TOKENS = (
    "<|endoftext|>",
    "<|im_start|>",
    "<|im_end|>",
    "<|object_ref_start|>",
    "<|object_ref_end|>",
    "<|box_start|>",
    "<|box_end|>",
    "<|quad_start|>",
    "<|quad_end|>",
    "<|vision_start|>",
    "<|vision_end|>",
    "<|vision_pad|>",
    "<|image_pad|>",
    "<|video_pad|>",
)
QWEN2_VL_FIRST_SPECIAL_ID = 151643

# Qwen2.5 adds these after Qwen2-VL's 14, not special (ids 151657-151664), per its tokenizer_config.json.
QWEN25_EXTRA_TOKENS = (
    "<tool_call>",
    "</tool_call>",
    "<|fim_prefix|>",
    "<|fim_middle|>",
    "<|fim_suffix|>",
    "<|fim_pad|>",
    "<|repo_name|>",
    "<|file_sep|>",
)

# Qwen3 adds these after Qwen2.5's 22, not special (ids 151665-151668), per Qwen3's tokenizer_config.json.
QWEN3_EXTRA_TOKENS = ("<tool_response>", "</tool_response>", "<think>", "</think>")
