"""The forms of an example id, written here once: the build makes them, ``packer verify --input`` reads them.

    data/train.jsonl:12         the record on line 12
    data/train.jsonl:12@3       chunk 3 (0-based) of line 12, a long text split by ``--long-docs split``
    data/train.jsonl:12#1       the first up-sampled copy of line 12 (source weight > 1)
    data/train.jsonl:12@3#1     the first up-sampled copy of chunk 3

``@chunk`` is given when the record is encoded (one record -> several examples), ``#copy`` when a shard is
written (one cached example -> several packed copies), so a copy of a chunk reads ``@k#c``. Why two marks: a
copy repeats an example, a chunk is a different part of the record; verify counts them differently.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import numpy as np
    import pyarrow as pa

ID_PATTERN = r"^(?P<path>.*):(?P<line>[0-9]+)(?:@(?P<chunk>[0-9]+))?(?:#(?P<copy>[0-9]+))?$"
"""An example id, parsed (Arrow / ``re`` syntax): path, line, optional chunk, optional copy."""


def chunk_id(example_id: str, chunk: int) -> str:
    """``chunk_id("a.jsonl:12", 3) == "a.jsonl:12@3"``: the id of chunk ``chunk`` of a split record."""
    return f"{example_id}@{chunk}"


def copy_ids(ids: pa.Array | pa.ChunkedArray, copies: np.ndarray) -> pa.Array | pa.ChunkedArray:
    """``ids`` (strings) with ``#k`` appended where ``copies[i]`` (each example's copy number) is k > 0: the ids of
    a shard's up-sampled copies, made by Arrow's kernels (no Python string per example)."""
    import pyarrow as pa
    import pyarrow.compute as pc

    k = pa.array(copies)
    mark = pc.if_else(pc.equal(k, 0), "", pc.binary_join_element_wise("#", pc.cast(k, pa.string()), ""))
    return pc.binary_join_element_wise(ids, mark, "")


def id_location(example_id: str) -> tuple[str, int]:
    """``id_location("a.jsonl:12@3#1") == ("a.jsonl", 12)``: the input line an example id comes from."""
    path, _, rest = example_id.rpartition(":")
    return path, int(rest.split("#")[0].split("@")[0])
