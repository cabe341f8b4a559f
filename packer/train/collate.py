"""``collate``: rows of ``PackedDataset`` -> one unpadded (1, T) batch with explicit boundaries (docs/format.md)."""

from __future__ import annotations

import math
from functools import lru_cache
from typing import TYPE_CHECKING, Any

import numpy as np
import torch

from packer.core.types import IGNORE_INDEX, ImageRef

if TYPE_CHECKING:
    from packer.train.dataset import PackedDataset


@lru_cache(maxsize=4)
def _profile(name: str, **overrides: Any):
    from packer.models import get_profile

    return get_profile(name, **overrides)


def _image_ref(image: dict[str, Any]) -> ImageRef:
    if image["data"] is not None:
        return ImageRef(data=image["data"])
    return ImageRef(path=image["source"])


def _cat(rows: list[dict[str, Any]], key: str, shifts: np.ndarray | None = None) -> np.ndarray:
    """One column of all rows, each optionally shifted (a single row is used as is: no copy)."""
    if len(rows) == 1:
        return rows[0][key] if shifts is None else rows[0][key] + shifts[0]
    if shifts is None:
        return np.concatenate([r[key] for r in rows])
    return np.concatenate([r[key] + s for r, s in zip(rows, shifts, strict=True)])


def collate(rows: list[dict[str, Any]]) -> dict[str, Any]:
    """Concatenate rows into one unpadded (1, T) batch with explicit boundaries (docs/format.md); rows with images
    of a profile with ``bidirectional_images`` add ``bidirectional_spans`` (``ModelProfile.image_spans``)."""
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
    if not (node_parents >= 0).any():  # linear rows: HF's own shifted loss is exact with these
        shift = np.empty_like(labels_np)
        shift[:-1] = labels_np[1:]  # example starts carry -100, so nothing crosses a boundary
        shift[-1:] = IGNORE_INDEX
        batch["shift_labels"] = torch.from_numpy(shift)[None]  # (1, T)
    if "mrope_position_ids" in rows[0]:
        mrope = np.concatenate([r["mrope_position_ids"] for r in rows], axis=1)  # (3, T)
        full = np.empty((4, 1, mrope.shape[1]), dtype=np.int64)  # (4, 1, T): text row, then t/h/w
        full[0, 0] = pos[0].numpy()
        full[1:, 0] = mrope
        batch["position_ids"] = torch.from_numpy(full)
    images = [im for r in rows for im in r["images"]]
    profile = _profile(rows[0]["profile"], **dict(rows[0]["profile_options"])) if images or "profile" in rows[0] else None
    # a family's video frames that act as image runs (Molmo2: token types, the bidirectional block), per row
    frames = [[{"offset": a, "num_tokens": b - a} for v in r.get("videos", ()) for a, b in profile.video_runs(r["input_ids"], v)]
              if profile is not None else [] for r in rows]
    if images and rows[0].get("load_images", True):
        grids = [(im["grid_t"], im["grid_h"], im["grid_w"]) for im in images]
        batch.update(profile.pixel_inputs([_image_ref(im) for im in images], grids))
    if (images or any(frames)) and profile.bidirectional_images:  # each row's spans (the profile's rule)
        spans, nodes = [], 0
        for r, s, f in zip(rows, row_start[:-1], frames, strict=True):
            # (start, end) or (start, end, group): rows shift the offsets, and a group (a row node) by the
            # nodes before the row, so no two rows share one
            for a, b, *group in profile.image_spans([*r["images"], *f], node_offsets=r["node_offsets"],
                                                      node_parents=r["node_parents"]):
                spans.append((a + int(s), b + int(s), *(g + nodes for g in group)))
            nodes += len(r["node_offsets"])
        width = len(spans[0]) if spans else 2
        batch["bidirectional_spans"] = torch.tensor(spans, dtype=torch.int32).reshape(-1, width)  # (S, 2|3)
    offsets = [im["offset"] + int(s) for r, s in zip(rows, row_start[:-1], strict=True) for im in r["images"]]
    if images:  # first vision token of each image in the batch
        batch["image_offsets"] = torch.tensor(offsets, dtype=torch.int64)
    if profile is not None:  # inputs the family derives from the batch (Molmo2's mm_token_type_ids)
        runs = [(o, int(im["num_tokens"])) for o, im in zip(offsets, images, strict=True)]
        runs += [(f["offset"] + int(s), f["num_tokens"]) for fs, s in zip(frames, row_start[:-1], strict=True) for f in fs]
        batch.update(profile.row_inputs(int(row_start[-1]), runs))
    videos = [v for r in rows for v in r.get("videos", ())]
    if videos:  # the profile decodes only each video's sampled frames (video_grid_thw, second_per_grid_ts too)
        if rows[0].get("load_images", True):
            video_profile = _profile(rows[0]["profile"], **{k: v for k, v in rows[0]["profile_options"].items()})
            batch.update(video_profile.video_pixel_values(videos))
        video_offsets = [v["offset"] + int(s) for r, s in zip(rows, row_start[:-1], strict=True) for v in r["videos"]]
        batch["video_offsets"] = torch.tensor(video_offsets, dtype=torch.int64)
        if rows[0].get("load_images", True):
            batch = video_profile.join_vision(batch)
    if "_state" in rows[-1]:
        batch["packer_state"] = [r["_state"] for r in rows]
    return batch


def steps_per_epoch(dataset: PackedDataset, batch_size: int, *, num_workers: int = 0) -> int:
    """Batches this rank yields per epoch: each of the DataLoader's workers batches its own slice of the rank's
    rows, so 2 workers of 5 rows each give 3 + 3 = 6 batches of 2, not 5. The same on every rank.

        steps_per_epoch(ds, 2, num_workers=2)   # len(ds) == 10  ->  6
    """
    n, workers = len(dataset), max(num_workers, 1)
    return sum(math.ceil((n * (w + 1) // workers - n * w // workers) / batch_size) for w in range(workers))
