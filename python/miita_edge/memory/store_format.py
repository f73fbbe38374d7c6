"""The on-disk format of a store version (formats 2 and 3): one file holding every array and the manifest,
its exact size (``encoded_size``), its defensive parser, and the durable (fsynced) writes.

``store.py`` builds versions, pointers and locking on top of this; everything here is a pure
encoding or a single-file operation, so the exact byte size of a commit can be computed in
advance, which is what the budget repair needs. Commits write ``FORMAT_VERSION`` (3); format 2,
the same file with every array's name spelled out, is still read, and the next commit into a
format-2 memory writes format 3 (docs/results/candidates/compact-header.md: why, and the dev
ablation that adopted it). Format 1 (a directory of ``.npy`` files plus ``manifest.json``) is read
by ``store_format_v1``.

Why one file: a memory's budget counts every persisted byte, and at the paper's 1% budgets the
format-1 framing (one 128-byte ``.npy`` header per array plus a ~700-byte JSON manifest) was most
of the memory. A version is now the file ``DIR/vNNNNNNNN``, little-endian throughout::

    offset  size  field
    0       4     magic b"\\x93MIM"
    4       1     format version (2 or 3)
    5       4     CRC32 of every byte of the file except these four
    9       4     version number (u32; must equal the file name's)
    13      var   n_arrays, meta_len                        (LEB128 varints)
            var   per array: its name, dtype code (1 byte), ndim, dims...   (varints but the codes)
            var   meta: the caller's manifest, compact JSON (``meta_len`` bytes)
            var   the arrays' payloads in header order, C order, each at the next offset that is
                  a multiple of its dtype's alignment (zero bytes in between)

An array's name (format 3) is one byte: k in 1..len(ARRAY_NAMES) names ``ARRAY_NAMES[k-1]``, the
arrays a memory's bank writes; 0 is followed by name_len and the name (ASCII [a-z0-9_]+), for
any other array. Format 2 writes every name as name_len, name. Why: at Banking77's 0.5% budget
(1,074 bytes) seven names cost 52 bytes, as much as six answers' keys. ``ARRAY_NAMES`` only grows
at its end: a code, once written, names one array for good.

Offsets are not stored: they follow from the header, so they cannot disagree with it; a reader
recomputes them and requires the file to end exactly at the last payload byte. The writer puts
arrays in order of decreasing alignment, so the only padding is before the first payload
(at most 7 bytes). A dtype code's low 7 bits index ``DTYPES``; bit 7 marks big-endian (only for
multi-byte dtypes, so every dtype has exactly one code). The CRC covers the header, the meta,
the padding and every payload: a changed byte anywhere is detected before anything is used.
"""
from __future__ import annotations

import json
import mmap
import os
import re
import struct
import sys
import zlib
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

#: The format commits write (``layout`` reads it at each call).
FORMAT_VERSION: int = 3
#: The newest format this code reads; a file of a higher one was written by a newer miita-edge.
NEWEST_FORMAT: int = 3
#: Formats this code reads.
READABLE_FORMATS = (1, 2, 3)
#: Single-file formats (``read_version_file``); format 1 is a directory.
FILE_FORMATS = (2, 3)

CURRENT = "CURRENT"
CURRENT_TMP = "CURRENT.tmp"
LOCK = ".lock"
# Fixed width so no length depends on the version number: ``encoded_size`` cannot know which
# version a commit will get, yet must be exact.
VERSION_DIGITS = 8
MAX_VERSION = 10**VERSION_DIGITS - 1
VERSION_RE = re.compile(r"v(\d{%d})" % VERSION_DIGITS)
NAME_RE = re.compile(r"[a-z0-9_]+")
MAX_NAME = 200
# Numeric kinds only: bool, signed, unsigned, float, complex. No objects (pickles), no
# strings, no structured dtypes -- the bank stores vectors, anything else is a bug.
NUMERIC_KINDS = "biufc"
# How often a reader re-reads CURRENT when the version it chose vanished under it
# (a concurrent writer committed and deleted it). Each retry only happens when CURRENT
# actually moved, so this bounds livelock against a writer committing in a tight loop.
READ_RETRIES = 50
CRC_CHUNK = 1 << 20

MAGIC = b"\x93MIM"
FIXED = struct.Struct("<4sBII")  # magic, format, crc32, version
CRC_AT = 5  # offset of the crc32 field
#: dtype codes (the index); all little-endian here, bit 7 of a code selects big-endian.
DTYPES = tuple(np.dtype(d) for d in ("<b1", "<i1", "<u1", "<i2", "<u2", "<i4", "<u4", "<i8", "<u8",
                                     "<f2", "<f4", "<f8", "<c8", "<c16"))
BIG_ENDIAN = 0x80
#: Format 3's one-byte array names: code k (1-based) names ARRAY_NAMES[k-1]; code 0 spells the name
#: out. Append only: readers of every later release must read a code the same way.
ARRAY_NAMES = ("anchors", "anchor_scale", "anchor_count", "anchor_per", "anchor_owner", "counts", "radius",
               "key_kept", "key_shared", "tok_ids", "tok_bits", "tok_idx", "tok_dict", "tok_dict3", "tok3",
               "tok_len", "tokens", "ev_len", "ev3", "dirs", "dir_scale")
NAME_CODES = {name: i + 1 for i, name in enumerate(ARRAY_NAMES)}
SPELLED = 0  # the name code that is followed by the name itself
MAX_NDIM = 32  # numpy allows 64; the bank uses 1 and 2
MAX_ARRAYS = 4096


class Damaged(Exception):
    """A version file that is not a valid format-2 file; ``str()`` is the problem, for one line."""


class Newer(Damaged):
    """A version written in a format newer than this code reads."""


# --------------------------------------------------------------------------- encoding


def dtype_code(dtype: np.dtype) -> int | None:
    """The 1-byte code of a storable dtype, None if it has none (e.g. float128, a string)."""
    big = dtype.itemsize > 1 and (dtype.byteorder == ">" or (dtype.byteorder == "=" and sys.byteorder == "big"))
    little = dtype.newbyteorder("<") if big else dtype
    for i, d in enumerate(DTYPES):
        if little == d and little.kind == d.kind:
            return i | (BIG_ENDIAN if big else 0)
    return None


def code_dtype(code: int) -> np.dtype | None:
    """Inverse of ``dtype_code``; None for a code no writer produces."""
    d = DTYPES[code & 0x7F] if (code & 0x7F) < len(DTYPES) else None
    if d is None or not code & BIG_ENDIAN:
        return d
    return d.newbyteorder(">") if d.itemsize > 1 else None


def varint(n: int) -> bytes:
    out = bytearray()
    while True:
        b = n & 0x7F
        n >>= 7
        out.append(b | (0x80 if n else 0))
        if not n:
            return bytes(out)


def name_bytes(name: str, fmt: int) -> bytes:
    """An array's name as format ``fmt`` writes it: format 3 its one-byte code, or 0 and the name
    spelled out; format 2 the name's length and the name."""
    spelled = varint(len(name)) + name.encode("ascii")
    if fmt < 3:
        return spelled
    code = NAME_CODES.get(name)
    return bytes([code]) if code is not None else bytes([SPELLED]) + spelled


def check_array(name: str, arr: Any) -> np.ndarray:
    """Validate one array argument; bad input here is a programming error (ValueError)."""
    if not isinstance(name, str) or not NAME_RE.fullmatch(name) or len(name) > MAX_NAME:
        raise ValueError(f"array name {name!r} must match [a-z0-9_]+ (at most {MAX_NAME} chars)")
    if not isinstance(arr, np.ndarray):
        raise ValueError(f"array {name!r} must be a numpy.ndarray, got {type(arr).__name__}")
    if arr.dtype.kind not in NUMERIC_KINDS or arr.dtype.fields is not None:
        raise ValueError(f"array {name!r} has non-numeric dtype {arr.dtype}")
    if dtype_code(arr.dtype) is None:
        raise ValueError(f"array {name!r} has dtype {arr.dtype}, which the store cannot hold "
                         f"(bool, int/uint 8-64, float 16-64, complex 64/128)")
    if arr.ndim > MAX_NDIM:
        raise ValueError(f"array {name!r} has {arr.ndim} dimensions (at most {MAX_NDIM})")
    return arr


def check_meta(manifest: Any) -> None:
    if not isinstance(manifest, dict):
        raise ValueError(f"manifest must be a dict, got {type(manifest).__name__}")


def encode_meta(manifest: dict) -> bytes:
    """The manifest's bytes: compact JSON, ASCII-only escaping so any Python str (even a lone
    surrogate) round-trips; ValueError for what JSON cannot hold exactly."""
    check_meta(manifest)
    try:
        text = json.dumps(manifest, separators=(",", ":"), ensure_ascii=True, allow_nan=False)
    except (TypeError, ValueError) as exc:
        raise ValueError(f"manifest is not JSON-serializable: {exc}") from None
    if json.loads(text) != manifest:
        raise ValueError("manifest does not round-trip through JSON (tuples, non-str keys?)")
    return text.encode("ascii")


@dataclass(frozen=True)
class Entry:
    """Where one array lies in a version file."""

    name: str
    dtype: np.dtype
    shape: tuple[int, ...]
    offset: int

    @property
    def nbytes(self) -> int:
        n = self.dtype.itemsize
        for d in self.shape:
            n *= d
        return n


def place(specs: list[tuple[str, np.dtype, tuple[int, ...]]], start: int) -> tuple[list[Entry], int]:
    """Each array's entry from ``start`` on, and the end of the last payload: an array starts at
    the next multiple of its dtype's alignment (an empty one takes no bytes and no padding)."""
    entries, end = [], start
    for name, dtype, shape in specs:
        e = Entry(name, dtype, shape, end)
        if e.nbytes:
            e = Entry(name, dtype, shape, -(-end // dtype.alignment) * dtype.alignment)
        entries.append(e)
        end = e.offset + e.nbytes
    return entries, end


def layout(specs: list[tuple[str, np.dtype, tuple[int, ...]]], meta: bytes, fmt: int | None = None
           ) -> tuple[bytes, list[Entry], int]:
    """(header bytes with a zero CRC and version 0, the arrays' entries, the file size) for arrays
    in the order given, in format ``fmt`` (default: ``FORMAT_VERSION``, what commits write). Pure
    arithmetic on names, dtypes, shapes and the meta's length: the size never depends on the CRC or
    the version, so ``encoded_size`` is exact before they exist."""
    fmt = FORMAT_VERSION if fmt is None else fmt
    if fmt not in FILE_FORMATS:
        raise ValueError(f"format {fmt} has no single-file layout (formats {FILE_FORMATS})")
    parts = [FIXED.pack(MAGIC, fmt, 0, 0), varint(len(specs)), varint(len(meta))]
    for name, dtype, shape in specs:
        parts += [name_bytes(name, fmt), bytes([dtype_code(dtype)]), varint(len(shape))]
        parts += [varint(d) for d in shape]
    parts.append(meta)
    header = b"".join(parts)
    entries, end = place(specs, len(header))
    return header, entries, end


def ordered_specs(arrays: dict[str, np.ndarray]) -> list[tuple[str, np.dtype, tuple[int, ...]]]:
    """The arrays as (name, dtype, shape), checked, in the order they are written: decreasing
    alignment (stable), so padding is only needed before the first payload."""
    if len(arrays) > MAX_ARRAYS:
        raise ValueError(f"{len(arrays)} arrays: a version holds at most {MAX_ARRAYS}")
    specs = [(name, check_array(name, arr).dtype, tuple(int(d) for d in arr.shape)) for name, arr in arrays.items()]
    return sorted(specs, key=lambda s: -s[1].alignment)


def encoded_size(arrays: dict[str, np.ndarray], manifest: dict, fmt: int | None = None) -> int:
    """Exact bytes that ``commit(arrays, manifest)`` will occupy on disk for that version (in
    format ``fmt``; default what commits write).

    The one version file: header, meta, alignment padding and payloads; equals
    ``Snapshot.bytes_on_disk`` after the commit. Pure and cheap (shapes only: the bank passes
    zero-cost broadcast views).
    """
    return layout(ordered_specs(arrays), encode_meta(manifest), fmt)[2]


def payload_of(arr: np.ndarray) -> memoryview:
    """The C-order bytes of ``arr`` (a copy only if it is not C-contiguous)."""
    data = arr if arr.flags.c_contiguous else np.ascontiguousarray(arr)
    if data.ndim != arr.ndim:  # ascontiguousarray may promote 0-d to 1-d on old numpy
        data = data.reshape(arr.shape)
    return memoryview(data.reshape(-1).view(np.uint8))


def write_version_file(fpath: Path, arrays: dict[str, np.ndarray], manifest: dict, version: int) -> int:
    """Write one complete version file and fsync it; returns its size. Arguments must have been
    checked (``ordered_specs``, ``encode_meta``); ``version`` fits in a u32."""
    header, entries, size = layout(ordered_specs(arrays), encode_meta(manifest))
    header = bytearray(header)
    struct.pack_into("<I", header, CRC_AT + 4, version)
    chunks: list = [bytes(header[CRC_AT + 4:])]
    end = len(header)
    for e in entries:
        if e.offset > end:
            chunks.append(bytes(e.offset - end))
        chunks.append(payload_of(arrays[e.name]))
        end = e.offset + e.nbytes
    crc = zlib.crc32(header[:CRC_AT])
    for c in chunks:
        crc = zlib.crc32(c, crc)
    struct.pack_into("<I", header, CRC_AT, crc)
    chunks[0] = bytes(header)
    write_file(fpath, chunks)
    return size


# --------------------------------------------------------------------------- reading


class _Cursor:
    """Reads a header from an open file, never past the file's size (``Damaged`` instead)."""

    def __init__(self, fh, size: int) -> None:
        self.fh, self.size, self.pos = fh, size, 0

    def take(self, n: int, what: str) -> bytes:
        if n > self.size - self.pos:
            raise Damaged(f"is truncated ({self.size} bytes end inside the {what})")
        data = self.fh.read(n)
        if len(data) != n:
            raise Damaged(f"is truncated (shorter than its size while reading the {what})")
        self.pos += n
        return data

    def varint(self, what: str) -> int:
        n = shift = 0
        for _ in range(10):  # 70 bits: anything longer is damage, not a size
            b = self.take(1, what)[0]
            n |= (b & 0x7F) << shift
            if not b & 0x80:
                return n
            shift += 7
        raise Damaged(f"is malformed (an overlong number in the {what})")


def read_prefix(fh, size: int) -> tuple[int, int, int]:
    """(format, crc32, version) from the fixed prefix; ``Damaged``/``Newer`` if it is not one of
    ours. Checks the format before anything else, so a newer file says so rather than 'corrupt'."""
    if size < 5:
        raise Damaged(f"is truncated ({size} bytes, not even a header)")
    head = fh.read(5)
    if head[:4] != MAGIC:
        raise Damaged("is not a miita-edge store file (bad magic)")
    fmt = head[4]
    if fmt > NEWEST_FORMAT:
        raise Newer(f"has format_version {fmt}, this miita-edge reads {'/'.join(map(str, READABLE_FORMATS))} "
                    f"(written by a newer miita-edge; upgrade)")
    if fmt not in FILE_FORMATS:
        raise Damaged(f"is malformed (format_version {fmt} in a version file)")
    if size < FIXED.size:
        raise Damaged(f"is truncated ({size} bytes, not even a header)")
    crc, version = struct.unpack("<II", fh.read(8))
    return fmt, crc, version


def parse_header(fh, size: int) -> tuple[int, int, int, list[Entry], bytes, int]:
    """(format, crc32, version, entries, meta bytes, expected file size) of an open version file.

    Reads only what the header declares and never beyond ``size``, so a damaged header is a
    ``Damaged`` error, never a huge allocation or a read past the end. Nothing is mapped here.
    """
    fh.seek(0)
    fmt, crc, version = read_prefix(fh, size)
    cur = _Cursor(fh, size)
    cur.pos = FIXED.size
    n = cur.varint("array count")
    if n > MAX_ARRAYS:
        raise Damaged(f"is malformed ({n} arrays)")
    meta_len = cur.varint("meta length")
    specs = []
    for i in range(n):
        name = _read_name(cur, i, fmt)
        if any(s[0] == name for s in specs):
            raise Damaged(f"is malformed (array {name} appears twice)")
        dtype = code_dtype(cur.take(1, f"dtype of {name}")[0])
        if dtype is None:
            raise Damaged(f"is malformed ({name} has an unknown dtype code)")
        ndim = cur.varint(f"shape of {name}")
        if ndim > MAX_NDIM:
            raise Damaged(f"is malformed ({name} has {ndim} dimensions)")
        specs.append((name, dtype, tuple(cur.varint(f"shape of {name}") for _ in range(ndim))))
    meta = cur.take(meta_len, "meta")
    entries, end = place(specs, cur.pos)
    return fmt, crc, version, entries, meta, end


def _read_name(cur: _Cursor, i: int, fmt: int) -> str:
    """Array ``i``'s name: format 3's code (or 0 and the name), format 2's name_len and name."""
    if fmt >= 3:
        code = cur.take(1, f"name of array {i}")[0]
        if code != SPELLED:
            if code > len(ARRAY_NAMES):
                raise Damaged(f"is malformed (array {i} has the unknown name code {code})")
            return ARRAY_NAMES[code - 1]
    nlen = cur.varint(f"name of array {i}")
    if not 1 <= nlen <= MAX_NAME:
        raise Damaged(f"is malformed (array {i} has a name of {nlen} bytes)")
    name = cur.take(nlen, f"name of array {i}").decode("latin-1")
    if not NAME_RE.fullmatch(name):
        raise Damaged(f"is malformed (bad array name {name[:40]!r})")
    return name


def file_crc(buf, size: int) -> int:
    """CRC32 of a version file's bytes except the CRC field, from a buffer (an mmap)."""
    view = memoryview(buf)
    crc = zlib.crc32(view[:CRC_AT])
    for start in range(CRC_AT + 4, size, CRC_CHUNK):
        crc = zlib.crc32(view[start:min(size, start + CRC_CHUNK)], crc)
    view.release()
    return crc


def decode_meta(raw: bytes) -> dict:
    def no_constants(name: str):
        raise ValueError(name)

    try:
        doc = json.loads(raw.decode("ascii"), parse_constant=no_constants)
    except (UnicodeDecodeError, ValueError, RecursionError):  # RecursionError: absurdly deep nesting
        raise Damaged("is corrupt (its meta is not valid JSON)") from None
    if not isinstance(doc, dict):
        raise Damaged("is malformed (its meta is not a JSON object)")
    return doc


def read_version_file(fpath: Path, name: str, *, verify: bool) -> tuple[dict[str, np.ndarray], dict, int, int]:
    """(arrays, meta, size, format) of the version file ``fpath`` named ``name``, arrays mapped read-only.

    Order: the fixed prefix (magic, format), the header (bounded by the file's size), the size the
    header implies against the real one -- before anything is mapped, since a payload mapped past
    the end of the file would SIGBUS on access -- then (``verify``) the CRC over the whole file,
    then the meta, then one read-only map whose numpy views are the arrays. ``Damaged`` (its
    message starts with ``name``) for anything wrong; ``FileNotFoundError`` when the file is gone
    (a concurrent commit may have removed it).
    """
    try:
        return _read_version_file(fpath, name, verify)
    except Damaged as exc:
        raise type(exc)(f"{name} {exc}") from None


def _read_version_file(fpath: Path, name: str, verify: bool) -> tuple[dict[str, np.ndarray], dict, int, int]:
    with open(fpath, "rb") as fh:
        size = os.fstat(fh.fileno()).st_size
        fmt, crc, version, entries, raw_meta, want = parse_header(fh, size)
        if "v%0*d" % (VERSION_DIGITS, version) != name:
            raise Damaged(f"is malformed (it records version {version})")
        if size != want:
            kind = "truncated" if size < want else "oversized"
            raise Damaged(f"is {kind} ({size} bytes, its header says {want})")
        # The same open file as the header: a concurrent unlink cannot swap the inode under us.
        mm = mmap.mmap(fh.fileno(), size, access=mmap.ACCESS_READ)
    try:
        if verify and file_crc(mm, size) != crc:
            raise Damaged("is corrupt (CRC32 mismatch)")
        meta = decode_meta(raw_meta)
    except Damaged:
        mm.close()
        raise
    arrays = {}
    for e in entries:
        # frombuffer over a read-only map: a non-writeable view, no copy
        arrays[e.name] = np.frombuffer(mm, dtype=e.dtype, count=e.nbytes // e.dtype.itemsize,
                                       offset=e.offset).reshape(e.shape)
    return arrays, meta, size, fmt


def read_format(fpath: Path) -> int | None:
    """The format byte of a version file, None if it does not start with our magic."""
    with open(fpath, "rb") as fh:
        head = fh.read(5)
    return head[4] if len(head) == 5 and head[:4] == MAGIC else None


# --------------------------------------------------------------------------- fs helpers


def fsync_dir(path: Path) -> None:
    """Make directory entries (created/renamed/removed names) durable."""
    fd = os.open(path, os.O_RDONLY | getattr(os, "O_DIRECTORY", 0))
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def version_name(version: int) -> str:
    return "v%0*d" % (VERSION_DIGITS, version)


def write_file(fpath: Path, chunks: list) -> None:
    """Create (or truncate) ``fpath``, write all chunks, fsync before returning."""
    fd = os.open(fpath, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    try:
        for chunk in chunks:
            view = memoryview(chunk).cast("B")
            while view:
                n = os.write(fd, view)
                view = view[n:]
        os.fsync(fd)
    finally:
        os.close(fd)


def file_crc32(fpath: Path) -> int:
    """The CRC32 a version file records for itself (its bytes 5..8): the version's content
    identity, already verified when the version was read."""
    with open(fpath, "rb") as fh:
        head = fh.read(CRC_AT + 4)
    if len(head) < CRC_AT + 4:
        raise Damaged(f"{fpath.name} is truncated")
    return struct.unpack_from("<I", head, CRC_AT)[0]


def _compact(value: Any, limit: int = 80) -> str:
    """One-line rendering of a JSON value for error messages, shortened if long."""
    try:
        text = json.dumps(value, separators=(",", ":"), sort_keys=True, ensure_ascii=True, default=repr)
    except (TypeError, ValueError):
        text = repr(value)
    text = text.replace("\n", " ")
    return text if len(text) <= limit else text[: limit - 3] + "..."
