"""Molmo2's builtin tokenizer ``molmo2``: a STAND-IN (no package ships the real one). Qwen3's vocabulary as in
``qwen3-vl`` (Molmo2-8B's LLM is Qwen3), then Molmo2's ten image/video tokens (``MOLMO2_TOKENS``, special, ids
151669-151678; the real checkpoints put them at 151936.., past Qwen3's padded vocabulary), ``bos_token``
``<|endoftext|>`` (Molmo2's processor prepends bos, or eos without one) and a ChatML template in which an image
part renders as Molmo2's placeholder ``<|image|>`` (``MOLMO2_CHAT_TEMPLATE``). Token counts and expansions are
the real Molmo2 processor's; the ids of its tokens are not the checkpoints'.
"""

from __future__ import annotations

from packer.models.shared.qwen_vocab import QWEN2_VL_SPECIAL_TOKENS, QWEN3_EXTRA_TOKENS, QWEN25_EXTRA_TOKENS
from packer.models.shared.tokenizer import AddedTokens, ChatMLRenderer, TokenizerSpec

# Molmo2's image/video tokens (Molmo2Processor.image_token_ids, its <|image|> / <|video|> placeholders), in
# the order Molmo2Config's default ids imply: <im_start>, <im_end>, <im_patch> first, <low_res_im_start> 4th
# after them, <frame_start> / <frame_end> 7th / 8th (the unnamed ones fill the gaps).
MOLMO2_TOKENS = (
    "<im_start>",
    "<im_end>",
    "<im_patch>",
    "<im_col>",
    "<low_res_im_start>",
    "<|image|>",
    "<im_low>",
    "<frame_start>",
    "<frame_end>",
    "<|video|>",
)
MOLMO2_FIRST_ID = 151669  # right after Qwen3's added tokens
# Every token an image's run may hold (Molmo2Processor.image_token_ids): mm_token_type_ids 1, bidirectional.
IMAGE_RUN_TOKENS = ("<im_patch>", "<im_col>", "<im_start>", "<low_res_im_start>", "<im_end>")
FRAME_TOKENS = ("<frame_start>", "<frame_end>")  # a video frame's run: the same, around <im_patch> only

# The stand-in's template: ChatML without a default system prompt, bos first, an image part -> <|image|>.
MOLMO2_CHAT_TEMPLATE = (
    "{{ bos_token }}{% for message in messages %}<|im_start|>{{ message['role'] }}\n"
    "{% if message['content'] is string %}{{ message['content'] }}"
    "{% else %}{% for content in message['content'] %}"
    "{% if content['type'] == 'image' or 'image' in content %}<|image|>"
    "{% elif content['type'] == 'video' or 'video' in content %}<|video|>"
    "{% elif 'text' in content %}{{ content['text'] }}{% endif %}{% endfor %}{% endif %}<|im_end|>\n"
    "{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)


TOKENIZERS = (
    TokenizerSpec(
        name="molmo2", ranks="qwen2",
        added=(AddedTokens(QWEN2_VL_SPECIAL_TOKENS), AddedTokens(QWEN25_EXTRA_TOKENS + QWEN3_EXTRA_TOKENS, special=False),
               AddedTokens(MOLMO2_TOKENS)),
        eos_token="<|im_end|>", pad_token="<|endoftext|>", bos_token="<|endoftext|>",
        additional_special_tokens=QWEN2_VL_SPECIAL_TOKENS + MOLMO2_TOKENS, chat_template=MOLMO2_CHAT_TEMPLATE,
        # ChatML after bos_token: text, image and video turns in pure Python (encode/templates.py)
        fast_renderer=ChatMLRenderer(default_system="", image="<|image|>", video="<|video|>", bos=True),
    ),
)
