"""Qwen2.5-Omni's time-aligned mRoPE over message trees, as the thinker's ``get_rope_index`` gives it for each
root-to-leaf path alone, and the token layout of a video whose sound is interleaved with it.

transformers 5.23.0 ``Qwen2_5OmniPreTrainedModelForConditionalGeneration.get_rope_index`` walks a sequence block
by block, each block starting at the previous block's largest position + 1 (``st_idx``):

- text: one position per token, all three rows equal;
- an image or a video (grid (t, h, w), merged to (t, h // m, w // m)): ``start + (T(ti), hi, wi)``, T(ti) =
  ``int(float32(ti) * float32(second_per_grid) * 25)`` (an image's second_per_grid is 1 and its t is 1), and
  the next block starts at the block's largest entry + 1 (t included: a 10-patch video spans 225 positions);
- an audio clip of n tokens: n consecutive positions;
- a video with its sound (``use_audio_in_video``), laid out by the processor as
  ``<|vision_bos|><|audio_bos|>`` [video chunk 0][audio chunk 0][video chunk 1]... ``<|audio_eos|><|vision_eos|>``:
  both bos tokens share one position, the video's and the audio's positions start one past it (audio token k at
  ``start + k``), chunk j holding the tokens whose temporal position is in [j*50, (j+1)*50) (``get_chunked_index``,
  50 = position_id_per_seconds 25 * seconds_per_chunk 2), and both eos tokens share the largest position of the
  LAST chunk written + 1 (the model's rule, not the block's maximum).

The processor chunks the video by float64 ``ti * second_per_grid * 25`` and the model by the truncated float32
value; where the two disagree the model would give the tokens the wrong positions, so ``interleave`` refuses.
"""

from __future__ import annotations

from bisect import bisect_right
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from packer.core.tree import check_layout
from packer.errors import RecordError

POSITION_ID_PER_SECONDS = 25  # Qwen2_5OmniThinkerConfig.position_id_per_seconds
SECONDS_PER_CHUNK = 2  # Qwen2_5OmniThinkerConfig.seconds_per_chunk
TOKENS_PER_CHUNK = POSITION_ID_PER_SECONDS * SECONDS_PER_CHUNK  # get_chunked_index's tokens_per_chunk: 50


def audio_tokens_from_frames(frames: int | np.ndarray) -> np.ndarray:
    """``_get_feat_extract_output_lengths`` (processing_qwen2_5_omni.py): mel frames -> audio tokens,
    ``((L - 1) // 2 + 1 - 2) // 2 + 1`` (the conv stride 2, then the 2x average pool). 0 for L <= 2."""
    f = np.asarray(frames, dtype=np.int64)
    return ((f - 1) // 2 + 1 - 2) // 2 + 1


def mel_frames(num_samples: int | np.ndarray, *, hop_length: int = 160, max_frames: int = 30000) -> np.ndarray:
    """``feature_attention_mask.sum()`` of a clip of ``num_samples`` (16 kHz) after WhisperFeatureExtractor with
    the processor's ``padding="max_length"`` (and its default truncation at ``n_samples``): ceil(n / 160), at most
    ``nb_max_frames`` (``Qwen2_5OmniProcessor._get_num_audio_tokens``): 30000 in the released
    preprocessor_config.json (``chunk_length`` 300 s, tests/models/released/qwen_omni.json)."""
    n = np.asarray(num_samples, dtype=np.int64)
    return np.minimum(-(-n // hop_length), max_frames)


def temporal_index(grid_t: int, second_per_grid: float, position_id_per_seconds: int = POSITION_ID_PER_SECONDS) -> np.ndarray:
    """get_rope_index's ``(arange(t) * float32(second_per_grid) * 25).long()``: float32, in that order, truncated."""
    t = np.arange(grid_t, dtype=np.float32) * np.float32(second_per_grid)
    return (t * np.float32(position_id_per_seconds)).astype(np.int64)


def chunked_index(values: Sequence[float] | np.ndarray, tokens_per_chunk: int) -> list[tuple[int, int]]:
    """``get_chunked_index`` (model and processor): (start, end) slices of a nondecreasing sequence, a new slice
    each time a value reaches the next multiple of ``tokens_per_chunk`` (one boundary per token, as theirs)."""
    out, start, chunk = [], 0, 1
    vals = np.asarray(values)
    n = vals.shape[0]
    i = 0
    while i < n:
        # jump over the tokens below the next boundary (the values are nondecreasing)
        j = int(np.searchsorted(vals, chunk * tokens_per_chunk, side="left"))
        if j >= n:
            break
        i = max(i, j)
        out.append((start, i))
        start = i
        chunk += 1
        i += 1
    out.append((start, n))
    return out


@dataclass(frozen=True)
class Interleave:
    """A video with its sound: the order its tokens take (``kinds``: 0 video, 1 audio, per token between the
    two bos and the two eos) and their positions relative to the bos position (3, n) int64, and the eos offset."""

    kinds: np.ndarray
    positions: np.ndarray
    eos: int


def interleave(grid: tuple[int, int, int], second_per_grid: float, audio_tokens: int, *, merge: int = 2) -> Interleave:
    """The processor's ``replace_video_with_audio_token`` layout and the model's positions for it; RecordError
    "bad_audio" where the processor's float64 chunks and the model's float32 ones differ."""
    t, h, w = (int(x) for x in grid)
    lh, lw = h // merge, w // merge
    per = lh * lw
    tpc = int(POSITION_ID_PER_SECONDS * SECONDS_PER_CHUNK)
    tt = temporal_index(t, second_per_grid)
    model_video = chunked_index(np.repeat(tt, per), tpc)
    proc_video = chunked_index(np.repeat(np.arange(t) * float(second_per_grid) * POSITION_ID_PER_SECONDS, per), tpc)
    if model_video != proc_video:
        raise RecordError("bad_audio", f"video with sound: second_per_grid {second_per_grid} puts its frames in "
                          "different time chunks in Qwen2_5OmniProcessor and in the model's get_rope_index")
    if any((b - a) % per for a, b in model_video):
        # a frame whose temporal position jumps past two chunk boundaries (more than 2 s a patch: fps < 1) is cut
        # by get_chunked_index into one-token chunks: refused, as nothing verifies such a layout frame by frame
        raise RecordError("bad_audio", f"video with sound: second_per_grid {second_per_grid} s (> 2 s a temporal "
                          "patch, fps < 1) cuts frames across time chunks; sample it at 1 fps or more")
    audio = chunked_index(np.arange(audio_tokens), tpc)
    k = np.arange(t * per)
    vpos = np.stack([tt[k // per], (k // lw) % lh, k % lw]) + 1
    apos = np.broadcast_to(np.arange(audio_tokens) + 1, (3, audio_tokens))
    kinds, cols, last = [], [], None
    for j in range(max(len(model_video), len(audio))):
        if j < len(model_video):
            a, b = model_video[j]
            kinds.append(np.zeros(b - a, np.int8))
            cols.append(vpos[:, a:b])
            last = vpos[:, a:b]
        if j < len(audio):
            a, b = audio[j]
            kinds.append(np.ones(b - a, np.int8))
            cols.append(apos[:, a:b])
            last = apos[:, a:b]
    return Interleave(np.concatenate(kinds), np.concatenate(cols, axis=1), int(last.max()) + 1)


@dataclass(frozen=True)
class Block:
    """One multimodal span of a sequence, in token order: [start, end) are its placeholder tokens (for a video
    with sound: the interleaved tokens, without the bos/eos pairs around them)."""

    start: int
    end: int
    kind: str  # "image", "video", "audio", "av"
    grid: tuple[int, int, int] = (1, 1, 1)
    second_per_grid: float = 1.0
    audio_tokens: int = 0


def _block_positions(b: Block, merge: int) -> tuple[np.ndarray, int]:
    """(3, end - start) positions relative to the block's start, and where the next block starts."""
    if b.kind == "audio":
        n = b.end - b.start
        return np.broadcast_to(np.arange(n), (3, n)), n
    if b.kind == "av":
        lay = interleave(b.grid, b.second_per_grid, b.audio_tokens, merge=merge)
        return lay.positions, lay.eos
    t, h, w = b.grid
    lh, lw = h // merge, w // merge
    tt = temporal_index(t, b.second_per_grid) if b.kind == "video" else np.arange(t) * POSITION_ID_PER_SECONDS
    k = np.arange(t * lh * lw)
    pos = np.stack([tt[k // (lh * lw)], (k // lw) % lh, k % lw])
    return pos, int(pos.max()) + 1


def omni_position_ids(
    input_ids: np.ndarray, node_offsets: np.ndarray, node_parents: np.ndarray, blocks: Sequence[Block], *, merge: int = 2
) -> np.ndarray:
    """(3, L) int32 positions of a tree, each root-to-leaf path as get_rope_index gives it alone. ``blocks`` in
    token order; each must lie inside one node (a video with sound with its two bos and two eos tokens)."""
    length = int(np.asarray(input_ids).shape[0])
    starts = np.asarray(node_offsets).reshape(-1).tolist()
    parents = np.asarray(node_parents).reshape(-1).tolist()
    if starts != [0] or parents != [-1]:
        check_layout(length, node_offsets, node_parents, empty_nodes=True)
    ends = [*starts[1:], length]
    # a video with sound takes its bos pair and eos pair with it
    spans = [(b.start - 2, b.end + 2) if b.kind == "av" else (b.start, b.end) for b in blocks]
    nodes = [bisect_right(starts, s) - 1 for s, _ in spans]
    if any(s < starts[n] or e > ends[n] for (s, e), n in zip(spans, nodes, strict=True)):
        raise RecordError("image_count_mismatch", "a media run's tokens are split across two tree nodes")
    out = np.empty((3, length), dtype=np.int32)
    next_pos = [0] * len(starts)
    k = 0
    for n, (s, e, parent) in enumerate(zip(starts, ends, parents, strict=True)):
        cur = 0 if parent < 0 else next_pos[parent]
        while k < len(blocks) and nodes[k] == n:
            b = blocks[k]
            rs, re_ = spans[k]
            out[:, s:rs] = np.arange(cur, cur + rs - s)
            cur += rs - s
            rel, advance = _block_positions(b, merge)
            if b.kind == "av":
                out[:, rs:rs + 2] = cur  # <|vision_bos|><|audio_bos|> share one position
                out[:, b.start:b.end] = rel + cur
                out[:, b.end:re_] = cur + advance  # <|audio_eos|><|vision_eos|> likewise
                cur += advance + 1
            else:
                out[:, rs:re_] = rel + cur
                cur += advance
            s = re_
            k += 1
        out[:, s:e] = np.arange(cur, cur + e - s)
        next_pos[n] = cur + e - s
    return out
