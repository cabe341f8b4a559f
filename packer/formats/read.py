"""Reading input files: JSONL bytes -> records (line numbers, bad UTF-8, bad JSON), and input patterns -> files
(JSONL, Parquet, Arrow, ``datasets`` directories; tables are read by ``tables.py``; JSON arrays, compressed
files, ``.txt`` and webdataset tars by ``files.py``)."""

from __future__ import annotations

import functools
import glob
import json
import os
import re
from collections.abc import Iterable, Iterator
from typing import Any

from packer.core.location import absolute
from packer.core.types import Example
from packer.errors import ConfigError, RecordError
from packer.formats import parse_record
from packer.formats.files import REJECT_KEY
from packer.formats.plain import parse_plain, plain_text, text_chat

try:  # JSONL lines at ~2x json's speed (docs/benchmarks.md, "Fast paths"); json alone where it is missing
    import orjson
except ImportError:  # pragma: no cover
    orjson = None

_REJECT_PREFIX = json.dumps({REJECT_KEY: 0})[:-3].encode()  # how files.reject_line's lines start
# 19+ digits: an integer orjson would turn into a float (json keeps it exact): such a line takes json
_LONG_NUMBER = re.compile(rb"\d{19}")
_DIGITS = b"0123456789"


def _long_number(raw: bytes) -> bool:
    """Whether ``raw`` holds a run of 19+ digits; the regex only where 19 digits are there at all (the count
    costs a tenth of the regex's scan)."""
    return len(raw) - len(raw.translate(None, _DIGITS)) >= 19 and _LONG_NUMBER.search(raw) is not None

@functools.lru_cache(maxsize=16)
def _root_dir(image_root: str | None, base_dir: str) -> str:
    """``Ctx.root_dir`` of a record (what ``parse_record`` makes of it), once per directory: a chunk's lines all
    name the same one."""
    return absolute(image_root if image_root is not None else base_dir)


_UNREAD = object()  # no value read for a line yet (JSON's null is a value: None)


def parse_lines(
    lines: Iterable[tuple[int, bytes]],
    *,
    path: str,
    base_dir: str,
    image_root: str | None = None,
    source_name: str = "",
    columns: dict[str, str] | None = None,
    audio_in_video: bool = False,
    dataset: dict[str, Any] | None = None,
    values: dict[int, Any] | None = None,
) -> Iterator[Example | RecordError]:
    """``parse_line`` of each (line number, bytes) of a chunk, blank lines skipped, a RecordError yielded (located
    at ``path:line``), in line order. The common line (a plain record, ``formats.plain``) is read in this loop
    without ``parse_line``'s per-line call and lookups, and without its digit count (a plain record keeps no
    number); any other line takes ``parse_line``'s own steps, or ``parse_line`` itself where it starts
    differently (line 1's byte-order mark, a reject line, a long number, JSON orjson refuses). ``values``:
    orjson's value of some of these lines, by line number, read already (``text_chats``' ``TextChats.values``):
    taken from there (and dropped) instead of read again."""
    plain = orjson is not None and dataset is None and not columns
    root = _root_dir(image_root, base_dir) if plain else ""
    for line, raw in lines:
        if not raw or raw.isspace():
            continue  # blank lines are not records (bytes.isspace: the ASCII whitespace bytes.strip takes)
        try:
            if plain and line != 1 and not raw.startswith(_REJECT_PREFIX):
                obj = values.pop(line, _UNREAD) if values else _UNREAD
                if obj is _UNREAD:
                    try:
                        obj = orjson.loads(raw)
                    except orjson.JSONDecodeError:
                        pass  # parse_line reads it with json below, and says why
                if obj is not _UNREAD:  # as parse_line does with orjson's value
                    one = parse_plain(obj, path=path, line=line, root_dir=root, source_name=source_name)
                    if one is not None:
                        # a plain record's Example holds no number (its id is checked, not kept), so a long
                        # integer orjson made a float cannot change it: the digit count is for the others
                        yield one
                        continue
                    if not _long_number(raw):
                        yield parse_record(
                            obj, path=path, line=line, base_dir=base_dir, image_root=image_root,
                            source_name=source_name, columns=columns, audio_in_video=audio_in_video, dataset=dataset,
                        )
                        continue
            yield parse_line(raw, path=path, line=line, base_dir=base_dir, image_root=image_root,
                             source_name=source_name, columns=columns, audio_in_video=audio_in_video, dataset=dataset)
        except RecordError as e:
            yield e if e.path else e.located(path, line)


class TextChats:
    """A chunk's text chats and text records (``text_chats``) as columns. Chat k, input line ``lines[k]`` (its
    bytes ``raws[k]``), has ``nodes[k]`` nodes (its root, then each branch), the next ones of ``counts``, each
    that many messages, the next ones of ``roles`` (canonical names) and ``contents`` (each a non-empty text).
    Text record j, input line ``doc_lines[j]`` (its bytes ``doc_raws[j]``), is ``docs[j]``."""

    __slots__ = ("lines", "raws", "nodes", "counts", "roles", "contents", "doc_lines", "doc_raws", "docs", "values")

    def __init__(self) -> None:
        self.lines: list[int] = []
        self.raws: list[bytes] = []
        self.nodes: list[int] = []
        self.counts: list[int] = []
        self.roles: list[str] = []
        self.contents: list[str] = []
        self.doc_lines: list[int] = []
        self.doc_raws: list[bytes] = []
        self.docs: list[str] = []
        self.values: dict[int, Any] = {}  # orjson's value of each line left to parse_lines that it read (``values``)


def text_chats(lines: Iterable[tuple[int, bytes]]) -> tuple[TextChats, list[tuple[int, bytes]]]:
    """The lines ``parse_lines`` (no ``columns``, no ``dataset``) reads as a chat whose every message is one text,
    linear or with branches (``formats.plain``'s Example of ``Message(role, [text])``s: ``plain.text_chat``), or
    as a ``text`` record (``plain.plain_text``), as columns; and every other non-blank line, in order, for
    ``parse_lines`` (line 1, a reject line, JSON orjson refuses, any other record). Blank lines are no records,
    as there."""
    chats, rest = TextChats(), []
    if orjson is None:  # pragma: no cover - orjson is a dependency; without it every line is parse_lines'
        return chats, [(line, raw) for line, raw in lines if raw and not raw.isspace()]
    counts, roles, contents = chats.counts, chats.roles, chats.contents
    loads = orjson.loads
    for line, raw in lines:
        if not raw or raw.isspace():
            continue
        if line != 1 and not raw.startswith(_REJECT_PREFIX):
            try:
                obj = loads(raw)
            except orjson.JSONDecodeError:
                rest.append((line, raw))
                continue
            n = text_chat(obj, counts, roles, contents)
            if n:
                chats.lines.append(line)
                chats.raws.append(raw)
                chats.nodes.append(n)
                continue
            doc = plain_text(obj)
            if doc is not None:
                chats.doc_lines.append(line)
                chats.doc_raws.append(raw)
                chats.docs.append(doc)
                continue
            chats.values[line] = obj  # parse_lines takes it from there, not read again
        rest.append((line, raw))
    return chats, rest


def parse_line(
    raw: bytes,
    *,
    path: str,
    line: int,
    base_dir: str,
    image_root: str | None = None,
    source_name: str = "",
    columns: dict[str, str] | None = None,
    audio_in_video: bool = False,
    dataset: dict[str, Any] | None = None,
) -> Example:
    """Bytes of one JSONL line -> Example; RecordError for bad UTF-8, bad JSON or a bad record (or for a
    ``files.reject_line``: a record a streamed file could not give, e.g. a tar sample missing a member)."""
    if raw.startswith(_REJECT_PREFIX):
        reason, message = json.loads(raw)[REJECT_KEY]
        raise RecordError(reason, message, path=path, line=line)
    if line == 1 and raw.startswith(b"\xef\xbb\xbf"):
        raw = raw[3:]  # a UTF-8 byte-order mark some editors write
    if orjson is not None and not _long_number(raw):
        # orjson's value where it gives one is json's: it rejects what json would read otherwise (NaN, Infinity,
        # 1e400, a lone surrogate escape, invalid UTF-8) and the long integers are json's above; any line it
        # rejects is read by json below, so every reject keeps json's wording (tests/formats/test_read_orjson.py)
        try:
            obj = orjson.loads(raw)
        except orjson.JSONDecodeError:
            pass
        else:
            if dataset is None and not columns:  # the common record's fast path (formats/plain.py)
                plain = parse_plain(obj, path=path, line=line, root_dir=_root_dir(image_root, base_dir),
                                    source_name=source_name)
                if plain is not None:
                    return plain
            return parse_record(
                obj, path=path, line=line, base_dir=base_dir, image_root=image_root, source_name=source_name,
                columns=columns, audio_in_video=audio_in_video, dataset=dataset,
            )
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as e:
        raise RecordError(
            "not_utf8",
            f"invalid UTF-8 byte {raw[e.start : e.start + 1]!r} at byte {e.start}; re-encode the file as UTF-8",
            path=path,
            line=line,
        ) from None
    try:
        obj = json.loads(text)
    except json.JSONDecodeError as e:
        raise RecordError("malformed_json", f"{e.msg} at column {e.colno}", path=path, line=line) from None
    except (ValueError, RecursionError) as e:  # a 5000-digit integer, arrays nested 100k deep
        raise RecordError("malformed_json", f"{type(e).__name__}: {str(e)[:200]}", path=path, line=line) from None
    if "\\ud" in text or "\\uD" in text:  # only such lines can hold a lone surrogate escape
        try:
            json.dumps(obj, ensure_ascii=False).encode("utf-8")
        except UnicodeEncodeError:  # "\ud800" alone is not text: the tokenizer would raise on it
            raise RecordError(
                "not_utf8",
                "a string holds a lone UTF-16 surrogate escape (\\ud800-\\udfff), which is not text; "
                "fix the producer's escaping",
                path=path,
                line=line,
            ) from None
    return parse_record(
        obj, path=path, line=line, base_dir=base_dir, image_root=image_root, source_name=source_name,
        columns=columns, audio_in_video=audio_in_video, dataset=dataset,
    )


def chosen_lines(path: str, numbers: Iterable[int]) -> Iterator[tuple[int, bytes]]:
    """``(line_number, raw bytes)`` of the given 1-based lines of a JSONL file (of a streamed file: its
    records, ``files.records``), in file order, the byte-order mark of line 1 removed (what verify's
    re-encoding checks read back)."""
    from packer.formats.files import is_streamed, records

    wanted = set(numbers)
    last = max(wanted, default=0)
    if is_streamed(path):
        for number, raw in records(path):
            if number > last:
                return
            if number in wanted:
                yield number, raw
        return
    with open(path, "rb") as f:
        for number, raw in enumerate(f, start=1):
            if number > last:
                return
            if number in wanted:
                yield number, raw[3:] if number == 1 and raw.startswith(b"\xef\xbb\xbf") else raw


def read_jsonl(
    path: str, *, image_root: str | None = None, source_name: str = ""
) -> Iterator[tuple[int, Example | RecordError]]:
    """Stream ``(line_number, Example or RecordError)`` for every non-blank line of a JSONL file (every record
    of another kind ``files.records`` reads: array elements, text lines, tar samples).

    Lines are read as bytes one at a time (1-based numbers; blank lines are skipped but counted), so a bad
    byte or a bad line becomes a RecordError for that line, never an exception for the file.
    """
    from packer.formats.files import is_streamed, records

    base_dir = os.path.dirname(os.path.abspath(path))
    with open(path, "rb") as f:
        lines = records(path) if is_streamed(path) else enumerate(f, start=1)
        for number, raw in lines:
            if not raw.strip():
                continue
            try:
                yield number, parse_line(
                    raw, path=path, line=number, base_dir=base_dir, image_root=image_root, source_name=source_name
                )
            except RecordError as e:
                yield number, e


STREAMED_PATTERNS = ("*.json", "*.json.*", "*.jsonl.*", "*.txt", "*.txt.*", "*.tar", "*.tar.*", "*.tgz")
"""What a directory with no ``*.jsonl`` and no table gives (files.py reads them)."""


def expand_inputs(patterns: Iterable[str]) -> list[str]:
    """Files, directories and glob patterns -> sorted, deduplicated file paths.

    A ``datasets`` directory (``save_to_disk`` output, a Hub snapshot) gives its train split's files
    (``tables.dataset_files``); another directory its ``*.jsonl``, or, with none, its ``*.parquet`` /
    ``*.arrow``, or, with none, its JSON arrays, compressed JSON lines, ``.txt`` files and tars
    (``STREAMED_PATTERNS``). Raises ConfigError naming the first pattern that matches no file.
    """
    from packer.core.location import glob_files, is_dir, is_file, is_url
    from packer.formats.tables import TABLE_SUFFIXES, dataset_files, is_dataset_dir

    found: set[str] = set()
    for pattern in patterns:
        if is_url(pattern):  # an object store (s3://): a file, a prefix's *.jsonl, or a glob
            if is_file(pattern):
                matches = [pattern]
            elif is_dir(pattern):
                matches = glob_files(pattern.rstrip("/") + "/*.jsonl")
            else:
                matches = glob_files(pattern)
            if not matches:
                raise ConfigError(f"input {pattern!r} matches no object; give JSONL objects, prefixes or glob patterns")
            found.update(matches)
            continue
        if os.path.isfile(pattern):
            matches = [pattern]
        elif os.path.isdir(pattern) and is_dataset_dir(pattern):
            matches = dataset_files(pattern)
        elif os.path.isdir(pattern):
            matches = glob.glob(os.path.join(glob.escape(pattern), "*.jsonl")) or [
                m for suffix in TABLE_SUFFIXES for m in glob.glob(os.path.join(glob.escape(pattern), "*" + suffix))
            ] or [m for p in STREAMED_PATTERNS for m in glob.glob(os.path.join(glob.escape(pattern), p))]
        else:
            matches = [m for m in glob.glob(pattern, recursive=True) if os.path.isfile(m)]
        if not matches:
            raise ConfigError(
                f"input {pattern!r} matches no file; give JSONL files, directories or glob patterns"
            )
        found.update(os.path.normpath(m) for m in matches)
    return sorted(found)
