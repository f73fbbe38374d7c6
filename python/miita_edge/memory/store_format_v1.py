"""The legacy reader of format 1: a version directory of ``.npy`` files plus ``manifest.json``.

Format 1 is what miita-edge wrote before the single-file formats (``store_format``, formats 2 and
3). It is still read, so an old memory opens; the next commit into it writes format 3 and removes the
old directory like any older version. Nothing here writes format 1. Layout of one version::

    DIR/v00000007/<name>.npy      one standard .npy file per array (C order, header format 1.0)
    DIR/v00000007/manifest.json   {"format_version": 1, "version": "00000007",
                                   "arrays": {name: {"dtype", "shape", "bytes", "crc32"}},
                                   "meta": the user's manifest}

The manifest records each file's size and CRC32; sizes are checked before a file is mapped, and
the directory must hold exactly the files its manifest lists. ``encoded_size_v1`` is the size a
format-1 commit would have had (for the framing figures in docs/method.md).
"""
from __future__ import annotations

import functools
import io
import json
import math
import os
import re
import zlib
from pathlib import Path

import numpy as np
from numpy.lib import format as npy_format

from .store_format import (CRC_CHUNK, _compact, NEWEST_FORMAT, MAX_NAME, NAME_RE, NUMERIC_KINDS, READABLE_FORMATS, VERSION_DIGITS,
                           Damaged, Newer)

MANIFEST = "manifest.json"
FORMAT_V1 = 1


class Vanished(Exception):
    """A file of the version is missing (``str()``: which); a race or damage, the caller decides."""


@functools.lru_cache(maxsize=4096)
def npy_header(descr: str, shape: tuple[int, ...]) -> bytes:
    """The exact .npy header bytes numpy writes for this dtype and shape."""
    buf = io.BytesIO()
    npy_format.write_array_header_1_0(buf, {"descr": descr, "fortran_order": False, "shape": shape})
    return buf.getvalue()


def encoded_size_v1(arrays: dict[str, np.ndarray], manifest: dict) -> int:
    """Bytes a format-1 commit of (arrays, manifest) occupied: every .npy file plus manifest.json."""
    total, entries = 0, {}
    for name, arr in arrays.items():
        descr = npy_format.dtype_to_descr(arr.dtype)
        shape = tuple(int(d) for d in arr.shape)
        nbytes = len(npy_header(descr, shape)) + arr.nbytes
        entries[name] = {"dtype": descr, "shape": list(shape), "bytes": nbytes, "crc32": "%08x" % 0}
        total += nbytes
    doc = {"format_version": FORMAT_V1, "version": "%0*d" % (VERSION_DIGITS, 0), "arrays": entries, "meta": manifest}
    return total + len(json.dumps(doc, separators=(",", ":"), ensure_ascii=True, allow_nan=False))


def read_manifest_format(vdir: Path) -> int | None:
    """format_version of a version directory's manifest, None if unreadable (damage: a writer may
    overwrite it)."""
    try:
        doc = json.loads((vdir / MANIFEST).read_bytes())
    except (OSError, ValueError, RecursionError):
        return None
    fv = doc.get("format_version") if isinstance(doc, dict) else None
    return fv if isinstance(fv, int) and not isinstance(fv, bool) else None


def read_version_dir(vdir: Path, name: str, *, verify: bool) -> tuple[dict[str, np.ndarray], dict, int]:
    """(arrays, meta, bytes on disk) of the format-1 version directory ``vdir`` named ``name``.

    ``Damaged`` (a complete problem naming the file) or ``Vanished`` (naming what is missing)."""
    try:
        raw = (vdir / MANIFEST).read_bytes()
    except FileNotFoundError:
        raise Vanished(f"{name}/{MANIFEST}") from None
    except OSError as exc:
        raise Damaged(f"cannot read {name}/{MANIFEST} ({exc.strerror})") from None
    doc = _parse_manifest(name, raw)
    # Every file of a version is listed in its manifest: an array file the manifest does not
    # list means the manifest lost an entry (an edit, a bad copy), and reading the rest would
    # silently drop that array (found by the corruption campaign).
    try:
        present = set(os.listdir(vdir))
    except FileNotFoundError:
        raise Vanished(name) from None
    except OSError as exc:
        raise Damaged(f"cannot list {name} ({exc.strerror})") from None
    extra = present - {MANIFEST} - {f"{a}.npy" for a in doc["arrays"]}
    if extra:
        shown = ", ".join(sorted(extra))
        raise Damaged(f"{name} holds files its manifest does not list ({shown[:80]})")
    arrays: dict[str, np.ndarray] = {}
    total = len(raw)
    for aname, entry in doc["arrays"].items():
        arrays[aname] = _load_array(vdir, name, aname, entry, verify=verify)
        total += entry["bytes"]
    return arrays, doc["meta"], total


def _parse_manifest(name: str, raw: bytes) -> dict:
    """Decode and structurally validate manifest.json, format_version first."""
    where = f"{name}/{MANIFEST}"
    try:
        doc = json.loads(raw.decode("utf-8"))
    except (UnicodeDecodeError, ValueError, RecursionError):  # RecursionError: absurdly deep nesting
        raise Damaged(f"{where} is corrupt (not valid JSON)") from None
    if not isinstance(doc, dict):
        raise Damaged(f"{where} is malformed (not a JSON object)")
    fv = doc.get("format_version")
    if not isinstance(fv, int) or isinstance(fv, bool):
        raise Damaged(f"{where} is malformed (no integer format_version)")
    if fv != FORMAT_V1:
        if fv > NEWEST_FORMAT:
            raise Newer(f"{where} has format_version {fv}, this miita-edge reads "
                        f"{'/'.join(map(str, READABLE_FORMATS))} (written by a newer miita-edge; upgrade)")
        raise Damaged(f"{where} is malformed (format_version {fv} in a version directory)")

    def bad(why: str) -> Damaged:
        return Damaged(f"{where} is malformed ({why})")

    version = doc.get("version")
    if not isinstance(version, str) or "v" + version != name:
        raise bad(f"version {_compact(version, 20)} does not match directory {name}")
    if not isinstance(doc.get("meta"), dict):
        raise bad("meta is not an object")
    entries = doc.get("arrays")
    if not isinstance(entries, dict):
        raise bad("arrays is not an object")
    for aname, e in entries.items():
        if not NAME_RE.fullmatch(aname) or len(aname) > MAX_NAME:
            raise bad(f"bad array name {_compact(aname, 40)}")
        if not isinstance(e, dict):
            raise bad(f"entry for {aname} is not an object")
        invalid = bad(f"entry for {aname} lacks a valid dtype/shape/bytes/crc32")
        try:
            descr, shape, crc, nbytes = e["dtype"], e["shape"], e["crc32"], e["bytes"]
            if not (isinstance(descr, str) and isinstance(shape, list) and isinstance(crc, str)):
                raise invalid
            dtype = npy_format.descr_to_dtype(descr)
        except (KeyError, TypeError, ValueError):
            raise invalid from None
        if dtype.kind not in NUMERIC_KINDS or dtype.fields is not None:
            raise bad(f"{aname} has non-numeric dtype {_compact(descr, 20)}")
        if not all(isinstance(d, int) and not isinstance(d, bool) and d >= 0 for d in shape):
            raise invalid
        if not re.fullmatch(r"[0-9a-f]{8}", crc):
            raise invalid
        try:
            header_len = len(npy_header(descr, tuple(shape)))
        except ValueError:  # e.g. a header beyond the .npy 1.0 limit
            raise invalid from None
        expected = header_len + math.prod(shape) * dtype.itemsize
        if nbytes != expected:
            raise bad(f"{aname} records {nbytes!r} bytes but dtype/shape imply {expected}")
    return doc


def _map_open(fh: io.BufferedReader) -> np.ndarray:
    """Map the array in an already-open .npy file read-only, after parsing its header."""
    fh.seek(0)
    major, minor = npy_format.read_magic(fh)
    if (major, minor) != (1, 0):
        raise ValueError(f"unsupported npy version {major}.{minor}")
    shape, fortran, dtype = npy_format.read_array_header_1_0(fh, max_header_size=1 << 16)
    if fortran:
        raise ValueError("fortran-order array")
    return np.memmap(fh, dtype=dtype, mode="r", shape=shape, offset=fh.tell(), order="C")


def _load_array(vdir: Path, name: str, aname: str, entry: dict, *, verify: bool) -> np.ndarray:
    """Size-check, CRC-check, then map one array read-only.

    The size check comes first and is what makes mapping safe: a file shorter than its
    header claims would map fine and then SIGBUS on access.
    """
    rel = f"{name}/{aname}.npy"
    want = entry["bytes"]
    try:
        with open(vdir / f"{aname}.npy", "rb") as fh:
            size = os.fstat(fh.fileno()).st_size
            if size != want:
                kind = "truncated" if size < want else "oversized"
                raise Damaged(f"{rel} is {kind} ({size} bytes, manifest says {want})")
            if verify:
                crc = 0
                while chunk := fh.read(CRC_CHUNK):
                    crc = zlib.crc32(chunk, crc)
                if "%08x" % crc != entry["crc32"]:
                    raise Damaged(f"{rel} is corrupt (CRC32 mismatch)")
            fh.seek(0)
            if math.prod(entry["shape"]) == 0:
                # Nothing to map; mapping an empty data section is refused by some numpy versions.
                arr = np.load(fh, allow_pickle=False)
                arr.flags.writeable = False
            else:
                # Same open file description as the CRC pass: a concurrent unlink cannot
                # swap the inode between verification and mapping.
                arr = _map_open(fh)
    except FileNotFoundError:
        raise Vanished(rel) from None
    except Damaged:
        raise
    except (OSError, ValueError) as exc:
        raise Damaged(f"{rel} is corrupt ({_compact(str(exc), 60)})") from None
    if arr.dtype != npy_format.descr_to_dtype(entry["dtype"]) or list(arr.shape) != entry["shape"]:
        raise Damaged(f"{rel} does not match its manifest entry (dtype/shape)")
    return arr
