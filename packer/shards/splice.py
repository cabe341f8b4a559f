"""One Parquet shard from part files written by different processes, byte for byte what ``pq.write_table`` of
the whole shard writes (issue 33: the last shard of a build no longer runs on one core while the others idle).

A shard's row groups are independent: with today's options (no page index, no bloom filter, a dictionary per
column chunk) the bytes of row group k do not depend on the others, only the footer does. So the parts of a
shard, split at row-group boundaries and each written by ``pq.write_table`` with the shard's options, hold the
shard's data pages; the shard is part 0's pages, then each next part's pages, then a footer whose row groups are
the parts' with their offsets shifted and ordinals renumbered, ``num_rows`` summed. The footer is a Thrift
compact-protocol ``FileMetaData``: ``decode`` reads it into a generic field tree that keeps every field it does
not touch and ``encode`` writes it back; a footer that does not re-encode to its own bytes, or that holds
anything whose offsets this does not shift (a page index, a bloom filter, encryption), raises ``SpliceError``
and the caller writes the whole shard instead. Never silently different: ``tests/shards/test_splice.py`` checks
random tables, row-group counts and split points against ``pq.write_table``."""

from __future__ import annotations

import hashlib
import os
import struct
from pathlib import Path
from typing import Any

MAGIC = b"PAR1"

# compact-protocol element types
_TRUE, _FALSE, _BYTE, _I16, _I32, _I64, _DOUBLE, _BINARY, _LIST, _SET, _MAP, _STRUCT = range(1, 13)


class SpliceError(Exception):
    """A part file this module cannot splice exactly; write the whole shard instead."""


# ------------------------------------------------------------------------------------------- thrift
class Struct:
    """A decoded Thrift struct: its fields in wire order, as ``[field id, type, value]`` (a bool field's
    type is ``_TRUE``/``_FALSE``; a list is ``(element type, [values])``; a map ``(key type, value type,
    [(k, v)])``; a struct a ``Struct``)."""

    __slots__ = ("fields",)

    def __init__(self, fields: list[list[Any]]) -> None:
        self.fields = fields

    def get(self, fid: int) -> list[Any] | None:
        for f in self.fields:
            if f[0] == fid:
                return f
        return None


class _Reader:
    __slots__ = ("buf", "pos")

    def __init__(self, buf: bytes) -> None:
        self.buf, self.pos = buf, 0

    def byte(self) -> int:
        b = self.buf[self.pos]
        self.pos += 1
        return b

    def varint(self) -> int:
        shift = result = 0
        while True:
            b = self.byte()
            result |= (b & 0x7F) << shift
            if not b & 0x80:
                return result
            shift += 7

    def zigzag(self) -> int:
        n = self.varint()
        return (n >> 1) ^ -(n & 1)

    def value(self, t: int) -> Any:
        if t in (_I16, _I32, _I64):
            return self.zigzag()
        if t == _BINARY:
            n = self.varint()
            self.pos += n
            if self.pos > len(self.buf):
                raise SpliceError("truncated footer")
            return self.buf[self.pos - n : self.pos]
        if t == _STRUCT:
            return self.struct()
        if t == _BYTE:
            return self.byte()
        if t == _DOUBLE:
            self.pos += 8
            return self.buf[self.pos - 8 : self.pos]
        if t in (_LIST, _SET):
            h = self.byte()
            n, et = h >> 4, h & 0x0F
            if n == 15:
                n = self.varint()
            if et in (_TRUE, _FALSE):  # a bool element is one byte
                return et, [self.byte() for _ in range(n)]
            return et, [self.value(et) for _ in range(n)]
        if t == _MAP:
            n = self.varint()
            if n == 0:
                return 0, 0, []
            kv = self.byte()
            kt, vt = kv >> 4, kv & 0x0F
            return kt, vt, [(self.value(kt), self.value(vt)) for _ in range(n)]
        raise SpliceError(f"unknown thrift type {t}")

    def struct(self) -> Struct:
        fields: list[list[Any]] = []
        last = 0
        while True:
            h = self.byte()
            if h == 0:
                return Struct(fields)
            t, delta = h & 0x0F, h >> 4
            fid = last + delta if delta else self.zigzag()
            last = fid
            fields.append([fid, t, None if t in (_TRUE, _FALSE) else self.value(t)])


def _varint(out: bytearray, n: int) -> None:
    while n > 0x7F:
        out.append((n & 0x7F) | 0x80)
        n >>= 7
    out.append(n)


def _zigzag(out: bytearray, n: int) -> None:
    _varint(out, (n << 1) ^ (n >> 63))


def _value(out: bytearray, t: int, v: Any) -> None:
    if t in (_I16, _I32, _I64):
        _zigzag(out, v)
    elif t == _BINARY:
        _varint(out, len(v))
        out += v
    elif t == _STRUCT:
        _struct(out, v)
    elif t == _BYTE:
        out.append(v)
    elif t == _DOUBLE:
        out += v
    elif t in (_LIST, _SET):
        et, items = v
        out.append((len(items) << 4 | et) if len(items) < 15 else (0xF0 | et))
        if len(items) >= 15:
            _varint(out, len(items))
        if et in (_TRUE, _FALSE):
            out += bytes(items)
        else:
            for item in items:
                _value(out, et, item)
    elif t == _MAP:
        kt, vt, items = v
        _varint(out, len(items))
        if items:
            out.append(kt << 4 | vt)
            for k, x in items:
                _value(out, kt, k)
                _value(out, vt, x)
    else:
        raise SpliceError(f"unknown thrift type {t}")


def _struct(out: bytearray, s: Struct) -> None:
    last = 0
    for fid, t, v in s.fields:
        delta = fid - last
        if 0 < delta <= 15:
            out.append(delta << 4 | t)
        else:
            out.append(t)
            _zigzag(out, fid)
        last = fid
        if t not in (_TRUE, _FALSE):
            _value(out, t, v)
    out.append(0)


def decode(buf: bytes) -> Struct:
    """A compact-protocol struct (all of ``buf``)."""
    r = _Reader(buf)
    try:
        s = r.struct()
    except IndexError as e:
        raise SpliceError("truncated footer") from e
    if r.pos != len(buf):
        raise SpliceError("trailing bytes after the footer")
    return s


def encode(s: Struct) -> bytes:
    out = bytearray()
    _struct(out, s)
    return bytes(out)


# ------------------------------------------------------------------------------------------- parquet
# FileMetaData 3 num_rows, 4 row_groups, 8 encryption_algorithm; RowGroup 1 columns, 5 file_offset, 7 ordinal;
# ColumnChunk 2 file_offset, 3 meta_data, 4 offset_index_offset, 6 column_index_offset, 8 crypto_metadata,
# 9 encrypted_column_metadata; ColumnMetaData 9 data_page_offset, 10 index_page_offset,
# 11 dictionary_page_offset, 14 bloom_filter_offset, 15 bloom_filter_length
_FMD_NUM_ROWS, _FMD_ROW_GROUPS = 3, 4
_FMD_REFUSED = (8, 9)  # encryption_algorithm, footer_signing_key_metadata
_RG_COLUMNS, _RG_FILE_OFFSET, _RG_ORDINAL = 1, 5, 7
_CC_FILE_OFFSET, _CC_META = 2, 3
_CC_REFUSED = (4, 5, 6, 7, 8, 9)  # page index offsets/lengths, encryption
_CMD_OFFSETS = (9, 10, 11)
_CMD_REFUSED = (14, 15)  # bloom filter


def read_footer(path: str | Path) -> tuple[Struct, bytes, int]:
    """A part file's ``FileMetaData``, its bytes, and where its data pages end (the footer's start)."""
    with open(path, "rb") as f:
        size = os.fstat(f.fileno()).st_size
        if size < 12:
            raise SpliceError(f"{path}: not a Parquet file")
        f.seek(0)
        if f.read(4) != MAGIC:
            raise SpliceError(f"{path}: not a Parquet file")
        f.seek(size - 8)
        tail = f.read(8)
        if tail[4:] != MAGIC:
            raise SpliceError(f"{path}: not a Parquet file (encrypted or truncated)")
        n = struct.unpack("<I", tail[:4])[0]
        if n + 12 > size:
            raise SpliceError(f"{path}: footer longer than the file")
        f.seek(size - 8 - n)
        raw = f.read(n)
    meta = decode(raw)
    if encode(meta) != raw:
        raise SpliceError(f"{path}: footer does not re-encode to its own bytes")
    return meta, raw, size - 8 - n


def _shift(meta: Struct, by: int, first_ordinal: int) -> list[Any]:
    """The row groups of ``meta`` moved ``by`` bytes and renumbered from ``first_ordinal`` (in place)."""
    groups = meta.get(_FMD_ROW_GROUPS)
    if groups is None:
        return []
    et, items = groups[2]
    for k, rg in enumerate(items):
        for f in rg.fields:
            if f[0] == _RG_FILE_OFFSET and f[2]:
                f[2] += by
            elif f[0] == _RG_ORDINAL:
                f[2] = first_ordinal + k
        for cc in rg.get(_RG_COLUMNS)[2][1]:
            for f in cc.fields:
                if f[0] in _CC_REFUSED:
                    raise SpliceError("a column chunk with a page index or encryption")
                if f[0] == _CC_FILE_OFFSET and f[2]:
                    f[2] += by
                elif f[0] == _CC_META:
                    for g in f[2].fields:
                        if g[0] in _CMD_REFUSED:
                            raise SpliceError("a column chunk with a bloom filter")
                        if g[0] in _CMD_OFFSETS:
                            g[2] += by
    return items


def _others(meta: Struct) -> bytes:
    """``meta`` without the fields a splice merges: what every part must share (schema, key-value metadata,
    created_by, column orders)."""
    return encode(Struct([f for f in meta.fields if f[0] not in (_FMD_NUM_ROWS, _FMD_ROW_GROUPS)]))


def splice(parts: list[str | Path], path: str | Path) -> dict[str, Any]:
    """Write ``path`` (atomically: a temp name, fsync, rename) from the part files, in order; return its
    ``{"rows", "sha256", "bytes"}``. Raises ``SpliceError`` (nothing at ``path``) where a part cannot be
    spliced exactly."""
    if not parts:
        raise SpliceError("no parts")
    metas = [read_footer(p) for p in parts]
    merged, _, end0 = metas[0]
    shared = _others(merged)
    for m in metas[1:]:
        if _others(m[0]) != shared:
            raise SpliceError("parts of different schemas or writers")
    if any(merged.get(fid) for fid in _FMD_REFUSED):
        raise SpliceError("an encrypted footer")
    groups = _shift(merged, 0, 0)
    rows = merged.get(_FMD_NUM_ROWS)
    pos = end0
    for meta, _, end in metas[1:]:
        groups += _shift(meta, pos - 4, len(groups))
        rows[2] += meta.get(_FMD_NUM_ROWS)[2]
        pos += end - 4
    footer = encode(merged)
    path = Path(path)
    tmp = path.with_name(f"{path.name}.tmp-{os.getpid()}")
    h = hashlib.sha256()
    try:
        with open(tmp, "wb") as out:
            for k, (part, (_, _, end)) in enumerate(zip(parts, metas, strict=True)):
                start = 0 if k == 0 else 4
                with open(part, "rb") as src:
                    _copy(src, out, start, end - start, h)
            tail = footer + struct.pack("<I", len(footer)) + MAGIC
            out.write(tail)
            h.update(tail)
            out.flush()
            if out.tell() != pos + len(tail):
                raise SpliceError(f"{tmp}: wrote {out.tell()} bytes, expected {pos + len(tail)}")
            os.fsync(out.fileno())
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    return {"rows": rows[2], "sha256": h.hexdigest(), "bytes": pos + len(tail)}


def _copy(src: Any, out: Any, start: int, n: int, h: Any) -> None:
    """``n`` bytes of ``src`` from ``start`` appended to ``out``, hashed on the way (one read of the part's
    pages, from the page cache: the hash needs the bytes, so no ``copy_file_range``)."""
    src.seek(start)
    while n > 0:
        block = src.read(min(n, 1 << 22))
        if not block:
            raise SpliceError(f"{src.name}: shorter than its footer says")
        out.write(block)
        h.update(block)
        n -= len(block)
