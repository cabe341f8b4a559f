"""The tokens of an image's run besides ``[IMG]`` (PixtralProcessor's defaults): a leaf the profile and the proof
both import (no profile <-> proof cycle)."""

IMAGE_BREAK = "[IMG_BREAK]"
"""After every row of an image's ``[IMG]`` tokens but the last (PixtralProcessor's ``image_break_token``)."""
IMAGE_END = "[IMG_END]"
"""In place of the last row's ``[IMG_BREAK]`` (``image_end_token``)."""
