"""The media a build knows, one row each: what the planner budgets, verify checks and stats count per medium.

Adding a medium is one ``Medium`` row here, one rule class in the families that read it (the profile
attribute ``Medium.rule`` names), and its schema columns (``count_column``, ``token_column``). Code that
treats media alike loops over ``MEDIA`` (or ``BUDGETS``, the per-pack budgets the rows declare) instead of
naming each medium.

    medium  placeholder   count column  token column         count budget  token budget
    image   image_token   num_images    num_vision_tokens    max_images    max_vision_tokens
    video   video_token   num_videos    num_vision_tokens    max_videos    max_vision_tokens
    audio   audio_token   num_audios    num_audio_tokens     max_audios    max_audio_tokens

Images and videos share the vision tower, so they share one token column and one token budget; a shared
budget is one column of the planner's cost matrix, listed once in ``BUDGETS``.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True, kw_only=True)
class Medium:
    """One medium: its names in the profile, the record, the shard/cache columns and the config."""

    name: str
    """``"image"``: the singular, as errors and stats name one item."""
    plural: str
    """``"images"``: the ``Example``/``Encoded`` attribute listing its items, and the shard column of them."""
    placeholder: str
    """The profile attribute holding its placeholder token (``image_token``); None there = unsupported."""
    count_column: str
    """Items per example (encode cache) and per pack (shards' examples table): ``num_images``."""
    token_column: str
    """The column counting its tokens as its token budget does (``num_vision_tokens`` for image and video)."""
    own_tokens_column: str | None
    """The column counting its tokens alone, where one exists (``num_video_tokens``; image tokens are the
    vision tokens less the video tokens)."""
    count_budget: str
    """The ``BuildConfig`` field (``--max-images``) capping its items per pack."""
    token_budget: str
    """The ``BuildConfig`` field capping its tokens per pack (shared by media on one tower)."""
    tokens_noun: str
    """What its token column counts, in messages: ``"vision tokens"``."""
    items_noun: str
    """What its count column counts, in messages: ``"images"``, ``"audio clips"``."""
    rule: str
    """The profile attribute holding the family's rule object for this medium (``profile.image``)."""


MEDIA: tuple[Medium, ...] = (
    Medium(name="image", plural="images", placeholder="image_token", count_column="num_images",
           token_column="num_vision_tokens", own_tokens_column=None, count_budget="max_images",
           token_budget="max_vision_tokens", tokens_noun="vision tokens", items_noun="images", rule="image"),
    Medium(name="video", plural="videos", placeholder="video_token", count_column="num_videos",
           token_column="num_vision_tokens", own_tokens_column="num_video_tokens", count_budget="max_videos",
           token_budget="max_vision_tokens", tokens_noun="vision tokens", items_noun="videos", rule="video"),
    Medium(name="audio", plural="audios", placeholder="audio_token", count_column="num_audios",
           token_column="num_audio_tokens", own_tokens_column="num_audio_tokens", count_budget="max_audios",
           token_budget="max_audio_tokens", tokens_noun="audio tokens", items_noun="audio clips", rule="audio"),
)


@dataclass(frozen=True, kw_only=True)
class Budget:
    """One per-pack budget: a column of the planner's cost matrix and its limit's config field."""

    flag: str
    """The ``BuildConfig`` field holding the limit (``max_vision_tokens``); ``--max-vision-tokens`` on the CLI."""
    column: str
    """The per-example count it sums (``num_vision_tokens``), in the encode cache and the shards."""
    what: str
    """What it counts, in messages: ``"vision tokens"``, ``"images"``."""
    tokens: bool
    """Does it count tokens (a part of the example's length) rather than items?"""
    media: tuple[str, ...]
    """The media it counts (``("image", "video")`` for the shared vision-token budget)."""


def budgets_of(media: tuple[Medium, ...]) -> tuple[Budget, ...]:
    """Each medium's token budget (once, where media share it), then its count budget: the cost matrix's
    column order (vision tokens, images, videos, audio tokens, clips), which the planner's plans depend on."""
    out: dict[str, Budget] = {}
    for m in media:
        if m.token_budget in out:
            shared = out[m.token_budget]
            out[m.token_budget] = Budget(flag=shared.flag, column=shared.column, what=shared.what, tokens=True,
                                         media=(*shared.media, m.name))
        else:
            out[m.token_budget] = Budget(flag=m.token_budget, column=m.token_column, what=m.tokens_noun,
                                         tokens=True, media=(m.name,))
        out[m.count_budget] = Budget(flag=m.count_budget, column=m.count_column, what=m.items_noun, tokens=False,
                                     media=(m.name,))
    return tuple(out.values())


BUDGETS: tuple[Budget, ...] = budgets_of(MEDIA)
"""Every per-pack budget the media declare, in cost-matrix column order."""


def medium(name: str) -> Medium:
    """The row of the medium called ``name`` (``"video"``)."""
    for m in MEDIA:
        if m.name == name:
            return m
    raise KeyError(f"no medium {name!r}; the media are {', '.join(m.name for m in MEDIA)}")
