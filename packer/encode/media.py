"""Stage three of encoding: each media placeholder (image, video, audio) becomes its run (``ModelProfile.media_runs``), with np.repeat
for the placeholder repeated (labels -100) and the run's own ids written over it where the family lays it out in
other tokens; node offsets shift to match. No per-token Python loop anywhere.

    ids   ... <|vision_start|> <|image_pad|> <|vision_end|> ...            one placeholder per image
      ->  ... <|vision_start|> <|image_pad|> x 391 <|vision_end|> ...       MediaRun((1, 34, 46), 391)

A run given as text is tokenized alone, which equals tokenizing it in place only where no merge crosses its
edges: a special (control) token on each side of every edge does it (Qwen3-VL's timestamps follow the
template's <|vision_start|>); elsewhere the edge is checked by tokenizing the text between the nearest special
tokens with the run (``context.RunIds.check_edges``, the run ids' cache), else ``template_error``.
"""

from __future__ import annotations

import numpy as np

from packer.core.types import (
    IGNORE_INDEX,
    AudioRef,
    EncodedAudio,
    EncodedImage,
    EncodedVideo,
    ImageRef,
    VideoRef,
)
from packer.encode.context import EncodeContext
from packer.encode.draft import Draft
from packer.errors import ConfigError, RecordError
from packer.media.video import VideoPlan
from packer.models.base import Media, MediaRun, image_blocks


def expand(ctx: EncodeContext, draft: Draft) -> None:
    """Replace each of ``draft``'s placeholders with its run; record the stored image, video and audio entries.

    A video's own sound track (``AudioRef.video``) has no placeholder: its run lies inside its video's
    (``MediaRun.inside``). Placeholder positions are Python ints: an example names a few media, and numpy calls
    on a few items cost a microsecond each for nothing."""
    refs = draft.refs
    if not refs:
        return
    profile = ctx.profile
    placed = [r for r in refs if not (isinstance(r, AudioRef) and r.video)]  # refs with a placeholder
    pos = np.flatnonzero(ctx.is_placeholder[draft.ids]).tolist()  # one per video, audio, image, or image block
    blocks = [image_blocks(profile, r) if isinstance(r, ImageRef) else None for r in placed]
    draft.blocks = [1 if b is None else len(b.runs) for r, b in zip(placed, blocks, strict=True) if isinstance(r, ImageRef)]
    ref_pos, at = [], 0  # each placed ref's first placeholder
    for b in blocks:
        ref_pos.append(pos[at])
        at += 1 if b is None else len(b.runs)
    if ctx.video_token_id is not None or ctx.audio_token_id is not None:
        want = [ctx.video_token_id if isinstance(r, VideoRef) else ctx.audio_token_id if isinstance(r, AudioRef)
                else ctx.image_token_id for r in placed]
        if draft.ids[ref_pos].tolist() != want:
            raise RecordError("template_error", "the chat template put the images, videos and audio out of their order")
    placed_nodes = (np.searchsorted(draft.node_offsets, ref_pos, side="right") - 1).tolist()
    nodes, k = [], -1  # every ref's node: a sound track's is its video's
    for r in refs:
        if not (isinstance(r, AudioRef) and r.video):
            k += 1
        elif k < 0 or not isinstance(placed[k], VideoRef) or placed[k].path != r.path:
            raise ConfigError("a video's sound track (AudioRef.video) must follow its VideoRef")
        nodes.append(placed_nodes[k])
    block_of = iter(blocks)
    ref_blocks = [None if isinstance(r, AudioRef) and r.video else next(block_of) for r in refs]
    plain = [Media(r, n) for r, n, b in zip(refs, nodes, ref_blocks, strict=True) if b is None]
    plain_runs = iter(profile.media_runs(plain, draft.node_parents) if plain else ())
    entries: list[tuple[ImageRef | VideoRef | AudioRef, MediaRun]] = []  # one per entry, in token order
    for ref, b in zip(refs, ref_blocks, strict=True):
        entries += [(ref, next(plain_runs))] if b is None else [(ref, run) for run in b.runs]
    for ref, run in entries:
        if run.inside != (isinstance(ref, AudioRef) and ref.video):
            raise ConfigError(f"profile {profile.name!r}: a MediaRun is `inside` exactly for a video's sound track")
    outer = [(ref, run) for ref, run in entries if not run.inside]  # one per placeholder
    ids_of = [ctx.runs.ids(run, draft.ids, p) for (_, run), p in zip(outer, pos, strict=True)]
    spans = [run.num_tokens if ids is None else ids.shape[0] for (_, run), ids in zip(outer, ids_of, strict=True)]
    starts, shift = [], 0  # where each placeholder's run starts once expanded
    for p, n in zip(pos, spans, strict=True):
        starts.append(p + shift)
        shift += n - 1
    repeats = np.ones(draft.ids.shape[0], dtype=np.int64)
    repeats[pos] = spans
    labels = draft.labels.copy()
    labels[pos] = IGNORE_INDEX
    draft.images, draft.image_runs, draft.videos, draft.video_runs = [], [], [], []
    draft.audios, draft.audio_runs = [], []
    k = -1
    for ref, run in entries:
        if not run.inside:
            k += 1
        start, n = starts[k], spans[k]
        if run.inside:  # within its video's run [start, start + n)
            if run.lead < 0 or run.lead + run.num_tokens > n:
                raise ConfigError(f"profile {profile.name!r}: a sound track's run leaves its video's run")
            draft.audios.append(encoded_audio(ref, run, offset=start + run.lead))
            draft.audio_runs.append((start, start + n))
        elif isinstance(ref, VideoRef):
            draft.videos.append(encoded_video(ref, run.plan, offset=start + run.lead))
            draft.video_runs.append((start, start + n))
        elif isinstance(ref, AudioRef):
            draft.audios.append(encoded_audio(ref, run, offset=start + run.lead))
            draft.audio_runs.append((start, start + n))
        else:
            draft.images.append(EncodedImage(
                source=ref.path if ref.data is None else "", data=ref.data,
                grid_thw=tuple(int(x) for x in run.grid), offset=start + run.lead, num_tokens=int(run.num_tokens),
            ))
            draft.image_runs.append((start, start + n))
    draft.ids = np.repeat(draft.ids, repeats)
    for ids, start in zip(ids_of, starts, strict=True):
        if ids is not None:  # the family's own layout of the run
            draft.ids[start : start + ids.shape[0]] = ids
    draft.labels = np.repeat(labels, repeats)
    if draft.weights is not None:
        draft.weights = np.repeat(draft.weights, repeats)
    if draft.node_offsets.shape[0] > 1:  # a linear example's one node starts at 0, before every placeholder
        shifts = np.cumsum([0] + [n - 1 for n in spans])  # (P + 1,) tokens the first k placeholders add
        before = np.searchsorted(np.array(pos, dtype=np.int64), draft.node_offsets, side="left")
        draft.node_offsets = (draft.node_offsets + shifts[before]).astype(np.int32)


def encoded_video(ref: VideoRef, plan: VideoPlan | None, *, offset: int) -> EncodedVideo:
    """A planned video (``packer.media.video.VideoPlan``) at ``offset`` of its example."""
    if plan is None:
        raise ConfigError("a video's MediaRun must carry its plan (VideoRule.run)")
    options = dict(ref.options)
    start, end = options.get("video_start"), options.get("video_end")
    return EncodedVideo(
        source=ref.path,
        frames=list(ref.frames),
        video_start=None if start is None else float(start),
        video_end=None if end is None else float(end),
        frame_indices=list(plan.frame_indices),
        video_fps=float(plan.video_fps),
        grid_thw=tuple(int(x) for x in plan.grid_thw),
        height=int(plan.size[0]),
        width=int(plan.size[1]),
        utils_height=int(plan.utils_size[0]),
        utils_width=int(plan.utils_size[1]),
        offset=offset,
        num_tokens=int(plan.num_tokens),
        second_per_grid_t=float(plan.second_per_grid_t),
    )


def encoded_audio(ref: AudioRef, run: MediaRun, *, offset: int) -> EncodedAudio:
    """An audio clip's entry (its ``MediaRun.audio`` plan) at ``offset`` of its example."""
    plan = run.audio
    if plan is None:
        raise ConfigError("an audio clip's MediaRun must carry its plan (AudioRule.run)")
    return EncodedAudio(
        source=ref.path if ref.data is None else "",
        data=ref.data,
        audio_start=ref.start,
        audio_end=ref.end,
        video=ref.video,
        sample_rate=int(plan.sample_rate),
        num_samples=int(plan.num_samples),
        feature_length=int(plan.feature_length),
        offset=offset,
        num_tokens=int(run.num_tokens),
        padded_samples=None if plan.padded_samples is None else int(plan.padded_samples),
    )
