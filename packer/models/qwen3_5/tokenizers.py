"""The builtin ``qwen3.5-standin``: a STAND-IN for Qwen3.5's tokenizer, which ships on no package registry.

Qwen3.5's real vocabulary has 248,320 entries (its own BPE, a pre-tokenizer that also keeps combining marks
``\\p{M}`` with letters, ``<|image_pad|>`` = 248056; transformers' ``Qwen3_5Tokenizer`` and ``Qwen3_5Config``),
and only a checkpoint directory carries it. The stand-in is Qwen3's vocabulary: the Qwen2 ranks
(``shared.tokenizer.RANKS["qwen2"]``) with Qwen3's 26 added tokens at Qwen3's ids (``<|im_end|>`` 151645,
``<think>`` 151667), and the Qwen3-VL-Instruct ChatML template (``shared.qwen_vocab.QWEN3_VL_CHAT_TEMPLATE``; no
default system prompt, tools, no thinking blocks). Packing and its exactness do not depend on the vocabulary,
so the proof and the tests run on it; to train a real Qwen3.5, pass its tokenizer directory (``--tokenizer
/path/to/Qwen3.5-9B``): the ids then are Qwen3.5's own.
"""

from __future__ import annotations

from packer.models.shared.qwen_vocab import (
    QWEN2_VL_SPECIAL_TOKENS,
    QWEN3_EXTRA_TOKENS,
    QWEN3_VL_CHAT_TEMPLATE,
    QWEN25_EXTRA_TOKENS,
)
from packer.models.shared.tokenizer import AddedTokens, TokenizerSpec

TOKENIZERS = (
    TokenizerSpec(
        name="qwen3.5-standin", ranks="qwen2",
        added=(AddedTokens(QWEN2_VL_SPECIAL_TOKENS), AddedTokens(QWEN25_EXTRA_TOKENS + QWEN3_EXTRA_TOKENS, special=False)),
        eos_token="<|im_end|>", pad_token="<|endoftext|>", additional_special_tokens=QWEN2_VL_SPECIAL_TOKENS,
        chat_template=QWEN3_VL_CHAT_TEMPLATE,
    ),
)
