"""LLaVA-OneVision's builtin tokenizer ``llava-onevision`` (llava-hf/llava-onevision-qwen2-*-ov-hf's
vocabulary): the Qwen2 ranks, then ``<|endoftext|>``, ``<|im_start|>``, ``<|im_end|>``, ``<image>``, ``<video>`` at
151643-151647 (the model config's image_token_index = 151646, video_token_index = 151647), and a ChatML template
that writes each image part as ``<image>`` where it stands (``LLAVA_ONEVISION_CHAT_TEMPLATE`` says how it differs
from the hub's).
"""

from __future__ import annotations

from packer.models.shared.tokenizer import AddedTokens, ChatMLRenderer, TokenizerSpec

# LLaVA-OneVision's added tokens after the Qwen2 ranks, ids 151643-151647 (llava-hf's OneVision tokenizers).
LLAVA_ONEVISION_SPECIAL_TOKENS = ("<|endoftext|>", "<|im_start|>", "<|im_end|>", "<image>", "<video>")

# ChatML with each image part written as "<image>\n" where it stands. The hub's chat_template.json writes a
# message's images first, then "\n" + each text part; that reorders parts, which packer's content spans do not
# follow (pass it with --chat-template to train on exactly its rendering: packer then renders prefixes).
LLAVA_ONEVISION_CHAT_TEMPLATE = (
    "{% for message in messages %}<|im_start|>{{ message['role'] }}\n"
    "{% if message['content'] is string %}{{ message['content'] }}"
    "{% else %}{% for content in message['content'] %}"
    "{% if content['type'] == 'image' %}<image>\n{% elif content['type'] == 'video' %}<video>\n"
    "{% elif 'text' in content %}{{ content['text'] }}{% endif %}{% endfor %}{% endif %}<|im_end|>\n{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)


TOKENIZERS = (
    TokenizerSpec(
        name="llava-onevision", ranks="qwen2", added=(AddedTokens(LLAVA_ONEVISION_SPECIAL_TOKENS),),
        eos_token="<|im_end|>", pad_token="<|endoftext|>", additional_special_tokens=LLAVA_ONEVISION_SPECIAL_TOKENS,
        extra_special_tokens=(("image_token", "<image>"), ("video_token", "<video>")), model_max_length=131072,
        chat_template=LLAVA_ONEVISION_CHAT_TEMPLATE,
        fast_renderer=ChatMLRenderer(default_system="", image="<image>\n", video="<video>\n"),
    ),
)
