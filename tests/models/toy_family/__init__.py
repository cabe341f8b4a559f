"""A toy model family, whole in this one package (registered by tests/models/test_new_family.py with one
``register_family`` line, as ``packer.models.FAMILIES`` registers the builtin ones).

Every image becomes 9 tokens, whatever its size: a 48 px square cut into 3x3 patches of 16 px, one token each.
Its placeholder is its own, ``<|vision_pad|>`` (a special token of the builtin Qwen2 tokenizer that no builtin
family uses), its positions are 1-D, and its pixel values travel under its own batch key.

    profile.py   the build side: 9 tokens per image, 1-D positions
    reader.py    the reader side: pixels (N, 3, 48, 48) in [0, 1] under ``toy_pixel_values``
"""

from tests.models.toy_family.profile import ToyProfile

PROFILES = (ToyProfile(name="toy"),)
