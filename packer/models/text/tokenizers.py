"""The builtin ``llama3`` tokenizer: Llama-3's real tokenizer, from Meta's own PyPI package ``llama-models``
(0.3.0): ``llama_models/llama3/tokenizer.model`` holds the 128,000 tiktoken BPE ranks, and that package's
``Tokenizer`` names the 256 special tokens (128000 ``<|begin_of_text|>`` ... ``<|start_header_id|>`` 128006,
``<|end_header_id|>`` 128007, ``<|eot_id|>`` 128009; the chat tokens have the same ids in Llama 3, 3.1 and 3.2,
whose reserved names differ). The chat template is Meta-Llama-3-Instruct's (``LLAMA3_CHAT_TEMPLATE``);
``<|eot_id|>`` ends a turn and is the eos token ("Hello world!" -> [9906, 1917, 0]; with special tokens, as
transformers' ``Llama3Converter`` post-processor adds them: [128000, 9906, 1917, 0]).
"""

from __future__ import annotations

from packer.models.shared.tokenizer import AddedTokens, TokenizerSpec

# llama_models.llama3.tokenizer.Tokenizer's special tokens (ids 128000..), then reserved ones up to 256.
LLAMA3_SPECIAL_TOKENS = (
    "<|begin_of_text|>", "<|end_of_text|>", "<|reserved_special_token_0|>", "<|reserved_special_token_1|>",
    "<|finetune_right_pad_id|>", "<|step_id|>", "<|start_header_id|>", "<|end_header_id|>", "<|eom_id|>",
    "<|eot_id|>", "<|python_tag|>", "<|image|>",
)
LLAMA3_SPECIAL_TOKENS += tuple(f"<|reserved_special_token_{2 + i}|>" for i in range(256 - len(LLAMA3_SPECIAL_TOKENS)))
LLAMA3_BASE_TOKENS = 128000
# Meta-Llama-3-8B-Instruct's chat template (tokenizer_config.json "chat_template").
LLAMA3_CHAT_TEMPLATE = (
    "{% set loop_messages = messages %}{% for message in loop_messages %}"
    "{% set content = '<|start_header_id|>' + message['role'] + '<|end_header_id|>\n\n'+ message['content'] "
    "| trim + '<|eot_id|>' %}{% if loop.index0 == 0 %}{% set content = bos_token + content %}{% endif %}"
    "{{ content }}{% endfor %}{% if add_generation_prompt %}"
    "{{ '<|start_header_id|>assistant<|end_header_id|>\n\n' }}{% endif %}"
)


TOKENIZERS = (
    TokenizerSpec(
        name="llama3", ranks="llama3", added=(AddedTokens(LLAMA3_SPECIAL_TOKENS),),
        bos_token="<|begin_of_text|>", eos_token="<|eot_id|>", model_max_length=8192,
        chat_template=LLAMA3_CHAT_TEMPLATE,
    ),
)
