"""InternVL's builtin tokenizer ``internvl3``: InternVL3-hf's tokenizer as transformers' InternVL conversion
script builds it. Qwen2.5-VL's (the ``qwen2.5`` vocabulary and added tokens) plus InternVL's special tokens
``<img>`` = 151665, ``</img>``, ``<IMG_CONTEXT>`` = 151667 (InternVLConfig's image_token_id), ``<quad>``,
``</quad>``, ``<ref>``, ``</ref>``, ``<box>``, ``</box>`` = 151673, the ``extra_special_tokens``
InternVLProcessor reads, and the conversion's chat template (one ``<IMG_CONTEXT>`` per image; no default system
turn). A stand-in in one detail: ``<video>`` (151674 here) is added so the processor's video token exists;
video is not packed for InternVL yet.
"""

from __future__ import annotations

from packer.models.shared.qwen_vocab import QWEN2_VL_SPECIAL_TOKENS, QWEN25_EXTRA_TOKENS
from packer.models.shared.tokenizer import AddedTokens, ChatMLRenderer, TokenizerSpec

# InternVL's tokens, appended after Qwen2.5's 22 in this order (151665-151673), then <video> (see above).
INTERNVL_SPECIAL_TOKENS = ("<img>", "</img>", "<IMG_CONTEXT>", "<quad>", "</quad>", "<ref>", "</ref>", "<box>", "</box>")
INTERNVL_FIRST_ID = 151665
INTERNVL_EXTRA_SPECIAL = {"start_image_token": "<img>", "end_image_token": "</img>",
                          "context_image_token": "<IMG_CONTEXT>", "video_token": "<video>"}
# transformers' convert_internvl_weights_to_hf.py chat_template (InternVL*-hf processors and tokenizers).
INTERNVL_CHAT_TEMPLATE = (
    "{% for message in messages %}{{'<|im_start|>' + message['role'] + '\n'}}"
    "{% if message['content'] is string %}{{ message['content'] }}"
    "{% else %}{% for content in message['content'] %}"
    "{% if content['type'] == 'image' %}{{ '<IMG_CONTEXT>\n' }}"
    "{% elif content['type'] == 'video' %}{{ '<video>\n' }}"
    "{% elif content['type'] == 'text' %}{{ content['text'] }}{% endif %}{% endfor %}{% endif %}"
    "{{'<|im_end|>\n'}}{% endfor %}"
    "{% if add_generation_prompt %}{{'<|im_start|>assistant\n' }}{% endif %}"
)


TOKENIZERS = (
    TokenizerSpec(
        name="internvl3", ranks="qwen2",
        added=(AddedTokens(QWEN2_VL_SPECIAL_TOKENS), AddedTokens(QWEN25_EXTRA_TOKENS, special=False),
               AddedTokens((*INTERNVL_SPECIAL_TOKENS, "<video>"))),
        eos_token="<|im_end|>", pad_token="<|endoftext|>",
        additional_special_tokens=(*QWEN2_VL_SPECIAL_TOKENS, *INTERNVL_SPECIAL_TOKENS, "<video>"),
        extra_special_tokens=tuple(INTERNVL_EXTRA_SPECIAL.items()), chat_template=INTERNVL_CHAT_TEMPLATE,
        fast_renderer=ChatMLRenderer(default_system="", image="<IMG_CONTEXT>\n", video="<video>\n"),
    ),
)
