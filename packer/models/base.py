"""``ModelProfile``: the protocol a model family implements, composed from rules (``packer/models/rules.py``).
One family is one package (``packer/models/<family>/``); its profile subclasses this, says which rules it uses,
and its reader and proof subclass ``Reader`` (reader.py) and ``Proof`` (proof.py).

    fields       name, default_tokenizer, image_token, video_token, audio_token, bidirectional_images
    class vars   forward_keys, overridable
    rules        image (ImageRule | None), video (VideoRule | None), audio (AudioRule | None), positions (Positions)
    hooks        media_runs(media, node_parents)   what one example's placeholders become, the media together
                 reader() -> Reader                 rows -> the model's inputs (torch; reader.py)
                 proof() -> Proof                   the model class, a tiny model, one path's inputs (proof.py)

Who asks what: the encoder asks each rule's ``plan`` / ``run`` (``media_runs`` by default) and ``positions.extra``;
verify and stats loop over the media (``packer.core.media``) and ask each rule's ``tokens`` / ``faults`` /
``spans`` and ``positions.expected``; collate and ``packer inspect --mask`` ask ``bidirectional_spans`` (the image
rule's). The base class is a model without vision or audio (the ``text`` family): every medium None, flat positions.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, ClassVar

import numpy as np

from packer.core.types import AudioRef, ImageRef, VideoRef
from packer.errors import RecordError
from packer.media.video import VideoPlan
from packer.models.registry import no_medium, profiles_with
from packer.models.rules import (
    AudioPlan,
    AudioRule,
    ImageBlocks,
    ImageRule,
    Media,
    MediaRun,
    Positions,
    VideoRule,
)

__all__ = ["AudioPlan", "ImageBlocks", "Media", "MediaRun", "ModelProfile", "bidirectional_spans", "image_blocks"]

FLAT = Positions()
"""The positions rule of a model without mRoPE: 1-D positions alone."""


@dataclass(frozen=True, kw_only=True)
class ModelProfile:
    """One model family's profile under one name (``packer.models.get_profile``)."""

    name: str
    """Profile name, as given to ``--profile``."""
    default_tokenizer: str | None = "qwen2-vl"
    """Tokenizer used when the build names none; None where no honest default exists (the build must name one)."""
    image_token: str | None = None
    """The placeholder the chat template writes once per image; None for a model without vision."""
    video_token: str | None = None
    """The placeholder the template writes once per video (Qwen: ``<|video_pad|>``); None without video."""
    audio_token: str | None = None
    """The placeholder the template writes once per audio clip (Qwen-Omni: ``<|AUDIO|>``); None without audio."""
    bidirectional_images: bool = False
    """True when tokens of one image attend to each other in both directions (Molmo-style): the image rule's
    ``bidirectional``."""

    forward_keys: ClassVar[tuple[str, ...]] = ("input_ids", "position_ids")
    """The collated batch keys the model's forward takes (``packer.train`` passes these and no others)."""
    overridable: ClassVar[tuple[str, ...]] = ("image_token", "bidirectional_images", "default_tokenizer")
    """Fields ``get_profile(name, **overrides)`` may change."""

    # The rules: a family overrides these with (cached) properties built from its fields.
    image: ClassVar[ImageRule | None] = None
    """How an image's size becomes its grid, tokens and run (``rules.ImageRule``); None without vision."""
    video: ClassVar[VideoRule | None] = None
    """How a video's header becomes its plan and run (``rules.VideoRule``); None without video."""
    audio: ClassVar[AudioRule | None] = None
    """How a clip's header becomes its samples, frames and tokens (``rules.AudioRule``); None without audio."""
    positions: ClassVar[Positions] = FLAT
    """Positions beyond the 1-D row (``rules.Positions``: flat, mRoPE, Omni's time-aligned)."""

    def media_runs(self, media: list[Media], node_parents: np.ndarray) -> list[MediaRun]:
        """What each of one example's media placeholders becomes, in token order (``MediaRun``); RecordError
        for media this model cannot take together. ``node_parents`` (N,) is the example's tree (-1 at the root).

        Each alone by default (each rule's ``run`` of its ``plan``); a family whose rule looks at the other media
        of a root-to-leaf path overrides it: the cross-medium hook (LLaVA-OneVision tiles an image only when it is
        its path's one image; Qwen-Omni interleaves a video with its sound track). A clip named twice (a tree's
        branches) is planned once.
        """
        plans: dict[VideoRef, VideoPlan] = {}
        out = []
        for m in media:
            if isinstance(m.ref, VideoRef):
                if self.video is None:
                    raise no_medium(self.name, "video")
                if m.ref not in plans:
                    plans[m.ref] = self.video.plan(m.ref)
                out.append(self.video.run(plans[m.ref]))
            elif isinstance(m.ref, AudioRef):
                if self.audio is None:
                    raise no_medium(self.name, "audio")
                if m.ref.video:  # laid out with its video's frames: a family that interleaves them overrides this
                    raise RecordError(
                        "unsupported_medium",
                        f"profile {self.name!r} does not take a video's sound track (use_audio_in_video); "
                        f"drop the option or use {' or '.join(profiles_with('audio_in_video')) or 'an omni profile'}",
                    )
                out.append(self.audio.run(self.audio.plan(m.ref)))
            else:
                if self.image is None:
                    raise no_medium(self.name, "image")
                out.append(self.image.run(self.image.plan(m.ref)))
        return out

    def reader(self) -> Any:
        """The ``packer.models.reader.Reader`` that turns this profile's rows into its model's inputs (torch is
        imported there, never here; the family's own module names it)."""
        raise NotImplementedError(f"profile {self.name!r} names no reader")

    def proof(self) -> Any:
        """The ``packer.models.proof.Proof`` that proves this profile exact on its model
        (``scripts/check_equivalence.py``; torch there)."""
        raise NotImplementedError(f"profile {self.name!r} names no proof")


def bidirectional_spans(profile: ModelProfile, row: dict[str, Any]) -> list[tuple[int, ...]]:
    """The [start, end) (or (start, end, group)) token ranges of one shard row whose tokens all see each other:
    the image rule's (``ImageRule.bidirectional_spans``), none without vision. ``collate`` emits them as the
    batch's ``bidirectional_spans`` and ``packer inspect --mask`` draws them, so both follow this one rule."""
    return [] if profile.image is None else profile.image.bidirectional_spans(row)


def image_blocks(profile: ModelProfile, ref: ImageRef) -> ImageBlocks | None:
    """The blocks the profile's image rule writes ``ref`` as (Gemma 3's pan-and-scan), or None."""
    rule = profile.image
    return None if rule is None else rule.blocks(rule.plan(ref))
