"""Text-only models: no images (a record that names one is rejected), 1-D positions, no pixel values.

Everything is ``ModelProfile``'s default: the base class is a model without vision.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from packer.models.base import ModelProfile

if TYPE_CHECKING:
    from packer.models.proof import Proof
    from packer.models.reader import Reader


@dataclass(frozen=True, kw_only=True)
class TextProfile(ModelProfile):
    """A language model without a vision encoder."""

    def reader(self) -> Reader:
        from packer.models.reader import Reader

        return Reader(self)

    def proof(self) -> Proof:
        from packer.models.text.proof import TextProof

        return TextProof(self)
