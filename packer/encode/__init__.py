"""Example -> Encoded: chat template, tokenizer, labels, images and positions.

encoder.py (``Encoder``) orchestrates the stages: render.py renders conversations (templates.py locates message
content), draft.py tokenizes a batch (tokenize.py), labels it (labels.py, the loss rule) and joins trees,
media.py expands each media placeholder into its family's run, lengths.py applies the length policies (split.py
cuts a long text into chunks); each stage reads the ``EncodeContext`` the Encoder hands it (context.py: the
tokenizer view, the profile, the length numbers), never the Encoder; tokenizers.py loads tokenizers offline. This module imports nothing heavy: config
and cli read ``OVERLONG_POLICIES`` and ``LONG_DOCS_POLICIES``.
"""

OVERLONG_POLICIES = ("drop", "truncate", "truncate_left", "keep_last_turns")
"""What to do with an example longer than ``max_length`` (docs/format.md, "Over-long examples"):

- ``drop`` rejects it (reason ``overlong``); ms-swift's ``truncation_strategy="delete"``.
- ``truncate`` keeps its first ``max_length`` tokens, never cutting inside an image (TRL ``keep_start``,
  ms-swift ``right``).
- ``truncate_left`` keeps the end: a text record its last ``max_length`` tokens (TRL ``keep_end``, ms-swift
  ``left``); a conversation drops whole early turns as ``keep_last_turns`` does, since a token cut from the
  left would remove the system prompt, a role header or an image's start.
- ``keep_last_turns`` drops whole early turns of a conversation (never a system message; the first turn kept
  starts at a user message); a text record is cut as ``truncate`` (it has no turns).

Each rejects with ``untruncatable`` when what it would keep carries no loss, or still does not fit."""

LONG_DOCS_POLICIES = ("off", "split")
"""``text`` records longer than ``max_length``: ``off`` follows ``overlong`` (today's behaviour), ``split``
cuts them into chunks of ``max_length`` tokens (``long_docs_overlap`` tokens shared by consecutive chunks),
each its own example ``path:line@k`` (split.py)."""
