"""The ``conversations`` kind (LLaVA / ShareGPT): ``[{"from": "human"|"gpt"|"system", "value": "..."}]`` plus
``image`` (a path or a list), ``video`` (a clip path, or a list of clips or of frame-path lists) and/or
``audios`` (clip paths or ``{"bytes", "path"}`` structs; ms-swift / LLaMA-Factory).

Each ``<image>`` placeholder takes the next image, each ``<video>`` the next video, each ``<audio>`` the next
clip (``<audio>`` stays text in a record without clips). A record with images but no placeholder at all gets
LLaVA's own convention: ``"<image>\\n"`` per image prepended to the first human turn; videos and clips likewise
(``"<video>\\n"``, ``"<audio>\\n"``). LLaVA-Video-178K marks its one video with ``<image>``: a record with
videos, no images and no ``<video>`` reads its ``<image>`` placeholders as the videos'.

    {"video": "clip.mp4", "conversations": [{"from": "human", "value": "<video>\\nWhat happens?"}, ...]}
"""

from __future__ import annotations

from typing import Any

from packer.core.types import Example, Message, Node
from packer.formats.common import (
    AUDIO_PLACEHOLDER,
    IMAGE_PLACEHOLDER,
    VIDEO_PLACEHOLDER,
    Ctx,
    bind_media,
    canonical_role,
    check_pool_used,
    content_parts,
    loss_flag,
    record_tools,
    with_record_system,
)


def parse(obj: dict[str, Any], ctx: Ctx) -> Example:
    bind_media(obj, ctx)
    turns = obj["conversations"]
    if not isinstance(turns, list):
        raise ctx.error("wrong_type", f"'conversations' must be a list, got {type(turns).__name__}")
    if not turns:
        raise ctx.error("empty_messages", "'conversations' is empty")
    rows: list[tuple[str, str, bool | None, str]] = []
    for i, turn in enumerate(turns):
        w = f"conversations[{i}]"
        if not isinstance(turn, dict):
            raise ctx.error(
                "wrong_type", f"{w} must be an object with 'from' and 'value', got {type(turn).__name__}"
            )
        role = canonical_role(turn.get("from", turn.get("role")), ctx, w)
        value = turn.get("value", turn.get("content"))
        if not isinstance(value, str):
            raise ctx.error("wrong_type", f"{w} 'value' must be a string, got {type(value).__name__}")
        rows.append((role, value, loss_flag(turn, ctx, w), w))
    if ctx.video_pool and not ctx.pool and not any(VIDEO_PLACEHOLDER in v for _, v, _, _ in rows):
        rows = [(r, v.replace(IMAGE_PLACEHOLDER, VIDEO_PLACEHOLDER), lo, w) for r, v, lo, w in rows]  # LLaVA-Video
    for placeholder, pool in ((AUDIO_PLACEHOLDER, ctx.audio_pool), (VIDEO_PLACEHOLDER, ctx.video_pool),
                              (IMAGE_PLACEHOLDER, ctx.pool)):
        if pool and not any(placeholder in v for _, v, _, _ in rows):
            # LLaVA's convention (llava/train/train.py preprocess_multimodal): the image goes first in the first
            # human turn, followed by a newline.
            first_user = next((i for i, r in enumerate(rows) if r[0] == "user"), None)
            if first_user is None:
                raise ctx.error(
                    "image_count_mismatch",
                    f"the record has {len(pool)} {placeholder[1:-1]}s, no {placeholder} placeholder and no human turn "
                    "to put them in",
                )
            role, value, loss, w = rows[first_user]
            rows[first_user] = (role, (placeholder + "\n") * len(pool) + value, loss, w)
    if ctx.pool is None:
        ctx.pool = []  # placeholders with no images must fail, not pass through as text
    if ctx.video_pool is None:
        ctx.video_pool = []
    messages = [Message(role=role, parts=content_parts(value, ctx, w), loss=loss) for role, value, loss, w in rows]
    check_pool_used(ctx)
    return ctx.example(Node(messages=with_record_system(messages, obj, ctx)), "llava", tools=record_tools(obj, ctx))
