"""An independent reader and forger of store formats 2 and 3, written from the layout documented in
``python/miita_edge/memory/store_format.py`` and not from its code.

Tests use it as an oracle (the arrays and offsets in a version file, computed without the store)
and to forge damaged files whose CRC is right, so what is tested is the check of the edited
field and not the CRC.
"""
from __future__ import annotations

import struct
import zlib

import numpy as np

MAGIC = b"\x93MIM"
#: Format 3's one-byte array names, as the format's docstring lists them (code k names NAMES[k - 1]).
NAMES = ["anchors", "anchor_scale", "anchor_count", "anchor_per", "anchor_owner", "counts", "radius",
         "key_kept", "key_shared", "tok_ids", "tok_bits", "tok_idx", "tok_dict", "tok_dict3", "tok3",
         "tok_len", "tokens", "ev_len", "ev3", "dirs", "dir_scale"]
CODES = ["<b1", "<i1", "<u1", "<i2", "<u2", "<i4", "<u4", "<i8", "<u8", "<f2", "<f4", "<f8", "<c8", "<c16"]


def enc_varint(n: int) -> bytes:
    out = bytearray()
    while True:
        out.append((n & 0x7F) | (0x80 if n > 0x7F else 0))
        n >>= 7
        if not n:
            return bytes(out)


def _varint(raw: bytes, pos: int) -> tuple[int, int]:
    n = shift = 0
    while True:
        b = raw[pos]
        pos += 1
        n |= (b & 0x7F) << shift
        shift += 7
        if not b & 0x80:
            return n, pos


def dtype_of(code: int) -> np.dtype:
    d = np.dtype(CODES[code & 0x7F])
    return d.newbyteorder(">") if code & 0x80 else d


def parse(raw: bytes) -> dict:
    """Every field of a valid version file, with the payload offsets computed from the spec."""
    magic, fmt, crc, version = struct.unpack_from("<4sBII", raw, 0)
    assert magic == MAGIC
    n, pos = _varint(raw, 13)
    meta_len, pos = _varint(raw, pos)
    arrays = []
    for _ in range(n):
        spelled = True
        if fmt == 3:
            name_code = raw[pos]
            pos += 1
            spelled = name_code == 0
            if not spelled:
                name = NAMES[name_code - 1]
        if spelled:
            nlen, pos = _varint(raw, pos)
            name = raw[pos:pos + nlen].decode("ascii")
            pos += nlen
        code = raw[pos]
        pos += 1
        ndim, pos = _varint(raw, pos)
        shape = []
        for _ in range(ndim):
            d, pos = _varint(raw, pos)
            shape.append(d)
        arrays.append({"name": name, "code": code, "shape": shape, "spelled": spelled})
    meta = raw[pos:pos + meta_len]
    header_end = pos + meta_len
    end = header_end
    for a in arrays:
        dt = dtype_of(a["code"])
        nbytes = dt.itemsize * int(np.prod(a["shape"], dtype=np.int64))
        if nbytes:
            end = -(-end // dt.alignment) * dt.alignment
        a["offset"], a["nbytes"] = end, nbytes
        end += nbytes
    return {"format": fmt, "crc": crc, "version": version, "arrays": arrays, "meta": meta,
            "header_end": header_end, "end": end, "tail": raw[header_end:]}


def crc_of(raw: bytes) -> int:
    return zlib.crc32(raw[9:], zlib.crc32(raw[:5]))


def fix_crc(raw: bytes) -> bytes:
    out = bytearray(raw)
    struct.pack_into("<I", out, 5, crc_of(raw))
    return bytes(out)


def build(doc: dict) -> bytes:
    """A file from ``parse``'s fields (edited or not) and its old bytes after the header, CRC fixed."""
    parts = [struct.pack("<4sBII", MAGIC, doc["format"], 0, doc["version"]),
             enc_varint(len(doc["arrays"])), enc_varint(len(doc["meta"]))]
    for a in doc["arrays"]:
        if doc["format"] == 3 and not a.get("spelled", a["name"] not in NAMES):
            parts.append(bytes([NAMES.index(a["name"]) + 1]))
        else:
            parts += ([b"\x00"] if doc["format"] == 3 else []) + [enc_varint(len(a["name"])), a["name"].encode("ascii")]
        parts += [bytes([a["code"]]), enc_varint(len(a["shape"]))] + [enc_varint(d) for d in a["shape"]]
    return fix_crc(b"".join(parts) + doc["meta"] + doc["tail"])


def arrays_of(raw: bytes) -> dict[str, np.ndarray]:
    """The arrays of a version file read with plain numpy at the spec's offsets (copies)."""
    doc = parse(raw)
    out = {}
    for a in doc["arrays"]:
        dt = dtype_of(a["code"])
        out[a["name"]] = np.frombuffer(raw[a["offset"]:a["offset"] + a["nbytes"]], dtype=dt).reshape(a["shape"]).copy()
    return out
