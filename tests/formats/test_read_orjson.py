"""``parse_line`` with orjson against ``parse_line`` with json alone: the same record or the same located reject,
word for word, on the lines where the two parsers differ (NaN, Infinity, 1e400, huge integers, lone surrogate
escapes, a byte-order mark, invalid UTF-8, control characters, deep nesting) and on random records."""

from __future__ import annotations

import json

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from packer.errors import RecordError
from packer.formats import read

CHAT = '{"messages": [{"role": "user", "content": %s}, {"role": "assistant", "content": "ok"}]%s}'

LINES = [
    CHAT % ('"hi"', ""),
    CHAT % ('"hi"', ', "x": NaN'),
    CHAT % ('"hi"', ', "x": Infinity'),
    CHAT % ('"hi"', ', "x": -Infinity'),
    CHAT % ('"hi"', ', "x": 1e400'),
    CHAT % ('"hi"', ', "x": ' + "9" * 30),
    CHAT % ('"hi"', ', "x": -9223372036854775809'),
    CHAT % ('"hi"', ', "x": 18446744073709551616'),
    CHAT % ('"hi"', ', "x": ' + "1" * 5000),  # json's int digit limit: its ValueError, worded as today
    CHAT % ('"a \\ud800 b"', ""),  # a lone surrogate: json reads it, packer rejects it
    CHAT % ('"\\udc00"', ""),
    CHAT % ('"\\ud83d\\ude00"', ""),  # a pair is text
    CHAT % ('"x\x01"', ""),
    CHAT % ('"hi"', ', "x": 01'),
    CHAT % ('"hi"', ', "x": [1,]'),
    CHAT % ('"hi"', "") + "{",
    CHAT % ('"hi"', "") + "\x00",
    CHAT % ('"caf\u00e9 \u6771\u4eac"', ', "x": -0, "y": -0.0, "z": 2.2250738585072011e-308'),
    '{"messages": 5}',
    "[" * 5000 + "]" * 5000,
    "[" * 900 + "]" * 900,
    '"just a string"',
    '{"messages": [], "messages": [{"role": "user", "content": "dup"}, {"role": "assistant", "content": "ok"}]}',
]


def _both(raw: bytes, line: int, tmp_path, monkeypatch):
    def run():
        try:
            return read.parse_line(raw, path="f.jsonl", line=line, base_dir=str(tmp_path))
        except RecordError as e:
            return ("reject", e.reason, e.message, e.path, e.line)

    fast = run()
    with monkeypatch.context() as m:
        m.setattr(read, "orjson", None)
        slow = run()
    return fast, slow


@pytest.mark.parametrize("line", range(len(LINES)))
def test_orjson_lines_equal_json(line, tmp_path, monkeypatch):
    fast, slow = _both(LINES[line].encode("utf-8", "surrogatepass"), 3, tmp_path, monkeypatch)
    assert fast == slow


@pytest.mark.parametrize("raw", [b"\xef\xbb\xbf" + CHAT.encode() % (b'"hi"', b""), b'{"a": "\xa0"}', b"\xa0{}",
                                 b'{"messages": [{"role": "user", "content": "\xff"}]}'])
@pytest.mark.parametrize("line", [1, 2])
def test_orjson_bom_and_bad_utf8_equal_json(raw, line, tmp_path, monkeypatch):
    """A byte-order mark (skipped on line 1 only, a reject elsewhere) and invalid UTF-8: json's outcome."""
    fast, slow = _both(raw, line, tmp_path, monkeypatch)
    assert fast == slow


_VALUES = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=5), inner, max_size=3),
    max_leaves=10,
)


@settings(max_examples=200, deadline=None, derandomize=True, database=None)
@given(content=st.text(), extra=_VALUES, ascii_only=st.booleans())
def test_orjson_random_records_equal_json(content, extra, ascii_only, tmp_path_factory):
    tmp = tmp_path_factory.getbasetemp()
    rec = {"messages": [{"role": "user", "content": content}, {"role": "assistant", "content": "ok"}], "meta": extra}
    raw = json.dumps(rec, ensure_ascii=ascii_only).encode("utf-8", "surrogatepass")
    mp = pytest.MonkeyPatch()
    try:
        fast, slow = _both(raw, 7, tmp, mp)
    finally:
        mp.undo()
    assert fast == slow


def _outcome(one):
    return ("reject", one.reason, one.message, one.path, one.line) if isinstance(one, RecordError) else one


@pytest.mark.parametrize("first", [1, 2])
def test_parse_lines_equal_parse_line(first, tmp_path):
    """``parse_lines`` (a chunk's loop, the plain record read in it) gives each line ``parse_line``'s record or
    located reject, in order, blank lines skipped: on every line above, a byte-order mark, invalid UTF-8, a
    reject line, a non-plain record and plain chats (line 1 among them where ``first`` is 1)."""
    raws = [line.encode("utf-8", "surrogatepass") for line in LINES] + [
        b"\xef\xbb\xbf" + CHAT.encode() % (b'"hi"', b""), b'{"a": "\xa0"}', b"", b"  \t", b" \r\n\x0b\x0c",
        json.dumps({read.REJECT_KEY: ["missing_image", "a member is missing"]}).encode(),
        # plain records whose id orjson reads as a float (json: an int) or as json does (within 64 bits)
        *(CHAT.encode() % (b'"hi"', b', "id": ' + n) for n in (b"9" * 30, b"18446744073709551616",
                                                               b"-9223372036854775809", b"18446744073709551615")),
        b'{"text": "plain text", "id": 123456789012345678901234567890}',
        CHAT.encode() % (b'"hi"', b', "system": "be brief"'), b'{"text": "plain text"}',
        b'{"messages": [{"role": "user", "content": "a"}, {"role": "assistant", "content": "b"}], "id": 3}']
    raws = raws[-3:] + raws  # a plain chat first: line 1 where ``first`` is 1
    numbered = list(enumerate(raws, start=first))
    want = []
    for line, raw in numbered:
        if not raw.strip():
            continue
        try:
            want.append(_outcome(read.parse_line(raw, path="f.jsonl", line=line, base_dir=str(tmp_path))))
        except RecordError as e:
            want.append(_outcome(e if e.path else e.located("f.jsonl", line)))
    got = [_outcome(one) for one in read.parse_lines(numbered, path="f.jsonl", base_dir=str(tmp_path))]
    assert got == want
