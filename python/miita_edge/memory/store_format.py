"""The on-disk format of a store version: file names, the exact .npy encoding, the manifest
encoding with each file's size and CRC32, and the durable (fsynced) writes.

``store.py`` builds versions, pointers and locking on top of this; everything here is a pure
encoding or a single-file operation, so the exact byte size of a commit can be computed in
advance (``encoded_size``), which is what the budget repair needs.
"""
from __future__ import annotations

import functools
import io
import json

import os
import re
import zlib
from pathlib import Path
from typing import Any

import numpy as np
from numpy.lib import format as npy_format

FORMAT_VERSION: int = 1

CURRENT = "CURRENT"
CURRENT_TMP = "CURRENT.tmp"
LOCK = ".lock"
MANIFEST = "manifest.json"
# Fixed width so the manifest's byte length does not depend on the version number:
# ``encoded_size`` cannot know which version a commit will get, yet must be exact.
VERSION_DIGITS = 8
MAX_VERSION = 10**VERSION_DIGITS - 1
VERSION_RE = re.compile(r"v(\d{%d})" % VERSION_DIGITS)
NAME_RE = re.compile(r"[a-z0-9_]+")
MAX_NAME = 200  # "<name>.npy" must stay a legal file name everywhere
# Numeric kinds only: bool, signed, unsigned, float, complex. No objects (pickles), no
# strings, no structured dtypes -- the bank stores vectors, anything else is a bug.
NUMERIC_KINDS = "biufc"
# How often a reader re-reads CURRENT when the version it chose vanished under it
# (a concurrent writer committed and deleted it). Each retry only happens when CURRENT
# actually moved, so this bounds livelock against a writer committing in a tight loop.
READ_RETRIES = 50
CRC_CHUNK = 1 << 20

# --------------------------------------------------------------------------- encoding

@functools.lru_cache(maxsize=4096)
def npy_header(descr: str, shape: tuple[int, ...]) -> bytes:
    """The exact .npy header bytes numpy writes for this dtype and shape.

    Produced by numpy's own header writer into memory, so the size used by
    ``encoded_size`` and the bytes written by ``commit`` come from one function and cannot
    drift apart. Cached because the bank's budget search asks for the same shapes often.
    """
    buf = io.BytesIO()
    npy_format.write_array_header_1_0(
        buf, {"descr": descr, "fortran_order": False, "shape": shape}
    )
    return buf.getvalue()

def check_array(name: str, arr: Any) -> np.ndarray:
    """Validate one array argument; bad input here is a programming error (ValueError)."""
    if not isinstance(name, str) or not NAME_RE.fullmatch(name) or len(name) > MAX_NAME:
        raise ValueError(f"array name {name!r} must match [a-z0-9_]+ (at most {MAX_NAME} chars)")
    if not isinstance(arr, np.ndarray):
        raise ValueError(f"array {name!r} must be a numpy.ndarray, got {type(arr).__name__}")
    if arr.dtype.kind not in NUMERIC_KINDS or arr.dtype.fields is not None:
        raise ValueError(f"array {name!r} has non-numeric dtype {arr.dtype}")
    return arr

def array_spec(arr: np.ndarray) -> tuple[str, tuple[int, ...], int]:
    """(descr, shape, file size) of the .npy file ``commit`` writes for ``arr``."""
    descr = npy_format.dtype_to_descr(arr.dtype)
    shape = tuple(int(d) for d in arr.shape)
    return descr, shape, len(npy_header(descr, shape)) + arr.nbytes

def encode_manifest(arrays: dict[str, np.ndarray], crcs: dict[str, int], meta: dict, version: int) -> bytes:
    """The on-disk manifest.json bytes.

    Compact separators and fixed-width fields (version digits, 8-hex-digit CRC) keep the
    length a pure function of (dtypes, shapes, meta): memories may have a 4 KiB budget, and
    ``encoded_size`` must know the length before the CRCs or the version exist. ASCII-only
    escaping so any Python str (even a lone surrogate) round-trips.
    """
    entries = {}
    for name, arr in arrays.items():
        descr, shape, nbytes = array_spec(arr)
        entries[name] = {"dtype": descr, "shape": list(shape), "bytes": nbytes, "crc32": "%08x" % crcs.get(name, 0)}
    doc = {
        "format_version": FORMAT_VERSION,
        "version": "%0*d" % (VERSION_DIGITS, version),
        "arrays": entries,
        "meta": meta,
    }
    return json.dumps(doc, separators=(",", ":"), ensure_ascii=True, allow_nan=False).encode("ascii")

def check_meta(manifest: Any) -> None:
    if not isinstance(manifest, dict):
        raise ValueError(f"manifest must be a dict, got {type(manifest).__name__}")

def encoded_size(arrays: dict[str, np.ndarray], manifest: dict) -> int:
    """Exact bytes that ``commit(arrays, manifest)`` will occupy on disk for that version.

    Every .npy file (header + data) plus manifest.json as written; equals
    ``Snapshot.bytes_on_disk`` after the commit. Pure and cheap: headers come from a cached
    in-memory render, and the manifest length does not depend on CRC or version values
    because both are fixed width, so placeholders give the same length.
    """
    check_meta(manifest)
    total = 0
    for name, arr in arrays.items():
        total += array_spec(check_array(name, arr))[2]
    try:
        total += len(encode_manifest(arrays, {}, manifest, 0))
    except (TypeError, ValueError) as exc:
        raise ValueError(f"manifest is not JSON-serializable: {exc}") from None
    return total

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

def map_open(fh: io.BufferedReader) -> np.ndarray:
    """Map the array in an already-open .npy file read-only, after parsing its header."""
    fh.seek(0)
    major, minor = npy_format.read_magic(fh)
    if (major, minor) != (1, 0):
        raise ValueError(f"unsupported npy version {major}.{minor}")
    shape, fortran, dtype = npy_format.read_array_header_1_0(fh, max_header_size=1 << 16)
    if fortran:
        raise ValueError("fortran-order array")
    offset = fh.tell()
    return np.memmap(fh, dtype=dtype, mode="r", shape=shape, offset=offset, order="C")

def write_npy(fpath: Path, arr: np.ndarray) -> int:
    """Write header + C-order data, fsync; return the CRC32 of the whole file."""
    data = arr if arr.flags.c_contiguous else np.ascontiguousarray(arr)
    if data.ndim != arr.ndim:  # ascontiguousarray may promote 0-d to 1-d on old numpy
        data = data.reshape(arr.shape)
    descr, shape, _ = array_spec(arr)
    header = npy_header(descr, shape)
    body = data.reshape(-1).view(np.uint8)
    crc = zlib.crc32(body, zlib.crc32(header))
    write_file(fpath, [header, body])
    return crc

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
