"""Reading input files (packer/formats/read.py): line numbers, blank lines, bad bytes and JSON as rejects, not
exceptions; relative image paths from any working directory; input patterns -> files."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from packer.core.types import Example, ImageRef
from packer.errors import ConfigError, RecordError
from packer.formats.read import expand_inputs, read_jsonl

# ---------------------------------------------------------------- read_jsonl


def test_read_jsonl_line_numbers_and_bad_lines(imgdir: Path):
    path = imgdir / "data.jsonl"
    lines = [
        json.dumps({"text": "one"}).encode(),  # 1
        b"",  # 2 blank
        b"   \t",  # 3 whitespace only
        b'{"text": "caf\xe9"}',  # 4 latin-1, not UTF-8
        b'{"text": "x",}',  # 5 malformed
        b'"just a string"',  # 6 JSON but not an object
        json.dumps(
            {"image": "sub/b.jpg", "conversations": [{"from": "human", "value": "<image>"}]}
        ).encode(),  # 7
        json.dumps({"messages": [{"role": "alien", "content": "x"}]}).encode(),  # 8
        json.dumps({"text": "caf\u00e9 \u2603"}, ensure_ascii=False).encode(),  # 9 real UTF-8
    ]
    path.write_bytes(b"\xef\xbb\xbf" + b"\n".join(lines))  # BOM on line 1, no trailing newline
    out = list(read_jsonl(str(path), source_name="s"))
    assert [n for n, _ in out] == [1, 4, 5, 6, 7, 8, 9]
    kinds = [r.kind if isinstance(r, Example) else r.reason for _, r in out]
    assert kinds == ["text", "not_utf8", "malformed_json", "malformed_json", "llava", "unknown_role", "text"]
    errs = {n: r for n, r in out if isinstance(r, RecordError)}
    assert (
        str(errs[4])
        == f"{path}:4: not_utf8: invalid UTF-8 byte b'\\xe9' at byte 13; re-encode the file as UTF-8"
    )
    assert (
        str(errs[5])
        == f"{path}:5: malformed_json: Expecting property name enclosed in double quotes at column 14"
    )
    assert str(errs[6]) == f"{path}:6: malformed_json: the line is a JSON str, not an object"
    assert errs[8].path == str(path) and errs[8].line == 8
    ok = {n: r for n, r in out if isinstance(r, Example)}
    assert ok[7].images == [ImageRef(path=str(imgdir / "sub" / "b.jpg"))]  # relative to the JSONL's directory
    assert ok[7].example_id == f"{path}:7" and ok[7].source_name == "s"
    assert ok[9].text == "caf\u00e9 \u2603"


def test_read_jsonl_relative_path_from_any_cwd(imgdir: Path, monkeypatch):
    (imgdir / "d.jsonl").write_text(
        json.dumps({"image": "a.jpg", "conversations": [{"from": "human", "value": "<image>"}]})
    )
    monkeypatch.chdir(imgdir / "sub")
    [(line, ex)] = list(read_jsonl("../d.jsonl"))
    assert (
        line == 1 and ex.images == [ImageRef(path=str(imgdir / "a.jpg"))] and ex.example_id == "../d.jsonl:1"
    )


def test_read_jsonl_image_root(imgdir: Path, tmp_path_factory):
    other = tmp_path_factory.mktemp("jsonl")
    (other / "d.jsonl").write_text(
        json.dumps({"image": "sub/b.jpg", "conversations": [{"from": "human", "value": "<image>"}]}) + "\n"
    )
    [(_, ex)] = list(read_jsonl(str(other / "d.jsonl"), image_root=str(imgdir)))
    assert ex.images == [ImageRef(path=str(imgdir / "sub" / "b.jpg"))]


def test_read_jsonl_streams(tmp_path: Path):
    """The reader yields the first record before later lines exist (no whole-file load)."""
    path = tmp_path / "s.jsonl"
    with open(path, "w") as f:
        f.write('{"text": "a"}\n')
        f.flush()
        it = read_jsonl(str(path))
        assert next(it)[0] == 1
        f.write('{"text": "b"}\n')
        f.flush()
        assert next(it)[0] == 2


# ---------------------------------------------------------------- expand_inputs


def test_expand_inputs(tmp_path: Path, monkeypatch):
    for name in ("b.jsonl", "a.jsonl", "sub/c.jsonl", "sub/d.txt"):
        (tmp_path / name).parent.mkdir(exist_ok=True)
        (tmp_path / name).write_text("")
    monkeypatch.chdir(tmp_path)
    assert expand_inputs(["b.jsonl", "*.jsonl", "./a.jsonl", "sub"]) == [
        "a.jsonl",
        "b.jsonl",
        os.path.join("sub", "c.jsonl"),
    ]
    assert expand_inputs(["**/*.jsonl"]) == ["a.jsonl", "b.jsonl", os.path.join("sub", "c.jsonl")]
    with pytest.raises(ConfigError, match=r"input 'nothing\*.jsonl' matches no file"):
        expand_inputs(["a.jsonl", "nothing*.jsonl"])
