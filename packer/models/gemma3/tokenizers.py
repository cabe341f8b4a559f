"""Gemma 3's builtin tokenizer ``gemma3``: a STAND-IN (Gemma's SentencePiece model is on no registry). The
Qwen2 ranks, then Gemma 3's special tokens (``<bos>``, ``<start_of_turn>``, ``<end_of_turn>``,
``<start_of_image>``, ``<image_soft_token>``, ``<end_of_image>``, ...) appended with ids of their own, and Gemma
3's chat template. Token ids are not Gemma's; the structure around images (what the processor and the model
read) is.
"""

from __future__ import annotations

from packer.models.shared.tokenizer import AddedTokens, GemmaRenderer, TokenizerSpec

# Gemma 3's special tokens, appended after the Qwen2 ranks (151643-151650): a stand-in, not Gemma's ids.
# No <unk>: the Qwen2 ranks hold that string as an ordinary token (128244), and byte-level BPE never needs one.
GEMMA3_SPECIAL_TOKENS = ("<pad>", "<eos>", "<bos>", "<start_of_turn>", "<end_of_turn>",
                         "<start_of_image>", "<end_of_image>", "<image_soft_token>")

# Gemma 3 instruct's chat template (google/gemma-3-*-it tokenizer_config.json), with one change: an image part
# is written as the processor's expansion of <start_of_image> ("\n\n<start_of_image>" + soft tokens +
# "<end_of_image>\n\n", Gemma3Processor.full_image_sequence) with ONE soft token, which the gemma3 profile
# repeats 256 times; so the rendering equals the processor's text before tokenization.
GEMMA3_CHAT_TEMPLATE = (
    "{{ bos_token }}\n"
    "{%- if messages[0]['role'] == 'system' -%}\n"
    "    {%- if messages[0]['content'] is string -%}\n"
    "        {%- set first_user_prefix = messages[0]['content'] + '\n\n' -%}\n"
    "    {%- else -%}\n"
    "        {%- set first_user_prefix = messages[0]['content'][0]['text'] + '\n\n' -%}\n"
    "    {%- endif -%}\n"
    "    {%- set loop_messages = messages[1:] -%}\n"
    "{%- else -%}\n"
    "    {%- set first_user_prefix = \"\" -%}\n"
    "    {%- set loop_messages = messages -%}\n"
    "{%- endif -%}\n"
    "{%- for message in loop_messages -%}\n"
    "    {%- if (message['role'] == 'user') != (loop.index0 % 2 == 0) -%}\n"
    "        {{ raise_exception(\"Conversation roles must alternate user/assistant/user/assistant/...\") }}\n"
    "    {%- endif -%}\n"
    "    {%- if (message['role'] == 'assistant') -%}\n"
    "        {%- set role = \"model\" -%}\n"
    "    {%- else -%}\n"
    "        {%- set role = message['role'] -%}\n"
    "    {%- endif -%}\n"
    "    {{ '<start_of_turn>' + role + '\n' + (first_user_prefix if loop.first else \"\") }}\n"
    "    {%- if message['content'] is string -%}\n"
    "        {{ message['content'] | trim }}\n"
    "    {%- elif message['content'] is iterable -%}\n"
    "        {%- for item in message['content'] -%}\n"
    "            {%- if item['type'] == 'image' -%}\n"
    "                {{ '\n\n<start_of_image><image_soft_token><end_of_image>\n\n' }}\n"
    "            {%- elif item['type'] == 'text' -%}\n"
    "                {{ item['text'] | trim }}\n"
    "            {%- endif -%}\n"
    "        {%- endfor -%}\n"
    "    {%- else -%}\n"
    "        {{ raise_exception(\"Invalid content type\") }}\n"
    "    {%- endif -%}\n"
    "    {{ '<end_of_turn>\n' }}\n"
    "{%- endfor -%}\n"
    "{%- if add_generation_prompt -%}\n"
    "    {{'<start_of_turn>model\n'}}\n"
    "{%- endif -%}\n"
)


TOKENIZERS = (
    TokenizerSpec(
        name="gemma3", ranks="qwen2", added=(AddedTokens(GEMMA3_SPECIAL_TOKENS),),
        eos_token="<eos>", pad_token="<pad>", bos_token="<bos>", additional_special_tokens=GEMMA3_SPECIAL_TOKENS,
        # what Gemma3Processor reads off its tokenizer (tokenizer.boi_token, .image_token_id, ...)
        extra_special_tokens=(("boi_token", "<start_of_image>"), ("eoi_token", "<end_of_image>"),
                              ("image_token", "<image_soft_token>")),
        model_max_length=131072, chat_template=GEMMA3_CHAT_TEMPLATE,
        # alternating user / model turns in pure Python (encode/templates.py; anything else is Jinja's)
        fast_renderer=GemmaRenderer(image="\n\n<start_of_image><image_soft_token><end_of_image>\n\n"),
    ),
)
