"""Qwen3-Omni's audio counts and time-aligned mRoPE, as transformers 5.23.0's ``Qwen3OmniMoeProcessor`` and the
thinker's ``get_rope_index`` give them for one sequence alone; over message trees, each root-to-leaf path alone.

Audio: the processor calls WhisperFeatureExtractor with ``padding=True`` (to the call's longest clip) and no
truncation, so a clip of n samples (16 kHz) in an example whose longest clip has L samples reads
``min(ceil(n / 160), L // 160)`` mel frames (the extractor's mask, cut to its L // 160 frames): 16,001 samples
are 100 frames alone and 101 beside a longer clip. Frames become tokens by ``_get_feat_extract_output_lengths``
(n_window 50: every whole 100 frames give 13 tokens, the rest its conv and pool arithmetic).

Positions: ``get_rope_index`` works in float32. A block starts at ``st_idx``, the largest entry of the LAST piece
appended + 1 (after text: the text's start + its length; after a bos: + 1 or + 2):

- text, a bos or eos pair, an audio clip: consecutive positions from ``st_idx``;
- an image (grid (1, h, w) merged to (h / m, w / m)): ``st_idx + (0, hi, wi)``;
- a video: ``st_idx + (T(ti), hi, wi)``, T(ti) = float32(ti) * float32(second_per_grid) * 13, fractional
  wherever 13 * second_per_grid is (second_per_grid = temporal_patch_size / fps): every later position
  inherits the fraction, which is why the shards keep positions as float32 (docs/format.md);
- a video with its sound (``<|vision_start|><|audio_start|>`` ... ``<|audio_end|><|vision_end|>``): the
  processor writes frame ti's tokens before audio token a when ``ti * second_per_grid * 13 <= a`` (float64),
  the model merges the two position lists by the same test on float32 ``st_idx``-shifted values; both bos share
  ``st_idx``, both eos follow the last piece merged. Where the two orders differ the model would give a video
  token an audio position: ``layout`` refuses (``bad_audio``).
"""

from __future__ import annotations

from bisect import bisect_right
from collections.abc import Sequence

import numpy as np

from packer.core.tree import check_layout
from packer.errors import RecordError
from packer.models.qwen_omni.rope import Block

POSITION_ID_PER_SECONDS = 13  # Qwen3-Omni's thinker_config.position_id_per_seconds (the processor's default 13.0)
N_WINDOW = 50  # audio_config.n_window: the tower convolves 2 * 50 frames at a time
HOP_LENGTH = 160  # WhisperFeatureExtractor at 16 kHz
F32 = np.float32


def audio_tokens(frames: int | np.ndarray, n_window: int = N_WINDOW) -> np.ndarray:
    """``_get_feat_extract_output_lengths``: mel frames -> audio tokens (13 per whole 100 frames)."""
    f = np.asarray(frames, dtype=np.int64)
    chunk = 2 * n_window
    rest = (f % chunk - 1) // 2 + 1
    return ((rest - 1) // 2 + 1 - 1) // 2 + 1 + (f // chunk) * 13


def frames_for_tokens(tokens: int | np.ndarray, n_window: int = N_WINDOW) -> np.ndarray:
    """Some frame count that ``audio_tokens`` maps to ``tokens`` (verify's spans of a clip cut by video frames:
    ``audio_tokens(frames_for_tokens(c)) == c``)."""
    c = np.asarray(tokens, dtype=np.int64)
    q, r = np.divmod(c, 13)
    return 2 * n_window * q + np.where(r > 0, 8 * r - 7, 0)


def mel_frames(num_samples: int | np.ndarray, padded_samples: int | np.ndarray) -> np.ndarray:
    """``feature_attention_mask.sum()`` of a clip of ``num_samples`` padded to ``padded_samples`` (its example's
    longest clip) by WhisperFeatureExtractor(padding=True): min(ceil(n / 160), L // 160)."""
    n = np.asarray(num_samples, dtype=np.int64)
    padded = np.asarray(padded_samples, dtype=np.int64)
    return np.minimum(-(-n // HOP_LENGTH), padded // HOP_LENGTH)


def temporal_index(grid_t: int, second_per_grid: float) -> np.ndarray:
    """get_rope_index's ``arange(t) * float32(second_per_grid) * 13`` in float32, in that order."""
    return (np.arange(grid_t, dtype=F32) * F32(second_per_grid)) * F32(POSITION_ID_PER_SECONDS)


def layout(grid: tuple[int, int, int], second_per_grid: float, audio_tokens: int, *, merge: int = 2) -> np.ndarray:
    """``Qwen3OmniMoeProcessor.replace_video_with_audio_token``'s order of a video with its sound between its
    bos and eos: 0 for a video token, 1 for an audio token (float64 times, as the processor computes them)."""
    t, h, w = (int(x) for x in grid)
    per = (h // merge) * (w // merge)
    times = np.repeat(np.arange(t) * float(second_per_grid) * POSITION_ID_PER_SECONDS, per)
    # video token i goes before audio token a iff times[i] <= a: the audio tokens before it are ceil(times[i])
    before = np.minimum(np.ceil(times).astype(np.int64), audio_tokens)
    kinds = np.ones(len(times) + audio_tokens, dtype=np.int8)
    kinds[np.arange(len(times)) + before] = 0
    return kinds


def _vision(grid: tuple[int, int, int], t_index: np.ndarray, start: np.float32, merge: int) -> np.ndarray:
    """get_llm_pos_ids_for_vision: (3, t*h*w/m^2) float32, ``start`` added in float32."""
    t, h, w = (int(x) for x in grid)
    lh, lw = h // merge, w // merge
    k = np.arange(t * lh * lw)
    pos = np.stack([t_index[k // (lh * lw)], ((k // lw) % lh).astype(F32), (k % lw).astype(F32)])
    return pos + F32(start)


def _av(b: Block, start: np.float32, merge: int) -> tuple[np.ndarray, np.float32]:
    """A video with its sound after its two bos: its positions (3, n) in the processor's token order and the
    ``st_idx`` its eos pair starts at; RecordError where the model's merge order is not the processor's."""
    video = _vision(b.grid, temporal_index(b.grid[0], b.second_per_grid), start, merge)
    audio = np.broadcast_to(np.arange(b.audio_tokens, dtype=F32) + F32(start), (3, b.audio_tokens))
    want = layout(b.grid, b.second_per_grid, b.audio_tokens, merge=merge)
    # the model's merge: video token i before audio token a iff video[0, i] <= audio[0, a] (float32)
    before = np.searchsorted(audio[0], video[0], side="left")  # audio tokens strictly below each video token
    got = np.ones(video.shape[1] + b.audio_tokens, dtype=np.int8)
    got[np.arange(video.shape[1]) + before] = 0
    if not np.array_equal(got, want):
        raise RecordError("bad_audio", f"video with sound: second_per_grid {b.second_per_grid} s puts a frame on "
                          "a different side of an audio token in Qwen3OmniMoeProcessor (float64) and in the "
                          "model's get_rope_index (float32), which would give a video token an audio position")
    out = np.empty((3, len(got)), dtype=F32)
    out[:, got == 0] = video
    out[:, got == 1] = audio
    # the last piece merged: the video's or the audio's remainder (whichever ran on), else the last token
    nv, na = video.shape[1], b.audio_tokens
    last_v = np.flatnonzero(got == 0)[-1] if nv else -1
    last_a = np.flatnonzero(got == 1)[-1] if na else -1
    if nv and last_v > last_a:  # the video's remainder: every video token after the last audio token
        first = int(np.searchsorted(np.flatnonzero(got == 0), last_a + 1))
        piece = video[:, first:]
    elif na and last_a > last_v:
        first = int(np.searchsorted(np.flatnonzero(got == 1), last_v + 1))
        piece = audio[:, first:]
    else:
        piece = out[:, -1:]
    return out, F32(piece.max()) + F32(1)


def omni3_position_ids(
    length: int, node_offsets: np.ndarray, node_parents: np.ndarray, blocks: Sequence[Block], *, merge: int = 2
) -> np.ndarray:
    """(3, L) float32 positions of a tree, each root-to-leaf path as get_rope_index gives it alone. ``blocks``
    in token order, each inside one node; an "av" block's [start, end) excludes its bos pair and eos pair."""
    starts = np.asarray(node_offsets).reshape(-1).tolist()
    parents = np.asarray(node_parents).reshape(-1).tolist()
    if starts != [0] or parents != [-1]:
        check_layout(length, node_offsets, node_parents, empty_nodes=True)
    ends = [*starts[1:], length]
    bos = [2 if b.kind == "av" else 1 for b in blocks]
    spans = [(b.start - k, b.end + k) for b, k in zip(blocks, bos, strict=True)]
    nodes = [bisect_right(starts, s) - 1 for s, _ in spans]
    if any(s < starts[n] or e > ends[n] for (s, e), n in zip(spans, nodes, strict=True)):
        raise RecordError("image_count_mismatch", "a media run's tokens are split across two tree nodes")
    out = np.empty((3, length), dtype=F32)
    # a node ends inside a text run that its children continue: (the run's st_idx, tokens already in it), so a
    # child's text is st_idx + k with k counted from the run's start, rounded once as get_rope_index's one piece
    state: list[tuple[np.float32, int]] = [(F32(0), 0)] * len(starts)
    k = 0
    for n, (s, e, parent) in enumerate(zip(starts, ends, parents, strict=True)):
        base, run = (F32(0), 0) if parent < 0 else state[parent]
        while k < len(blocks) and nodes[k] == n:
            b, nb = blocks[k], bos[k]
            rs, re_ = spans[k]
            out[:, s:rs] = np.arange(run, run + rs - s, dtype=F32) + base
            cur = base + F32(run + rs - s)  # st_idx += text_len
            out[:, rs:b.start] = np.arange(nb, dtype=F32) + cur  # <|vision_start|> (+ <|audio_start|>)
            cur = cur + F32(nb)
            if b.kind == "av":
                out[:, b.start:b.end], cur = _av(b, cur, merge)
            elif b.kind == "audio":
                n_tok = b.end - b.start
                out[:, b.start:b.end] = np.arange(n_tok, dtype=F32) + cur
                cur = out[0, b.end - 1] + F32(1)
            else:
                t_index = (temporal_index(b.grid[0], b.second_per_grid) if b.kind == "video"
                           else np.arange(b.grid[0], dtype=F32) * F32(POSITION_ID_PER_SECONDS))
                pos = _vision(b.grid, t_index, cur, merge)
                out[:, b.start:b.end] = pos
                cur = F32(pos.max()) + F32(1)
            out[:, b.end:re_] = np.arange(nb, dtype=F32) + cur  # the eos pair
            base, run = out[0, re_ - 1] + F32(1), 0  # the next iteration's st_idx: the eos piece's max + 1
            s = re_
            k += 1
        out[:, s:e] = np.arange(run, run + e - s, dtype=F32) + base
        state[n] = (base, run + e - s)
    return out
