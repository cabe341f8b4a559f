"""``core.location``: a byte range read short (a file cut since the scan) is an error naming the file and the
range, never a chunk silently short; relative media paths resolve against their input's directory or URL."""

from __future__ import annotations

import pytest

from packer.core.location import parent_of, read_range, resolve
from packer.errors import StorageError


def test_a_short_read_names_the_file_and_the_range(tmp_path):
    path = tmp_path / "a.jsonl"
    path.write_bytes(b"0123456789")
    assert read_range(str(path), 2, 6) == b"2345"
    with pytest.raises(StorageError, match=r"a\.jsonl: got 4 of the 8 bytes of \[6, 14\)"):
        read_range(str(path), 6, 14)


def test_media_paths_resolve_against_the_input():
    assert parent_of("s3://bucket/data/a.jsonl") == "s3://bucket/data"
    assert resolve("img/../img/1.jpg", "s3://bucket/data") == "s3://bucket/data/img/1.jpg"
    assert resolve("s3://other/1.jpg", "s3://bucket/data") == "s3://other/1.jpg"
    assert resolve("img/1.jpg", "/data") == "/data/img/1.jpg"
