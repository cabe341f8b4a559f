"""Length policies for an example longer than ``max_length`` (``packer.encode.OVERLONG_POLICIES`` and
``--long-docs split``), applied to its draft after its media are expanded.

    truncate         keep the first max_length tokens (depth-first layout), never inside an image, video or clip
    truncate_left    a text record keeps its last max_length tokens
    keep_last_turns  drop the fewest whole early turns (re-rendered: a template may depend on what precedes)
    split            a long text record becomes chunks (split.py), losing no token; each is an example of its own,
                     ``path:line@k``, once the encoder finishes it
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace

import numpy as np

from packer.core.tree import path_maxima
from packer.core.types import IGNORE_INDEX, EncodedAudio, Example, ImageRef, Node
from packer.encode.context import EncodeContext
from packer.encode.draft import Draft
from packer.encode.split import chunk_labels, split_windows
from packer.errors import RecordError
from packer.models.base import Media, image_blocks


def truncate(ctx: EncodeContext, draft: Draft) -> None:
    """Keep the first max_length tokens (depth-first layout), cutting before an image or video, never inside."""
    cut = ctx.max_length
    firsts = np.cumsum([0, *draft.blocks])  # an image's blocks go together (its crops and the text between)
    spans = [(draft.image_runs[i][0], draft.image_runs[j - 1][1])
             for i, j in zip(firsts[:-1], firsts[1:], strict=True)]  # [first token, end) of each image's runs
    spans += draft.video_runs + draft.audio_runs  # a sound track's run is its video's
    for start, end in spans:
        if start < cut < end:
            cut = start
            break
    if ctx.vision_start_id is not None and cut > 0 and draft.ids[cut - 1] == ctx.vision_start_id:
        cut -= 1  # a <|vision_start|> whose image was cut off would announce an image that never comes
    keep_nodes = int(np.searchsorted(draft.node_offsets, cut, side="left"))  # nodes that start before it
    labels = draft.labels[:cut]
    if keep_nodes == 0 or not (labels[1:] != IGNORE_INDEX).any():
        raise RecordError(
            "untruncatable",
            f"cutting to --max-length {ctx.max_length} (at token {cut}, before any image it would split) "
            "leaves no loss token; raise --max-length or use --overlong drop",
        )
    kept = [k for k, (_, end) in enumerate(draft.image_runs) if end <= cut]
    whole = [draft.images[i] for i, (_, end) in zip(firsts[:-1], spans[: len(draft.blocks)], strict=True)
             if end <= cut]  # each kept image's first block
    if 0 < len(kept) < len(draft.images):
        _check_counts_kept(ctx, draft, whole, keep_nodes)
    draft.images = [draft.images[k] for k in kept]
    draft.image_runs = [draft.image_runs[k] for k in kept]
    kept_videos = [k for k, (_, end) in enumerate(draft.video_runs) if end <= cut]
    draft.videos = [draft.videos[k] for k in kept_videos]
    draft.video_runs = [draft.video_runs[k] for k in kept_videos]
    kept_audios = [k for k, (_, end) in enumerate(draft.audio_runs) if end <= cut]
    _check_padding_kept(ctx, [draft.audios[k] for k in kept_audios], draft.node_offsets[:keep_nodes],
                        draft.node_parents[:keep_nodes])
    draft.audios = [draft.audios[k] for k in kept_audios]
    draft.audio_runs = [draft.audio_runs[k] for k in kept_audios]
    draft.ids, draft.labels = draft.ids[:cut], labels
    if draft.weights is not None:
        draft.weights = draft.weights[:cut]
    draft.node_offsets = draft.node_offsets[:keep_nodes]
    draft.node_parents = draft.node_parents[:keep_nodes]


def _check_counts_kept(ctx: EncodeContext, draft: Draft, whole: list, keep_nodes: int) -> None:
    """RecordError "untruncatable" where a kept image's token count depended on the images cut away (its runs
    under the cut tree differ from the ones it has): no cut keeps it exact."""
    profile = ctx.profile
    refs = [r for r in draft.refs if isinstance(r, ImageRef)][: len(whole)]
    plain = [(r, im) for r, im in zip(refs, whole, strict=True) if image_blocks(profile, r) is None]
    if not plain:
        return
    offsets, parents = draft.node_offsets[:keep_nodes], draft.node_parents[:keep_nodes]
    nodes = (np.searchsorted(offsets, [im.offset for _, im in plain], side="right") - 1).tolist()
    try:
        alone = [run.num_tokens for run in profile.media_runs([Media(r, n) for (r, _), n in zip(plain, nodes, strict=True)],
                                                              parents)]
    except RecordError:  # the cut tree's paths disagree on a kept image (image_tree): no count fits
        alone = None
    if alone != [im.num_tokens for _, im in plain]:
        raise RecordError(
            "untruncatable",
            f"cutting to --max-length {ctx.max_length} drops images that decide how many tokens the "
            f"kept ones take (profile {profile.name!r}); raise --max-length or use --overlong drop",
        )


def _check_padding_kept(ctx: EncodeContext, kept: list[EncodedAudio], offsets: np.ndarray, parents: np.ndarray) -> None:
    """RecordError "untruncatable" where a kept clip stores ``padded_samples`` (its features computed beside its
    example's other clips, padded to the longest) that the cut tree no longer gives it: on some path of the cut
    tree the longest kept clip differs, so its feature_length, tokens and features would be the cut clips'."""
    if all(a.padded_samples is None for a in kept):
        return
    nodes = np.searchsorted(offsets, [a.offset for a in kept], side="right") - 1
    by_path = path_maxima(parents, nodes, [a.num_samples for a in kept])
    for k, (a, longest) in enumerate(zip(kept, by_path, strict=True)):
        if a.padded_samples is None:
            continue
        if longest != {a.padded_samples}:
            clip = a.source or "inline audio"
            after = longest.pop() if len(longest) == 1 else f"{sorted(longest)} by path"
            raise RecordError(
                "untruncatable",
                f"cutting to --max-length {ctx.max_length} drops the audio clip that set the padding of kept clip "
                f"{k + 1} ({clip}): profile {ctx.profile.name!r} pads an example's clips to its longest, "
                f"{a.padded_samples} samples before the cut, {after} after it, so the kept clip's features "
                "and token count would not be its own; raise --max-length or use --overlong drop",
            )


def truncate_left(ctx: EncodeContext, draft: Draft) -> None:
    """A text record keeps its last max_length tokens (no bos re-added: the tail does not start the document;
    its first token's label is cleared when it is encoded). Text records hold no images."""
    cut = draft.ids.shape[0] - ctx.max_length
    draft.ids, draft.labels = draft.ids[cut:], draft.labels[cut:].copy()


def split(ctx: EncodeContext, draft: Draft) -> list[Draft]:
    """A long text record's draft -> its chunks' (``split.py``), in order (the encoder names chunk k
    ``path:line@k``)."""
    windows = split_windows(draft.ids.shape[0], max_length=ctx.max_length, overlap=ctx.long_docs_overlap)
    one = np.zeros(1, dtype=np.int32), np.full(1, -1, dtype=np.int32)
    ends = [0] + [b for _, b in windows[:-1]]  # where each chunk's context (the previous chunk) ends
    return [Draft(draft.ids[a:b], chunk_labels(draft.labels, a, b, context_end=e), *one, refs=[])
            for (a, b), e in zip(windows, ends, strict=True)]


def keep_last_turns(ctx: EncodeContext, example: Example, length: int, *,
                    redraft: Callable[[Example], Draft]) -> Draft:
    """Drop the fewest whole early turns of the root that make ``example`` fit; re-rendered by the template (a
    template may depend on what precedes a turn), found by bisection: O(log turns) tokenizer calls.
    ``redraft``: an example's draft with a tokenizer call of its own (the encoder's render, tokens and media).

    Turns: the root's leading system messages are always kept; the rest is cut into turns, each starting at a
    user message (messages before the first user message form a turn of their own). The root's last turn is
    always kept: a tree's branches continue it, and the kept part starts at a user message.
    """
    root = example.root
    head = 0
    while head < len(root.messages) and root.messages[head].role == "system":
        head += 1
    rest = root.messages[head:]
    starts = [0] + [i for i, m in enumerate(rest) if i > 0 and m.role == "user"]

    def drafted(k: int) -> Draft:  # the example without its first k turns
        return redraft(replace(example, root=Node(root.messages[:head] + rest[starts[k]:], root.children)))

    last = len(starts) - 1
    best = drafted(last) if last > 0 else None
    kept = length if best is None else best.ids.shape[0]
    if kept > ctx.max_length:
        raise RecordError(
            "untruncatable",
            f"the system prompt and the last turn alone are {kept} tokens > --max-length {ctx.max_length}; "
            "raise --max-length, or use --overlong truncate to keep the head",
        )
    lo, hi = 1, last  # drafted(hi) fits; find the smallest k that does
    while lo < hi:
        mid = (lo + hi) // 2
        candidate = drafted(mid)
        if candidate.ids.shape[0] <= ctx.max_length:
            best, hi = candidate, mid
        else:
            lo = mid + 1
    if not (best.labels[1:] != IGNORE_INDEX).any():
        raise RecordError(
            "untruncatable",
            f"the last {len(starts) - hi} turn(s) that fit --max-length {ctx.max_length} carry no loss; "
            "raise --max-length or use --overlong drop",
        )
    return best
