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

ID_PATTERN = r"^(?P<path>.*):(?P<line>[0-9]+)(?:@(?P<chunk>[0-9]+))?(?:#(?P<copy>[0-9]+))?$"
"""An example id, parsed (Arrow / ``re`` syntax): path, line, optional chunk, optional copy."""


def chunk_id(example_id: str, chunk: int) -> str:
    """``chunk_id("a.jsonl:12", 3) == "a.jsonl:12@3"``: the id of chunk ``chunk`` of a split record."""
    return f"{example_id}@{chunk}"


def id_location(example_id: str) -> tuple[str, int]:
    """``id_location("a.jsonl:12@3#1") == ("a.jsonl", 12)``: the input line an example id comes from."""
    path, _, rest = example_id.rpartition(":")
    return path, int(rest.split("#")[0].split("@")[0])
