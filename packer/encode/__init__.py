"""Example -> Encoded: chat template, tokenizer, labels, images and positions.

encoder.py (``Encoder``) runs the steps; templates.py renders conversations and locates message content;
tokenize.py calls the tokenizer and maps characters to tokens; labels.py is the loss rule; tokenizers.py
loads tokenizers offline. This module imports nothing heavy: config and cli read ``OVERLONG_POLICIES``.
"""

OVERLONG_POLICIES = ("drop", "truncate")
"""What to do with an example longer than ``max_length``: ``drop`` rejects it (reason ``overlong``),
``truncate`` keeps its first ``max_length`` tokens, never cutting inside an image."""
