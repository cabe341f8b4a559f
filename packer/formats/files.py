"""Input files that are not plain JSONL, streamed into numbered JSON lines (``records``):

    kind      how it is told                                        record k is
    jsonl     anything else (first non-blank byte not ``[``)        line k of the (decompressed) file
    array     first non-whitespace byte ``[`` (.json, .jsonl ...)  element k of the array (1-based)
    txt       ``.txt``                                              ``{"text": line k}``, blank lines skipped
    tar       ``.tar`` (webdataset shard)                           sample k: members grouped by key

Compression goes by the last extension (``.gz``, ``.zst``, ``.bz2``, ``.xz``; ``.tgz``) and is decompressed as
it is read, never whole. A plain, uncompressed JSONL file never comes here: the scan cuts it into byte ranges
(``pipeline/stages.py``). Everything else is read once, in order, by ``records``; the build spills its lines
into chunk files (``stages.scan_chunks``) and the encode tasks read those.

A file that cannot be read to its end (an array without its ``]``, bytes between elements, a truncated
compressed stream or tar) raises ``ConfigError`` naming the file and the position: such a build stops rather
than pack part of a file. A bad *record* inside a readable file is a reject like any JSONL line's: a tar
sample with a missing member comes out as a reject line (``reject_line``) that ``read.parse_line`` raises.

Webdataset samples (members ``KEY.EXT`` grouped by KEY, the part of the name before the first dot):

- ``KEY.json`` holding a packer record (``messages``, ``conversations``, ``text`` or ``chosen``) is that record;
  a string in it naming a member (``"KEY.jpg"`` or ``"jpg"``) becomes that member: images and audio as ``data:``
  URLs (the shards then carry their bytes), videos as a file extracted under ``media_dir``.
- otherwise image/audio/video members and a caption (``KEY.txt``, ``.caption``, ``.cap``) are one exchange:
  user = the media, assistant = the caption; a caption alone is a ``text`` record.
"""

from __future__ import annotations

import base64
import io
import json
import os
import re
import tarfile
from collections.abc import Iterator
from typing import IO, Any

from packer.errors import ConfigError

COMPRESSIONS = (".gz", ".zst", ".bz2", ".xz")
IMAGE_EXTS = {"jpg": "image/jpeg", "jpeg": "image/jpeg", "png": "image/png", "webp": "image/webp",
              "bmp": "image/bmp", "gif": "image/gif", "tif": "image/tiff", "tiff": "image/tiff"}
AUDIO_EXTS = {"wav": "audio/wav", "flac": "audio/flac", "mp3": "audio/mpeg", "ogg": "audio/ogg", "m4a": "audio/mp4"}
VIDEO_EXTS = ("mp4", "webm", "mkv", "avi", "mov")
CAPTION_EXTS = ("txt", "caption", "cap")
RECORD_FIELDS = ("messages", "conversations", "text", "chosen")  # formats.KINDS' keys
REJECT_KEY = "\x00packer_reject"  # a key no record has: a spilled line that is a reject, not a record
_MAGIC = ((b"\x1f\x8b", ".gz", "gzip"), (b"\x28\xb5\x2f\xfd", ".zst", "zstd"), (b"BZh", ".bz2", "bzip2"),
          (b"\xfd7zXZ\x00", ".xz", "xz"))


def compression(path: str) -> str | None:
    """The compression suffix of ``path`` (``.gz`` ...; ``.tgz`` is ``.gz``), or None."""
    lower = path.lower()
    if lower.endswith(".tgz"):
        return ".gz"
    return next((c for c in COMPRESSIONS if lower.endswith(c)), None)


def _inner_name(path: str) -> str:
    """``path`` less its compression suffix, lower-cased: ``a.jsonl.gz`` -> ``a.jsonl``, ``a.tgz`` -> ``a.tar``."""
    lower = path.lower()
    if lower.endswith(".tgz"):
        return lower[:-4] + ".tar"
    c = compression(path)
    return lower[: -len(c)] if c else lower


def open_bytes(path: str) -> IO[bytes]:
    """``path`` as a stream of its decompressed bytes (by extension), read as it is consumed."""
    from packer.core.location import is_url, open_file

    c = compression(path)
    if c is None:
        return open_file(path)
    if c == ".zst":
        return io.BufferedReader(_Zstd(open_file(path)), buffer_size=1 << 20)
    raw = open_file(path) if is_url(path) else path  # an input URL (s3://): fsspec's file, read in ranged GETs
    if c == ".gz":
        import gzip

        return gzip.open(raw, "rb")
    if c == ".bz2":
        import bz2

        return bz2.open(raw, "rb")
    import lzma

    return lzma.open(raw, "rb")


class _Zstd(io.RawIOBase):
    """A zstd stream's frames, decompressed as read. zstandard's own ``stream_reader`` ends quietly where a file is
    cut inside a frame; this raises EOFError there (a frame's ``eof`` is how a whole one is told)."""

    def __init__(self, raw: IO[bytes]):
        import zstandard

        self.raw, self.zstd = raw, zstandard
        self.obj = zstandard.ZstdDecompressor().decompressobj()
        self.pending, self.fed = b"", False

    def readable(self) -> bool:
        return True

    def readinto(self, b: Any) -> int:
        while not self.pending:
            data = self.raw.read(1 << 20)
            if not data:
                if self.fed and not self.obj.eof:
                    raise EOFError("the zstd stream ends inside a frame (the file is cut short)")
                return 0
            while data:
                if self.obj.eof:  # the next frame
                    self.obj = self.zstd.ZstdDecompressor().decompressobj()
                self.fed = True
                self.pending += self.obj.decompress(data)
                data = self.obj.unused_data if self.obj.eof else b""
        n = min(len(b), len(self.pending))
        b[:n] = self.pending[:n]
        self.pending = self.pending[n:]
        return n

    def close(self) -> None:
        self.raw.close()
        super().close()


def _errors() -> tuple[type[BaseException], ...]:
    """What a truncated or corrupt compressed stream raises while it is read."""
    import lzma
    import zlib

    errors: list[type[BaseException]] = [EOFError, OSError, zlib.error, lzma.LZMAError, tarfile.TarError]
    try:
        import zstandard

        errors.append(zstandard.ZstdError)
    except ImportError:
        pass
    return tuple(errors)


def kind(path: str) -> str:
    """``jsonl``, ``array``, ``txt`` or ``tar`` (tables are ``tables.is_table``'s); an array is told by its first
    non-whitespace byte, so a ``.json`` file of one object per line is JSONL and a ``.jsonl`` file holding one
    array is an array."""
    inner = _inner_name(path)
    if inner.endswith(".tar"):
        return "tar"
    if inner.endswith(".txt"):
        return "txt"
    try:
        with open_bytes(path) as f:
            head = f.read(4096)
            while head and not head.lstrip(b" \t\r\n\xef\xbb\xbf"):
                head = f.read(4096)
    except _errors() as e:
        raise _stream_error(path, "before its first record (decompressed line 1)", e) from None
    return "array" if head.lstrip(b" \t\r\n\xef\xbb\xbf").startswith(b"[") else "jsonl"


def is_streamed(path: str) -> bool:
    """Is ``path`` read by ``records`` (and spilled by the build) rather than cut into byte ranges?"""
    return compression(path) is not None or kind(path) != "jsonl"


def sniff(path: str) -> str | None:
    """A hint when ``path``'s bytes look like another kind than its name says (for a build whose rejects are
    all one reason): compressed bytes under a plain name, an array, plain text."""
    try:
        with open(path, "rb") as f:
            head = f.read(4096)
    except OSError:
        return None
    if compression(path) is None:
        for magic, suffix, name in _MAGIC:
            if head.startswith(magic):
                return f"{path} holds {name} bytes: name it {path}{suffix}"
        if len(head) >= 262 and head[257:262] == b"ustar":
            return f"{path} is a tar archive: name it {path}.tar (webdataset shards are read as .tar)"
    else:
        return None
    text = head.lstrip(b"\xef\xbb\xbf \t\r\n")
    if text.startswith(b"["):
        return f"{path} is a JSON array (packer reads it element by element)"
    if text and not text.startswith(b"{") and not path.lower().endswith(".txt"):
        return f"{path} looks like plain text, not JSON lines: name it .txt to read one text record per line"
    first, newline, _ = text.partition(b"\n")
    if text.startswith(b"{") and newline:
        try:
            json.loads(first)
        except ValueError:  # "{" alone on line 1: an object spread over lines
            return (f"{path} looks like pretty-printed JSON, not one object per line: write it as JSON lines, or "
                    "as a JSON array of records")
    return None


def reject_line(reason: str, message: str) -> bytes:
    """A spilled line that ``read.parse_line`` turns into ``RecordError(reason, message)``."""
    return json.dumps({REJECT_KEY: [reason, message]}).encode()


def records(path: str, *, media_dir: str | None = None) -> Iterator[tuple[int, bytes]]:
    """``(number, JSON bytes)`` of each record of ``path`` (any kind), in order, numbers 1-based and increasing
    (gaps where a JSONL or text file has blank lines). ``media_dir``: where a tar's video members are
    extracted (default: a temporary directory). Raises ConfigError where the file cannot be read on."""
    k = kind(path)
    reader = {"jsonl": _jsonl, "array": _array, "txt": _txt, "tar": _tar}[k]
    return reader(path, media_dir=media_dir)


def _stream_error(path: str, where: str, e: BaseException) -> ConfigError:
    what = f"the {compression(path)[1:]} stream" if compression(path) else "the file"
    return ConfigError(f"{path}: {what} is cut short or corrupt {where}: {type(e).__name__}: {e}; nothing of "
                       "this file is packed (re-download or re-compress it)")


def _jsonl(path: str, *, media_dir: str | None = None) -> Iterator[tuple[int, bytes]]:
    n = 0
    try:
        with open_bytes(path) as f:
            for n, raw in enumerate(f, start=1):  # noqa: B007 - n names the position of an error
                if raw.strip():
                    yield n, raw.rstrip(b"\n")
    except _errors() as e:
        raise _stream_error(path, f"after decompressed line {n}", e) from None


def _txt(path: str, *, media_dir: str | None = None) -> Iterator[tuple[int, bytes]]:
    n = 0
    try:
        with open_bytes(path) as f:
            for n, raw in enumerate(f, start=1):  # noqa: B007
                if n == 1 and raw.startswith(b"\xef\xbb\xbf"):
                    raw = raw[3:]
                line = raw.rstrip(b"\n").removesuffix(b"\r")
                if not line.strip():
                    continue  # blank lines are no records (nor are they in the JSONL reader)
                try:
                    yield n, json.dumps({"text": line.decode("utf-8")}, ensure_ascii=False).encode()
                except UnicodeDecodeError as e:
                    yield n, reject_line("not_utf8", f"invalid UTF-8 byte {line[e.start:e.start + 1]!r} at byte "
                                                     f"{e.start}; re-encode the file as UTF-8")
    except _errors() as e:
        raise _stream_error(path, f"after decompressed line {n}", e) from None


def _dumps(obj: Any) -> bytes:
    """One JSON line; a lone surrogate is kept escaped, so ``parse_line`` rejects it as it would in JSONL."""
    try:
        return json.dumps(obj, ensure_ascii=False).encode("utf-8")
    except UnicodeEncodeError:
        return json.dumps(obj).encode()


_WS = re.compile(r"[ \t\r\n]*")
_BLOCK = 1 << 20  # characters read at a time; doubled while one element does not fit


def _array(path: str, *, media_dir: str | None = None) -> Iterator[tuple[int, bytes]]:
    """The elements of a JSON array, each parsed by the stdlib's C decoder (``raw_decode``) on a sliding buffer
    and spilled as its own text on one line (JSON has no raw newline inside a string): 2.1x faster than ijson
    plus ``json.dumps`` (docs/benchmarks.md, "Input files"), and every element reads as the same JSONL line
    would (NaN, big integers, a lone surrogate or a bad byte inside a string: the same record or reject)."""
    decoder = json.JSONDecoder()
    n, base = 0, 0  # elements yielded; characters dropped from the front of ``buf``
    try:
        with open_bytes(path) as f:
            text = io.TextIOWrapper(f, encoding="utf-8", errors="surrogateescape", newline="")
            buf, eof, pos = "", False, 0

            def more(block: int) -> None:
                nonlocal buf, eof, pos, base
                data = text.read(block)
                eof = not data
                buf, base, pos = buf[pos:] + data, base + pos, 0

            def skip_ws() -> str:  # the next non-blank character, "" at the end of the file
                nonlocal pos
                while True:
                    pos = _WS.match(buf, pos).end()
                    if pos < len(buf) or eof:
                        return buf[pos : pos + 1]
                    more(_BLOCK)

            def fail(what: str) -> ConfigError:
                return ConfigError(f"{path}: the JSON array breaks in element {n + 1} (after {n} good elements), "
                                   f"at character {base + pos}: {what}; an array needs its closing ']' and "
                                   "nothing but ',' between elements")

            more(_BLOCK)
            if buf.startswith("\ufeff"):
                pos = 1  # a byte-order mark
            if skip_ws() != "[":
                raise fail("the file does not start with '['")
            pos += 1
            if skip_ws() == "]":
                pos += 1
            else:
                while True:
                    block = _BLOCK
                    while True:
                        try:
                            _, end = decoder.raw_decode(buf, pos)
                        except json.JSONDecodeError as e:
                            # the buffer may end inside the element: read on, but not past a real error mid-buffer
                            cut = e.pos >= len(buf) - 8 or e.msg.startswith("Unterminated string")
                            if eof or not cut:
                                raise fail(f"{e.msg} (cut short?)" if cut else e.msg) from None
                            more(block)
                            block *= 2
                            continue
                        except RecursionError:
                            raise fail("nested too deep") from None
                        if end < len(buf) or eof:  # a number at the buffer's end may go on
                            break
                        more(block)
                    n += 1
                    yield n, buf[pos:end].replace("\r", " ").replace("\n", " ").encode("utf-8", "surrogateescape")
                    pos = end
                    after = skip_ws()
                    if after == "]":
                        pos += 1
                        break
                    if after != ",":
                        raise fail(f"expected ',' or ']' after element {n}, found "
                                   f"{after!r}" if after else "the file ends before the closing ']'")
                    pos += 1
                    if skip_ws() == "]":
                        raise fail("a ',' before the closing ']'")
            if skip_ws():
                raise fail("something follows the array's closing ']' (one array per file; JSON lines have "
                           "no '[')")
    except _errors() as e:
        raise _stream_error(path, f"in element {n + 1} (character {base} of the decompressed array)", e) from None


def _member_kind(ext: str) -> str | None:
    last = ext.rsplit(".", 1)[-1]
    if last in IMAGE_EXTS:
        return "image"
    if last in AUDIO_EXTS:
        return "audio"
    if last in VIDEO_EXTS:
        return "video"
    return None


def _tar(path: str, *, media_dir: str | None = None) -> Iterator[tuple[int, bytes]]:
    """A webdataset shard's samples, members grouped by key in tar order (the stream is never seeked)."""
    n, key, members = 0, None, {}
    try:
        with open_bytes(path) as f, tarfile.open(fileobj=f, mode="r|") as tar:
            for info in tar:
                if not info.isfile():
                    continue
                head, base = os.path.split(info.name)
                stem, dot, ext = base.partition(".")
                if not dot or base.startswith("."):
                    continue  # no extension: not a webdataset member (e.g. a README)
                this = os.path.join(head, stem)
                if this != key and key is not None:
                    n += 1
                    yield n, _sample(path, n, key, members, media_dir)
                    members = {}
                key = this
                data = tar.extractfile(info)
                members[ext.lower()] = data.read() if data is not None else b""
            if key is not None:
                n += 1
                yield n, _sample(path, n, key, members, media_dir)
    except _errors() as e:
        raise _stream_error(path, f"after sample {n} (key {key!r})", e) from None


def _sample(path: str, n: int, key: str, members: dict[str, bytes], media_dir: str | None) -> bytes:
    """One sample's members -> one JSON line (a record, or a reject naming the tar, sample and key)."""
    where = f"{os.path.basename(path)} sample {n} (key {key!r})"
    name = os.path.basename(key)
    media = {ext: data for ext, data in members.items() if _member_kind(ext)}

    def member(ext: str) -> str:
        data = members[ext]
        medium = _member_kind(ext)
        if medium == "video":  # packer takes no inline video: the clip becomes a file
            root = media_dir or _temp_media_dir()
            os.makedirs(root, exist_ok=True)
            target = os.path.join(root, f"{os.path.basename(path)}.{n:08d}.{ext}")
            if not os.path.exists(target) or os.path.getsize(target) != len(data):
                tmp = f"{target}.tmp-{os.getpid()}"
                with open(tmp, "wb") as out:
                    out.write(data)
                os.replace(tmp, target)
            return target
        mime = (IMAGE_EXTS if medium == "image" else AUDIO_EXTS)[ext.rsplit(".", 1)[-1]]
        return f"data:{mime};base64,{base64.b64encode(data).decode()}"

    record = None
    if "json" in members:
        try:
            record = json.loads(members["json"].decode("utf-8"))
        except (UnicodeDecodeError, ValueError) as e:
            return reject_line("malformed_json", f"{where}: {name}.json is not JSON: {e}")
        if not isinstance(record, dict):
            return reject_line("malformed_json", f"{where}: {name}.json is a JSON {type(record).__name__}, "
                                                 "not an object")
        if not any(f in record for f in RECORD_FIELDS) and media:
            record = None  # metadata beside a caption (LAION-style): the caption rule below
    if record is not None:
        missing: list[tuple[str, str]] = []

        def resolve(value: Any) -> Any:
            if isinstance(value, dict):
                return {k: resolve(v) for k, v in value.items()}
            if isinstance(value, list):
                return [resolve(v) for v in value]
            if isinstance(value, str) and len(value) < 256:
                ext = value[len(name) + 1:] if value.startswith(name + ".") else value
                if ext.lower() in media:
                    return member(ext.lower())
                if value.startswith(name + ".") and _member_kind(ext.lower()):
                    missing.append((value, _member_kind(ext.lower()) or "image"))
            return value

        record = resolve(record)
        if missing:
            value, medium = missing[0]
            return reject_line(f"missing_{medium}", f"{where}: the record names member {value!r}, which the tar "
                                                    f"does not hold (members: {', '.join(sorted(members))})")
        return _dumps(record)
    caption_ext = next((e for e in CAPTION_EXTS if e in members), None)
    if caption_ext is None:
        return reject_line("empty_messages", f"{where}: no {name}.json record and no caption ({name}.txt) beside "
                                             f"members {', '.join(sorted(members))}; a sample needs one of them")
    try:
        caption = members[caption_ext].decode("utf-8").strip()
    except UnicodeDecodeError:
        return reject_line("not_utf8", f"{where}: {name}.{caption_ext} is not UTF-8")
    if not media:
        return _dumps({"text": caption})
    parts = [{"type": _member_kind(ext), _member_kind(ext): member(ext)} for ext in sorted(media)]
    return _dumps({"messages": [{"role": "user", "content": parts}, {"role": "assistant", "content": caption}]})


_TEMP: list[str] = []


def _temp_media_dir() -> str:
    """A process-wide temporary directory for a tar's video members read outside a build (verify)."""
    if not _TEMP:
        import tempfile

        _TEMP.append(tempfile.mkdtemp(prefix="packer-tar-media-"))
    return _TEMP[0]
