"""formats/files.py on real files: JSON arrays, gzip/zstd/bzip2/xz, .txt, webdataset tars; broken ones fail
naming the file and the position."""

from __future__ import annotations

import bz2
import gzip
import io
import json
import lzma
import tarfile
from pathlib import Path

import pytest
import zstandard
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from packer.errors import ConfigError, RecordError
from packer.formats.files import is_streamed, kind, records, sniff
from packer.formats.read import chosen_lines, expand_inputs, read_jsonl

RECORDS = [{"messages": [{"role": "user", "content": f"q{i} ü"}, {"role": "assistant", "content": f"a{i}"}]}
           for i in range(5)]
COMPRESS = {".gz": gzip.compress, ".zst": lambda b: zstandard.ZstdCompressor().compress(b), ".bz2": bz2.compress,
            ".xz": lzma.compress}


def _jsonl_bytes(recs: list) -> bytes:
    return "".join(json.dumps(r, ensure_ascii=False) + "\n" for r in recs).encode()


def _numbered(path: Path) -> list[tuple[int, dict]]:
    return [(n, json.loads(raw)) for n, raw in records(str(path))]


@pytest.mark.parametrize("indent", [None, 2])
def test_array_elements_numbered_from_one(tmp_path: Path, indent):
    path = tmp_path / "d.json"
    path.write_text(json.dumps(RECORDS, indent=indent, ensure_ascii=False))
    assert kind(str(path)) == "array" and is_streamed(str(path))
    assert _numbered(path) == list(enumerate(RECORDS, start=1))


def test_json_named_file_of_lines_is_jsonl(tmp_path: Path):
    path = tmp_path / "d.json"
    path.write_bytes(_jsonl_bytes(RECORDS))
    assert kind(str(path)) == "jsonl" and not is_streamed(str(path))
    one_line_array = tmp_path / "llava.jsonl"
    one_line_array.write_text("\n  " + json.dumps(RECORDS))
    assert kind(str(one_line_array)) == "array"


@pytest.mark.parametrize("suffix", list(COMPRESS))
@pytest.mark.parametrize("inner", [".jsonl", ".json"])
def test_compressed_lines_and_arrays(tmp_path: Path, suffix, inner):
    recs = [*RECORDS[:2], None, *RECORDS[2:]]  # None: a blank line in the JSONL form
    raw = (json.dumps(RECORDS, indent=1, ensure_ascii=False).encode() if inner == ".json"
           else b"".join(b"\n" if r is None else json.dumps(r, ensure_ascii=False).encode() + b"\n" for r in recs))
    path = tmp_path / f"d{inner}{suffix}"
    path.write_bytes(COMPRESS[suffix](raw))
    got = _numbered(path)
    if inner == ".json":
        assert got == list(enumerate(RECORDS, start=1))
    else:  # numbers are decompressed lines: the blank line 3 is skipped but counted
        assert got == [(1, RECORDS[0]), (2, RECORDS[1]), (4, RECORDS[2]), (5, RECORDS[3]), (6, RECORDS[4])]
    assert [n for n, _ in chosen_lines(str(path), [4])] == [4 if inner == ".jsonl" else 4]


def test_txt_one_record_per_non_blank_line(tmp_path: Path):
    path = tmp_path / "wiki.txt.gz"
    path.write_bytes(gzip.compress("\ufefffirst line\r\n\n   \nsecond ü\nthird".encode()))
    assert _numbered(path) == [(1, {"text": "first line"}), (4, {"text": "second ü"}), (5, {"text": "third"})]
    bad = tmp_path / "bad.txt"
    bad.write_bytes(b"ok\n\xff\xfe\n")
    [(_, ok), (line, err)] = list(read_jsonl(str(bad)))
    assert ok.root is not None and isinstance(err, RecordError) and err.reason == "not_utf8" and line == 2


@pytest.mark.parametrize("suffix", list(COMPRESS))
def test_truncated_stream_names_file_and_position(tmp_path: Path, suffix):
    path = tmp_path / f"c4.jsonl{suffix}"
    full = COMPRESS[suffix](_jsonl_bytes(RECORDS * 2000))
    path.write_bytes(full[: len(full) // 2])
    with pytest.raises(ConfigError, match=r"c4\.jsonl.*cut short or corrupt (after |before its first record \()decompressed line \d+"):
        list(records(str(path)))


@pytest.mark.parametrize(("text", "where"), [
    ('[{"text": "a"}, {"text": "b"}', r"element 3 \(after 2 good elements\), at character 29: the file ends"),
    ('[{"text": "a"} x {"text": "b"}]', r"element 2 \(after 1 good elements\), at character 15: expected ','"),
    ('[{"text": "a"}, {"text": "b', r"element 2 \(after 1 good elements\), at character 16: Unterminated"),
    ('[{"text": "a"}] [{"text": "b"}]', r"element 2 .*follows the array's closing"),
    ('[{"text": "a"},]', r"element 2 .*a ',' before the closing"),
])
def test_broken_array_is_an_error_naming_element(tmp_path: Path, text, where):
    path = tmp_path / "mllm_demo.json"
    path.write_text(text)
    with pytest.raises(ConfigError, match=rf"mllm_demo\.json: the JSON array breaks in {where}"):
        list(records(str(path)))


def test_array_non_object_elements_are_rejects(tmp_path: Path):
    path = tmp_path / "d.json"
    path.write_bytes(b'[{"text": "a"}, 7, ["x"], {"nothing": 1}, {"text": "\\ud800"}, {"text": "\xff"},\n'
                     b' {"text": 12345678901234567890123}, {"text": NaN}]')
    out = list(read_jsonl(str(path)))
    assert [n for n, _ in out] == [1, 2, 3, 4, 5, 6, 7, 8]
    assert [getattr(e, "reason", None) for _, e in out] == [  # as the same JSONL lines
        None, "malformed_json", "malformed_json", "unknown_format", "not_utf8", "not_utf8", "wrong_type", "wrong_type"]
    assert str(out[1][1]).startswith(f"{path}:2")


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(recs=st.lists(st.dictionaries(st.sampled_from(["text", "id", "x"]),
                                     st.one_of(st.text(max_size=8), st.integers(), st.floats(allow_nan=False),
                                               st.none()), min_size=1), max_size=6),
       indent=st.sampled_from([None, 0, 2]), cut=st.integers(min_value=0, max_value=10_000))
def test_fuzzed_arrays_read_whole_or_fail_loudly(tmp_path: Path, recs, indent, cut):
    """Any array reads back element for element; any cut of it either loses only trailing whitespace or
    fails with a ConfigError naming the file, never another exception and never a silent short read."""
    text = json.dumps(recs, indent=indent)
    path = tmp_path / "f.json"
    path.write_text(text)
    assert [json.loads(raw) for _, raw in records(str(path))] == json.loads(json.dumps(recs))
    cut = cut % (len(text) + 1)
    path.write_text(text[:cut])
    if not text[:cut].strip():
        return  # nothing left: a JSONL file of no line
    try:
        got = [json.loads(raw) for _, raw in records(str(path))]
    except ConfigError as e:
        assert str(path) in str(e) and "element" in str(e)
    else:
        assert text[:cut].rstrip() == text.rstrip() and got == json.loads(json.dumps(recs))


# ---------------------------------------------------------------------------------------- webdataset
def _tar(path: Path, members: list[tuple[str, bytes]], mode: str = "w") -> Path:
    with tarfile.open(path, mode) as tar:
        for name, data in members:
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
    return path


def test_tar_samples(tmp_path: Path, imgdir: Path):
    jpg = (imgdir / "a.jpg").read_bytes()
    record = {"messages": [{"role": "user", "content": [{"type": "image", "image": "s2.jpg"},
                                                        {"type": "text", "text": "Describe."}]},
                           {"role": "assistant", "content": "A cat."}]}
    path = _tar(tmp_path / "shard-000.tar.gz", [
        ("s1.jpg", jpg), ("s1.txt", b"a caption"), ("s1.json", b'{"url": "http://x"}'),  # metadata json
        ("s2.jpg", jpg), ("s2.json", json.dumps(record).encode()),
        ("s3.txt", b"only text"),
        ("s4.json", json.dumps({"messages": [{"role": "user", "content": [{"type": "image", "image": "s4.png"}]},
                                             {"role": "assistant", "content": "x"}]}).encode()),
        ("s5.jpg", jpg),
    ], mode="w:gz")
    assert kind(str(path)) == "tar"
    out = list(read_jsonl(str(path)))
    assert [n for n, _ in out] == [1, 2, 3, 4, 5]
    (_, cap), (_, rec), (_, text), (_, missing), (_, lonely) = out
    assert [m.role for m in cap.root.messages] == ["user", "assistant"]
    assert cap.root.messages[0].images[0].data == jpg and cap.root.messages[1].parts == ["a caption"]
    assert rec.root.messages[0].images[0].data == jpg
    assert text.kind == "text"
    assert isinstance(missing, RecordError) and missing.reason == "missing_image"
    assert "shard-000.tar.gz sample 4 (key 's4')" in missing.message and "'s4.png'" in missing.message
    assert isinstance(lonely, RecordError) and lonely.reason == "empty_messages" and "s5" in lonely.message


def test_truncated_tar_names_sample(tmp_path: Path):
    path = _tar(tmp_path / "t.tar", [(f"k{i}.txt", b"x" * 3000) for i in range(6)])
    data = path.read_bytes()
    path.write_bytes(data[: len(data) // 2])
    with pytest.raises(ConfigError, match=r"t\.tar: the file is cut short or corrupt after sample \d+ \(key 'k\d'\)"):
        list(records(str(path)))


def test_sniff_hints(tmp_path: Path):
    gz = tmp_path / "c4.jsonl"
    gz.write_bytes(gzip.compress(b'{"text": "a"}\n'))
    assert sniff(str(gz)) == f"{gz} holds gzip bytes: name it {gz}.gz"
    zst = tmp_path / "z.jsonl"
    zst.write_bytes(zstandard.ZstdCompressor().compress(b'{"text": "a"}\n'))
    assert "zstd bytes" in sniff(str(zst))
    txt = tmp_path / "wiki.jsonl"
    txt.write_text("Some plain prose.\nMore of it.\n")
    assert "plain text" in sniff(str(txt)) and "name it .txt" in sniff(str(txt))
    pretty = tmp_path / "one.json"
    pretty.write_text(json.dumps({"messages": []}, indent=2))
    assert "pretty-printed JSON" in sniff(str(pretty))
    lines = tmp_path / "ok.jsonl"
    lines.write_text('{"text": "a"}\n{"text": "b"}\n')
    assert sniff(str(lines)) is None
    arr = tmp_path / "a.txt"
    arr.write_text('[{"text": "a"}]')
    assert "JSON array" in sniff(str(arr))


def test_directory_without_jsonl_gives_streamed_files(tmp_path: Path):
    (tmp_path / "a.json").write_text("[]")
    (tmp_path / "b.jsonl.zst").write_bytes(COMPRESS[".zst"](b"{}\n"))
    (tmp_path / "c.txt").write_text("x\n")
    assert [Path(p).name for p in expand_inputs([str(tmp_path)])] == ["a.json", "b.jsonl.zst", "c.txt"]


def test_array_elements_across_buffer_boundaries(tmp_path: Path, monkeypatch):
    """Numbers, literals and strings cut by the read buffer's end are read whole (a 7-character buffer)."""
    import packer.formats.files as files

    monkeypatch.setattr(files, "_BLOCK", 7)
    recs = [{"text": "x" * (i % 13), "n": -(10**25) * i, "f": 1.5e-3, "t": True, "z": None} for i in range(60)]
    path = tmp_path / "b.json"
    for indent in (None, 3):
        path.write_text(json.dumps(recs, indent=indent))
        assert [json.loads(raw) for _, raw in records(str(path))] == recs
    path.write_text("[1, 22, 333, true, null, 4.5e10]")
    assert [raw for _, raw in records(str(path))] == [b"1", b"22", b"333", b"true", b"null", b"4.5e10"]


def test_tar_video_member_is_extracted_once(tmp_path: Path):
    """packer reads videos from files: a video member becomes a file under media_dir that the record names."""
    clip = b"\x00\x00\x00\x18ftypmp42" + bytes(range(200))  # the bytes are copied, not decoded, here
    rec = {"messages": [{"role": "user", "content": [{"type": "video", "video": "v1.mp4"}]},
                        {"role": "assistant", "content": "A clip."}]}
    path = _tar(tmp_path / "vid.tar", [("v1.mp4", clip), ("v1.json", json.dumps(rec).encode())])
    media = tmp_path / "media"
    for _ in range(2):  # a second read finds the file in place
        [(n, raw)] = list(records(str(path), media_dir=str(media)))
        video = json.loads(raw)["messages"][0]["content"][0]["video"]
        assert n == 1 and Path(video).parent == media and Path(video).read_bytes() == clip
    assert [p.name for p in media.iterdir()] == ["vid.tar.00000001.mp4"]
