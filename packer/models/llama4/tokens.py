"""The tokens of an image's run besides ``<|image|>`` (Llama4Processor's defaults): a leaf the profile and the proof
both import (no profile <-> proof cycle)."""

IMAGE_START = "<|image_start|>"
"""The run's first token (``Llama4Processor``'s ``start_of_image_token``; the config's ``boi_token_index``)."""
IMAGE_END = "<|image_end|>"
"""The run's last token (``end_of_image_token``; ``eoi_token_index``)."""
PATCH = "<|patch|>"
"""One per image feature (``patch_token``): the token the model replaces (``image_token_index``)."""
TILE_X = "<|tile_x_separator|>"
"""Between two tiles of a row (``tile_x_separator_token``)."""
TILE_Y = "<|tile_y_separator|>"
"""After each row of tiles (``tile_y_separator_token``)."""
