"""Why an example can never fit a pack's vision or audio budget, in the words both packers report it with
(``overlong`` rejects of ``packer build``'s ``budget_rejects`` and of on-the-fly packing's ``over_budget``)."""

from __future__ import annotations

from typing import Any


def budget_message(config: Any, *, vision: int, images: int, videos: int, audio_tokens: int, audios: int) -> str | None:
    """The reject message for an example with these counts under ``config``'s budgets (``max_vision_tokens``,
    ``max_images``, ``max_videos``, ``max_audio_tokens``, ``max_audios``; None = unbounded); None if it fits.
    A vision budget it breaks is named before an audio one."""
    if ((config.max_vision_tokens is not None and vision > config.max_vision_tokens)
            or (config.max_images is not None and images > config.max_images)
            or (config.max_videos is not None and videos > config.max_videos)):
        message = f"{vision} vision tokens / {images} images exceed --max-vision-tokens / --max-images"
        if config.max_videos is not None:
            message += f" (or {videos} videos exceed --max-videos)"
        return message
    if ((config.max_audio_tokens is not None and audio_tokens > config.max_audio_tokens)
            or (config.max_audios is not None and audios > config.max_audios)):
        return f"{audio_tokens} audio tokens / {audios} audio clips exceed --max-audio-tokens / --max-audios"
    return None
