"""``collate``: rows of ``PackedDataset`` -> one unpadded (1, T) batch with explicit boundaries (docs/format.md)."""

from __future__ import annotations

import math
from functools import lru_cache
from typing import TYPE_CHECKING, Any

import numpy as np
import torch

from packer.core.types import IGNORE_INDEX
from packer.errors import ShardError

if TYPE_CHECKING:
    from packer.models.base import ModelProfile
    from packer.models.reader import Reader
    from packer.train.data.dataset import PackedDataset


@lru_cache(maxsize=4)
def _family(name: str, options: tuple[tuple[str, Any], ...]) -> tuple[ModelProfile, Reader]:
    """The rows' profile (``profile`` and ``profile_options`` of a row) and its reader, once per batch kind."""
    from packer.models import get_profile

    profile = get_profile(name, **dict(options))
    return profile, profile.reader()


def _cat(rows: list[dict[str, Any]], key: str, shifts: np.ndarray | None = None) -> np.ndarray:
    """One column of all rows, each optionally shifted (a single row is used as is: no copy)."""
    if len(rows) == 1:
        return rows[0][key] if shifts is None else rows[0][key] + shifts[0]
    if shifts is None:
        return np.concatenate([r[key] for r in rows])
    return np.concatenate([r[key] + s for r, s in zip(rows, shifts, strict=True)])


def collate(rows: list[dict[str, Any]]) -> dict[str, Any]:
    """Concatenate rows into one unpadded (1, T) batch with explicit boundaries (docs/format.md): tokens, labels,
    positions, ``cu_seqlens``, the tree; then the family's part, from the rows' profile: the token ranges that see
    each other (``ImageRule.bidirectional_spans`` -> ``bidirectional_spans``) and the model's media inputs
    (``Reader.batch_inputs``: pixels, grids, ``image_offsets``, its own keys)."""
    row_start = np.cumsum([0] + [len(r["input_ids"]) for r in rows])  # (R+1,)
    labels_np = _cat(rows, "labels").astype(np.int64)  # (T,)
    input_ids = torch.from_numpy(_cat(rows, "input_ids").astype(np.int64))[None]  # (1, T)
    labels = torch.from_numpy(labels_np)[None]  # (1, T)
    pos = torch.from_numpy(_cat(rows, "position_ids").astype(np.int64))[None]  # (1, T)
    if len(rows) == 1:
        cu = rows[0]["cu_seqlens"]
        node_offsets, node_parents = rows[0]["node_offsets"], rows[0]["node_parents"]
    else:
        cu = np.concatenate([rows[0]["cu_seqlens"][:1]] + [r["cu_seqlens"][1:] + s for r, s in zip(rows, row_start[:-1], strict=True)])
        node_start = np.cumsum([0] + [len(r["node_offsets"]) for r in rows])
        node_offsets = _cat(rows, "node_offsets", row_start[:-1])
        node_parents = np.concatenate(
            [np.where(r["node_parents"] < 0, -1, r["node_parents"] + n) for r, n in zip(rows, node_start[:-1], strict=True)]
        )
    cu_t = torch.from_numpy(cu.astype(np.int32))  # (E+1,); a copy: Arrow-backed views are read-only
    max_seqlen = int(np.diff(cu).max()) if len(cu) > 1 else 0
    batch: dict[str, Any] = {
        "input_ids": input_ids,
        "labels": labels,
        "position_ids": pos,
        "cu_seqlens": cu_t,
        "max_seqlen": max_seqlen,
        "cu_seq_lens_q": cu_t,
        "cu_seq_lens_k": cu_t,
        "max_length_q": max_seqlen,
        "max_length_k": max_seqlen,
        "node_offsets": torch.from_numpy(node_offsets.astype(np.int32)),  # (N,)
        "node_parents": torch.from_numpy(node_parents.astype(np.int32)),  # (N,)
        "num_loss_tokens": int(np.count_nonzero(labels_np != IGNORE_INDEX)),
        "example_ids": [e for r in rows for e in r["example_ids"]],
        "num_rows": len(rows),
        # filler rows (PackedDataset's equal shares): labels all -100, so the loss and the count skip them
        "num_filler_rows": sum(bool(r.get("is_filler")) for r in rows),
        "filler_examples": torch.tensor([bool(r.get("is_filler")) for r in rows for _ in r["example_ids"]],
                                        dtype=torch.bool),  # (E,)
    }
    if any(r.get("loss_weights") is not None for r in rows):  # schema v4's weighted rows; the rest weigh 1
        weights = np.concatenate([r["loss_weights"] if r.get("loss_weights") is not None
                                  else (r["labels"] != IGNORE_INDEX).astype(np.float32) for r in rows])
        weights[labels_np == IGNORE_INDEX] = 0  # a filler row's labels were cleared
        batch["loss_weights"] = torch.from_numpy(weights.astype(np.float32))[None]  # (1, T)
    if all("example_sources" in r for r in rows):
        batch["example_sources"] = [s for r in rows for s in r["example_sources"]]
    if not (node_parents >= 0).any():  # linear rows: HF's own shifted loss is exact with these
        shift = np.empty_like(labels_np)
        shift[:-1] = labels_np[1:]  # example starts carry -100, so nothing crosses a boundary
        shift[-1:] = IGNORE_INDEX
        batch["shift_labels"] = torch.from_numpy(shift)[None]  # (1, T)
    if "mrope_position_ids" in rows[0]:
        batch["position_ids"] = _mrope_positions(rows, pos[0].numpy())
    if "profile" in rows[0] or any(r["images"] for r in rows):  # the family's part: its spans, then its media inputs
        name, options = rows[0]["profile"], tuple(sorted(dict(rows[0]["profile_options"]).items()))
        profile, reader = _family(name, options)
        from packer.models.base import bidirectional_spans

        spans, nodes = [], 0
        for r, s in zip(rows, row_start[:-1], strict=True):
            # (start, end) or (start, end, group): rows shift the offsets, and a group (a row node) by the
            # nodes before the row, so no two rows share one
            for a, b, *group in bidirectional_spans(profile, r):
                spans.append((a + int(s), b + int(s), *(g + nodes for g in group)))
            nodes += len(r["node_offsets"])
        if spans:
            batch["bidirectional_spans"] = torch.tensor(spans, dtype=torch.int32).reshape(len(spans), -1)  # (S, 2|3)
        batch.update(reader.batch_inputs(rows, row_start, load_media=rows[0].get("load_images", True)))
    if "_state" in rows[-1]:
        batch["packer_state"] = [r["_state"] for r in rows]
    return batch


def _mrope_positions(rows: list[dict[str, Any]], text: np.ndarray) -> torch.Tensor:
    """(4, 1, T) positions: the text row, then the rows' t/h/w (stored float32 in schema v5, int32 before).
    float32 where the rows' profile's positions are ``fractional`` (Qwen3-Omni's get_rope_index computes them in
    float32), else int64; ShardError where a non-fractional profile's stored position is not a whole number."""
    mrope = np.concatenate([r["mrope_position_ids"] for r in rows], axis=1)  # (3, T)
    fractional = "profile" in rows[0] and _family(
        rows[0]["profile"], tuple(sorted(dict(rows[0]["profile_options"]).items())))[0].positions.fractional
    full = np.empty((4, 1, mrope.shape[1]), dtype=np.float32 if fractional else np.int64)  # text row, then t/h/w
    full[0, 0] = text
    full[1:, 0] = mrope
    if not fractional and mrope.dtype.kind == "f" and not np.array_equal(full[1:, 0], mrope):
        t = int(np.flatnonzero((full[1:, 0] != mrope).any(axis=0))[0])
        raise ShardError(f"mrope_position_ids of token {t} of the batch are {mrope[:, t].tolist()}, not whole numbers, "
                         f"but profile {rows[0].get('profile')!r} has integer positions (a corrupt or foreign shard?)")
    return torch.from_numpy(full)


def steps_per_epoch(dataset: PackedDataset, batch_size: int, *, num_workers: int = 0) -> int:
    """Batches this rank yields per epoch: each of the DataLoader's workers batches its own slice of the rank's
    rows, so 2 workers of 5 rows each give 3 + 3 = 6 batches of 2, not 5. The same on every rank.

        steps_per_epoch(ds, 2, num_workers=2)   # len(ds) == 10  ->  6
    """
    n, workers = len(dataset), max(num_workers, 1)
    return sum(math.ceil((n * (w + 1) // workers - n * w // workers) / batch_size) for w in range(workers))
