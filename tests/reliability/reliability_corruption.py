"""Corruption campaign: open thousands of damaged memory directories the ways a user would.

Bases: model-free stores written through ``memory.store.Store``, (unless ``--no-model``) real
memories of both presets made by ``Miita.ingest``, all in store format 3 (one file per version),
and the two format-1 fixtures of tests/data/store_v1 (a plain store and a real default-preset
memory), which the legacy reader still opens. Each mutation copies a base and damages it (kinds
below); worker processes then open it with ``Store.read()``, ``miita-edge info`` (in process) and
the facade's parse of the arrays (``memory_fields`` + ``MemoryBank.from_arrays``, what ``Miita``
does after reading), and — for a sample of the real memories — a full ``Miita`` open and one
``ask``. Workers run in subprocesses, so a segfault is seen and charged to the mutation.

Kinds on format-3 bases (a version is the file ``vNNNNNNNN``: header, meta, payloads, one CRC32):

* damage (what bit rot, a bad copy or a careless edit does; the CRC is left as it was):
  ``truncate`` any file; ``bitflip`` 1-8 bits in a chosen region of the version file (fixed
  prefix, array descriptors, meta, payload) or in ``CURRENT``; ``garbage`` the version file
  replaced (random bytes, empty, NULs, JSON, a .npy file, a prefix of itself); ``missing-file``;
  ``symlink`` (the version file to a copy elsewhere, sometimes with a flipped bit; ``CURRENT``; a
  loop; a directory); ``current-odd``; ``newer-format`` (the format byte raised, with and
  without a recomputed CRC); ``meta-json`` without a recomputed CRC.
* forgeries (a field edited *and* the CRC recomputed, which no checksum can tell from a real
  file): ``header-field`` (a dimension, the rank, a dtype code, a name, a name's code, the array count, the meta
  length, the version number, an overlong number, a descriptor dropped or duplicated),
  ``wrong-dtype``/``wrong-shape`` (a payload rewritten as another dtype/shape, the header left),
  ``consistent-dtype``/``consistent-shape`` (a valid file with the new array),
  ``meta-garbage`` (bytes that are not JSON, laid out as a valid file), ``meta-json`` with a
  recomputed CRC (valid JSON, wrong memory fields).

``legacy-v1`` applies one of the format-1 campaign's 13 mutations (``mutate_v1``) to a copy of a
format-1 fixture.

Outcomes per opening: *rejected* with the documented error (a ``MiitaError`` subclass whose message
is one line; the CLI exits 2 with one stderr line), or *accepted*. Failures:

* crash: a signal (segfault, abort), any other exception, or a multi-line error;
* silent acceptance: a damaged (not forged) store accepted with array bytes, dtypes or shapes
  different from the base's; for format-3 bases also with a different manifest (it is inside
  the CRC now). A forgery may be accepted (it is a valid store), but the facade must then open it
  or refuse it cleanly. Format 1's manifest has no checksum of its own, so a changed but valid
  manifest of a ``legacy-v1`` copy is reported (``meta±``), not failed.

    python tests/reliability/reliability_corruption.py [--count 10000] [--seed 0] [--no-model] [--model-sample 200]
"""
from __future__ import annotations

import argparse
import contextlib
import io
import json
import os
import random
import shutil
import struct
import subprocess
import sys
import tempfile
import time
import zlib
from collections import Counter, defaultdict
from pathlib import Path

import numpy as np

KINDS = ("truncate", "bitflip", "garbage", "header-field", "wrong-dtype", "wrong-shape", "consistent-dtype",
         "consistent-shape", "meta-garbage", "meta-json", "missing-file", "symlink", "current-odd", "newer-format",
         "legacy-v1")
V1_KINDS = ("truncate", "bitflip", "npy-header", "wrong-dtype", "wrong-shape", "consistent-dtype",
            "consistent-shape", "manifest-garbage", "manifest-json", "missing-file", "symlink", "current-odd",
            "newer-format")
V1_FIXTURES = Path(__file__).resolve().parents[1] / "data" / "store_v1"


# ----------------------------------------------------------------------------- bases
def make_bases(work: Path, with_model: bool) -> list[Path]:
    """Format-2 bases (named base-store-*, base-<preset>) and copies of the format-1 fixtures
    (named base-v1-*)."""
    from miita_edge.memory.store import Store

    bases = []
    rng = np.random.default_rng(0)
    for b in range(2):
        d = work / f"base-store-{b}"
        with Store(d).writer() as w:
            w.commit({"anchors": rng.standard_normal((7 + b, 16)).astype(np.float32),
                      "tokens": rng.integers(0, 1000, 11).astype(np.int32),
                      "bits": rng.integers(0, 255, (5, 10)).astype(np.uint8),
                      "scale": rng.standard_normal(3).astype(np.float64),
                      "owner": np.arange(9, dtype=np.uint16),
                      "empty": np.zeros((0, 4), np.float16)}, {"kind": "plain store", "n": b, "nested": {"a": [1, 2]}})
        bases.append(d)
    if with_model:
        from miita_edge import Example, Miita
        from miita_edge.runtime.engine import EngineConfig

        rows = [Example(f"question {i} about {t}", t, line=i + 1)
                for i, t in enumerate(["billing", "shipping", "refunds"] * 2)]
        for preset in ("default", "paper"):
            d = work / f"base-{preset}"
            with Miita(memory=d, preset=preset, template="plain", engine_config=EngineConfig(n_threads=1)) as m:
                m.ingest(rows, budget="none", progress=False)
            bases.append(d)
    for name in ("plain", "memory"):
        if (V1_FIXTURES / name).is_dir():
            d = work / f"base-v1-{name}"
            shutil.copytree(V1_FIXTURES / name, d)
            bases.append(d)
    return bases


def is_v1(base: Path) -> bool:
    return base.name.startswith("base-v1-")


def base_content(base: Path) -> dict:
    from miita_edge.memory.store import Store

    snap = Store(base).read()
    return {"version": snap.version, "manifest": snap.manifest,
            "arrays": {k: (str(v.dtype), v.shape, np.asarray(v).tobytes()) for k, v in snap.arrays.items()}}


# ----------------------------------------------------------------------------- mutations
def _files(d: Path) -> list[Path]:
    cur = (d / "CURRENT").read_text().strip()
    return [d / "CURRENT"] + sorted((d / cur).iterdir())


def _flip(p: Path, rng: random.Random, n: int, lo: int = 0, hi: int | None = None) -> None:
    data = bytearray(p.read_bytes())
    if not data:
        return
    hi = len(data) if hi is None else min(hi, len(data))
    for _ in range(n):
        i = rng.randrange(lo, max(lo + 1, hi))
        data[min(i, len(data) - 1)] ^= 1 << rng.randrange(8)
    p.write_bytes(bytes(data))


def _mutated(arr: np.ndarray, kind: str, rng) -> np.ndarray:
    """``arr`` with another dtype (``*-dtype``) or one row more (``*-shape``): the array edit of the
    wrong-/consistent- kinds, for both store formats."""
    if kind.endswith("dtype"):
        new = arr.astype(rng.choice([np.float64, np.int16, np.uint8, np.float32, np.int64]))
        return arr.astype(np.complex64) if new.dtype == arr.dtype else new
    return np.concatenate([arr, arr[:1]]) if arr.ndim and len(arr) else np.zeros((3,) + arr.shape[1:], arr.dtype)


def _rewrite_npy(path: Path, arr: np.ndarray) -> None:
    with open(path, "wb") as fh:
        np.lib.format.write_array(fh, arr, version=(1, 0))


def _update_manifest_entry(vdir: Path, name: str, arr: np.ndarray, descr_and_shape: bool) -> None:
    import zlib

    man = json.loads((vdir / "manifest.json").read_text())
    raw = (vdir / f"{name}.npy").read_bytes()
    e = man["arrays"][name]
    e["bytes"], e["crc32"] = len(raw), "%08x" % zlib.crc32(raw)
    if descr_and_shape:
        e["dtype"], e["shape"] = np.lib.format.dtype_to_descr(arr.dtype), list(arr.shape)
    (vdir / "manifest.json").write_text(json.dumps(man, separators=(",", ":")))


def mutate_v1(src: Path, dst: Path, kind: str, rng: random.Random, outside: Path) -> str:
    """Format 1 (the legacy reader): copy ``src`` to ``dst`` and damage the copy the ways the
    format-1 campaign did; returns a description of what was done."""
    shutil.copytree(src, dst, symlinks=True)
    vdir = dst / (dst / "CURRENT").read_text().strip()
    npys = sorted(vdir.glob("*.npy"))
    if kind == "truncate":
        p = rng.choice(_files(dst))
        size = p.stat().st_size
        cut = rng.randrange(size) if size else 0
        with open(p, "r+b") as fh:
            fh.truncate(cut)
        return f"{p.name} cut to {cut} of {size} bytes"
    if kind == "bitflip":
        p = rng.choice(_files(dst))
        n = rng.choice([1, 1, 2, 8])
        region = rng.choice(["header", "data", "any"]) if p.suffix == ".npy" else "any"
        lo, hi = (0, 128) if region == "header" else ((128, None) if region == "data" else (0, None))
        _flip(p, rng, n, lo, hi)
        return f"{n} bit(s) flipped in {p.name} ({region})"
    if kind == "npy-header":
        p = rng.choice(npys)
        raw = bytearray(p.read_bytes())
        what = rng.choice(["shape", "descr", "fortran", "magic", "version", "hlen"])
        head_len = 10 + int.from_bytes(raw[8:10], "little")
        head = raw[10:head_len].decode("latin1")
        if what == "shape":
            head = head.replace("'shape': (", f"'shape': ({rng.randrange(1, 99)}, ", 1)
        elif what == "descr":
            head = head.replace("'descr': '", "'descr': '" + rng.choice(["|O", ">f8", "<c16", "|b1", "<U4"]) + "', '_", 1)
        elif what == "fortran":
            head = head.replace("False", "True ", 1)
        if what in ("shape", "descr", "fortran"):
            hb = head.encode("latin1")
            raw = raw[:10] + hb + raw[head_len:]
            raw[8:10] = len(hb).to_bytes(2, "little")
        elif what == "magic":
            raw[rng.randrange(6)] ^= 0xFF
        elif what == "version":
            raw[6] = rng.choice([2, 3, 9])
        else:
            raw[8:10] = rng.randrange(65536).to_bytes(2, "little")
        p.write_bytes(bytes(raw))
        return f"{p.name}: header {what} edited"
    if kind in ("wrong-dtype", "wrong-shape", "consistent-dtype", "consistent-shape"):
        p = rng.choice(npys)
        arr = np.load(p)
        new = _mutated(arr, kind, rng)
        _rewrite_npy(p, new)
        _update_manifest_entry(vdir, p.stem, new, descr_and_shape=kind.startswith("consistent"))
        return f"{p.name} rewritten as {new.dtype}{list(new.shape)} (manifest {'all' if kind.startswith('consistent') else 'size+crc'} updated)"
    if kind == "manifest-garbage":
        p = vdir / "manifest.json"
        what = rng.choice(["random", "truncated", "empty", "nul", "deep"])
        if what == "random":
            p.write_bytes(os.urandom(rng.randrange(1, 400)))
        elif what == "truncated":
            t = p.read_bytes()
            p.write_bytes(t[:rng.randrange(len(t))])
        elif what == "empty":
            p.write_bytes(b"")
        elif what == "nul":
            p.write_bytes(b"\0" * 50)
        else:
            p.write_text("[" * 100000 + "]" * 100000)
        return f"manifest.json {what}"
    if kind == "manifest-json":
        p = vdir / "manifest.json"
        man = json.loads(p.read_text())
        path = rng.choice(["format_version", "version", "arrays", "meta", "arrays.*", "arrays.*.dtype",
                           "arrays.*.shape", "arrays.*.bytes", "arrays.*.crc32", "meta.*", "extra"])
        value = rng.choice([None, [], {}, "x", -1, 10**30, 1.5, True, float("nan"), [[[]]], "\u0000"])
        target, key = man, path
        if path.startswith("arrays.*"):
            name = rng.choice(sorted(man["arrays"]))
            target, key = (man["arrays"], name) if path == "arrays.*" else (man["arrays"][name], path.split(".")[-1])
        elif path == "meta.*" and isinstance(man["meta"], dict) and man["meta"]:
            target, key = man["meta"], rng.choice(sorted(man["meta"]))
        if rng.random() < 0.2 and key in target:
            del target[key]
            what = "deleted"
        else:
            target[key] = value
            what = f"= {value!r}"
        p.write_text(json.dumps(man, separators=(",", ":"), allow_nan=True))
        return f"manifest {path} {what}"
    if kind == "missing-file":
        p = rng.choice(_files(dst) + [vdir])
        shutil.rmtree(p) if p.is_dir() else p.unlink()
        return f"{p.name} removed"
    if kind == "symlink":
        what = rng.choice(["npy", "manifest", "vdir", "current", "loop"])
        if what in ("npy", "manifest"):
            p = rng.choice(npys) if what == "npy" else vdir / "manifest.json"
            copy = outside / f"{rng.random()}-{p.name}"
            shutil.copy(p, copy)
            if rng.random() < 0.5:
                _flip(copy, rng, 1)
            p.unlink()
            p.symlink_to(copy)
        elif what == "vdir":
            copy = outside / f"{rng.random()}-{vdir.name}"
            shutil.copytree(vdir, copy)
            shutil.rmtree(vdir)
            vdir.symlink_to(copy)
        elif what == "current":
            copy = outside / f"{rng.random()}-CURRENT"
            shutil.copy(dst / "CURRENT", copy)
            (dst / "CURRENT").unlink()
            (dst / "CURRENT").symlink_to(copy)
        else:
            p = rng.choice(npys)
            p.unlink()
            p.symlink_to(p)
        return f"symlink: {what}"
    if kind == "current-odd":
        body = rng.choice(["v99999999\n", "garbage\n", "../v00000001\n", "", "\n", "v1\n", "v00000000\n",
                           "v00000001\nv00000002\n", "/etc\n", "v0000000a\n", "\0" * 10])
        (dst / "CURRENT").write_text(body)
        return f"CURRENT = {body!r}"
    if kind == "newer-format":
        p = vdir / "manifest.json"
        man = json.loads(p.read_text())
        man["format_version"] = man.get("format_version", 1) + rng.randrange(1, 5)
        p.write_text(json.dumps(man, separators=(",", ":")))
        return "format_version raised"
    raise ValueError(kind)


# ----------------------------------------------------------------------------- formats 2 and 3: a codec for forging
# Written from the layout in memory/store_format.py's docstring, so forgeries do not reuse the
# store's own code. ``split_v2`` gives every field with its position, ``build_v2`` lays a file out
# from fields (payloads placed by the alignment rule) and ``fix_crc`` makes its CRC right.
# The field codec (magic, dtype codes, varints) is tests/_store_ref.py's: one independent reader of
# the layout, shared by the tests and this campaign.
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # tests/
from _store_ref import CODES, MAGIC, NAMES  # noqa: E402
from _store_ref import _varint as _dec  # noqa: E402
from _store_ref import dtype_of as _dtype  # noqa: E402
from _store_ref import enc_varint as _enc  # noqa: E402


def code_of(dtype: np.dtype) -> int:
    little = dtype.newbyteorder("<") if dtype.byteorder == ">" else dtype
    return CODES.index(little.str if little.itemsize > 1 else "<" + little.str[1:]) | (0x80 if dtype.byteorder == ">" else 0)


def split_v2(raw: bytes) -> dict:
    """The fields of a valid version file, each array with its descriptor's span and its payload."""
    fmt, version = raw[4], struct.unpack_from("<I", raw, 9)[0]
    n, pos = _dec(raw, 13)
    meta_len, pos = _dec(raw, pos)
    spans = {"prefix": (0, 13), "counts": (13, pos)}
    arrays = []
    for _ in range(n):
        start = pos
        spelled = True
        if fmt == 3:  # a one-byte name code, 0: the name follows
            spelled = raw[pos] == 0
            name = "" if spelled else NAMES[raw[pos] - 1]
            pos += 1
        if spelled:
            nlen, pos = _dec(raw, pos)
            name = raw[pos:pos + nlen].decode("ascii")
            pos += nlen
        code = raw[pos]
        pos += 1
        ndim, pos = _dec(raw, pos)
        shape = []
        for _ in range(ndim):
            d, pos = _dec(raw, pos)
            shape.append(d)
        arrays.append({"name": name, "code": code, "shape": shape, "span": (start, pos), "spelled": spelled})
    spans["descriptors"] = (spans["counts"][1], pos)
    spans["meta"] = (pos, pos + meta_len)
    end = pos + meta_len
    for a in arrays:
        dt = _dtype(a["code"])
        nbytes = dt.itemsize * int(np.prod(a["shape"], dtype=np.int64))
        if nbytes:
            end = -(-end // dt.alignment) * dt.alignment
        a["payload"] = raw[end:end + nbytes]
        end += nbytes
    spans["payload"] = (spans["meta"][1], len(raw))
    return {"format": fmt, "version": version, "arrays": arrays, "meta": raw[spans["meta"][0]:spans["meta"][1]],
            "spans": spans}


def fix_crc(raw: bytes) -> bytes:
    out = bytearray(raw)
    struct.pack_into("<I", out, 5, zlib.crc32(raw[9:], zlib.crc32(raw[:5])))
    return bytes(out)


def descriptor(fmt: int, a: dict) -> bytes:
    """One array's descriptor: its name (format 3: the code of a listed name, unless the array says
    it was spelled out, or a forged ``name_code``; else 0 and the name), dtype code, ndim, dims."""
    name = a["name"].encode("latin-1")
    if fmt == 3 and "name_code" in a:
        head = bytes([a["name_code"]])
    elif fmt == 3 and a["name"] in NAMES and not a.get("spelled"):
        head = bytes([NAMES.index(a["name"]) + 1])
    else:
        head = (b"\x00" if fmt == 3 else b"") + _enc(len(name)) + name
    return head + bytes([a["code"]]) + _enc(len(a["shape"])) + b"".join(_enc(d) for d in a["shape"])


def build_v2(doc: dict, descriptors: bytes | None = None, n_arrays: int | None = None,
             meta_len: int | None = None) -> bytes:
    """A file laid out from ``doc``'s fields, CRC fixed; the optional arguments override what the
    header says (a forged descriptor block, array count or meta length) without moving payloads."""
    desc = descriptors if descriptors is not None else b"".join(descriptor(doc["format"], a) for a in doc["arrays"])
    out = bytearray(struct.pack("<4sBII", MAGIC, doc["format"], 0, doc["version"]))
    out += _enc(len(doc["arrays"]) if n_arrays is None else n_arrays)
    out += _enc(len(doc["meta"]) if meta_len is None else meta_len) + desc + doc["meta"]
    for a in doc["arrays"]:
        align = _dtype(a["code"]).alignment if (a["code"] & 0x7F) < len(CODES) else 1  # a forged code: unaligned
        if a["payload"]:
            out += bytes(-len(out) % align)
        out += a["payload"]
    return fix_crc(bytes(out))


def _flip_bytes(data: bytearray, rng: random.Random, n: int, lo: int, hi: int) -> None:
    for _ in range(n):
        i = rng.randrange(lo, max(lo + 1, min(hi, len(data))))
        data[min(i, len(data) - 1)] ^= 1 << rng.randrange(8)


def _array_of(a: dict) -> np.ndarray:
    return np.frombuffer(a["payload"], dtype=_dtype(a["code"])).reshape(a["shape"])


def _meta_json_edit(man: dict, rng: random.Random) -> str:
    """One edit of a memory's stored fields (or of a plain store's meta), in place; returns what."""
    value = rng.choice([None, [], {}, "x", -1, 10**30, 1.5, True, [[[]]], "\u0000", "default", 640, "1%"])
    keys = ["m", "p", "t", "f", "b", "s", "e", "k", "extra"] if "m" in man else sorted(man) + ["extra"]
    key = rng.choice(keys)
    if key == "f" and isinstance(man.get("f"), list) and man["f"] and rng.random() < 0.5:
        i = rng.randrange(len(man["f"]))
        man["f"][i] = value
        return f"meta f[{i}] = {value!r}"
    if rng.random() < 0.2 and key in man:
        del man[key]
        return f"meta {key} deleted"
    man[key] = value
    return f"meta {key} = {value!r}"


def mutate_v2(dst: Path, kind: str, rng: random.Random, outside: Path) -> tuple[str, bool]:
    """Damage or forge the format-3 store copied at ``dst``; returns (what was done, forged)."""
    cur = (dst / "CURRENT").read_text().strip()
    vfile = dst / cur
    raw = vfile.read_bytes()
    doc = split_v2(raw)
    spans = doc["spans"]
    if kind == "truncate":
        p = rng.choice([vfile, vfile, vfile, dst / "CURRENT"])
        size = p.stat().st_size
        cut = rng.randrange(size) if size else 0
        os.truncate(p, cut)
        return f"{p.name} cut to {cut} of {size} bytes", False
    if kind == "bitflip":
        if rng.random() < 0.1:
            data = bytearray((dst / "CURRENT").read_bytes())
            _flip_bytes(data, rng, rng.choice([1, 2]), 0, len(data))
            (dst / "CURRENT").write_bytes(bytes(data))
            return "bit(s) flipped in CURRENT", False
        region = rng.choice(["prefix", "counts", "descriptors", "meta", "payload", "payload", "any"])
        lo, hi = spans[region] if region != "any" else (0, len(raw))
        n = rng.choice([1, 1, 2, 8])
        data = bytearray(raw)
        _flip_bytes(data, rng, n, lo, hi)
        vfile.write_bytes(bytes(data))
        return f"{n} bit(s) flipped in {cur} ({region} {lo}-{hi})", False
    if kind == "garbage":
        what = rng.choice(["random", "empty", "nul", "json", "npy", "prefix", "doubled"])
        body = {"random": lambda: os.urandom(rng.randrange(1, 400)), "empty": lambda: b"", "nul": lambda: b"\0" * 64,
                "json": lambda: json.dumps({"format_version": 2, "arrays": {}, "meta": {}}).encode(),
                "npy": lambda: _npy_bytes(np.arange(5, dtype=np.float32)), "prefix": lambda: raw[:rng.randrange(64)],
                "doubled": lambda: raw + raw}[what]()
        vfile.write_bytes(body)
        return f"{cur} replaced ({what}, {len(body)} bytes)", False
    if kind == "header-field":
        return _forge_field(vfile, doc, rng), True
    if kind in ("wrong-dtype", "wrong-shape", "consistent-dtype", "consistent-shape"):
        candidates = [a for a in doc["arrays"]]
        a = rng.choice(candidates)
        arr = _array_of(a)
        new = _mutated(arr, kind, rng)
        new = np.ascontiguousarray(new)
        a["payload"] = new.tobytes()
        if kind.startswith("consistent"):
            a["code"], a["shape"] = code_of(new.dtype), list(new.shape)
        vfile.write_bytes(build_v2(doc))
        return (f"{a['name']} rewritten as {new.dtype}{list(new.shape)} "
                f"(header {'updated' if kind.startswith('consistent') else 'kept'}, CRC recomputed)"), True
    if kind == "meta-garbage":
        what = rng.choice(["random", "truncated", "empty", "nul", "deep", "nan", "not-object", "latin1"])
        m = doc["meta"]
        doc["meta"] = {"random": lambda: os.urandom(rng.randrange(1, 200)), "truncated": lambda: m[:rng.randrange(len(m))],
                       "empty": lambda: b"", "nul": lambda: b"\0" * 20, "deep": lambda: b"[" * 100000 + b"]" * 100000,
                       "nan": lambda: b'{"s":NaN}', "not-object": lambda: b"[1,2,3]",
                       "latin1": lambda: '{"t":"\u00e9"}'.encode("latin-1")}[what]()
        vfile.write_bytes(build_v2(doc))
        return f"meta {what} (laid out as a valid file, CRC recomputed)", True
    if kind == "meta-json":
        man = json.loads(doc["meta"])
        what = _meta_json_edit(man, rng)
        doc["meta"] = json.dumps(man, separators=(",", ":"), ensure_ascii=True).encode("ascii")
        forged = rng.random() < 0.7
        body = build_v2(doc)
        if not forged:
            body = body[:5] + raw[5:9] + body[9:]  # the old CRC: damage, as an editor would leave it
        vfile.write_bytes(body)
        return f"{what} ({'CRC recomputed' if forged else 'CRC left'})", forged
    if kind == "missing-file":
        p = rng.choice([vfile, vfile, dst / "CURRENT"])
        p.unlink()
        return f"{p.name} removed", False
    if kind == "symlink":
        what = rng.choice(["version", "version-flipped", "current", "loop", "to-dir", "dangling"])
        if what.startswith("version"):
            copy = outside / f"{rng.random()}-{cur}"
            shutil.copy(vfile, copy)
            if what == "version-flipped":
                data = bytearray(copy.read_bytes())
                _flip_bytes(data, rng, 1, 0, len(data))
                copy.write_bytes(bytes(data))
            vfile.unlink()
            vfile.symlink_to(copy)
        elif what == "current":
            copy = outside / f"{rng.random()}-CURRENT"
            shutil.copy(dst / "CURRENT", copy)
            (dst / "CURRENT").unlink()
            (dst / "CURRENT").symlink_to(copy)
        elif what == "loop":
            vfile.unlink()
            vfile.symlink_to(vfile)
        elif what == "to-dir":
            vfile.unlink()
            vfile.symlink_to(outside)
        else:
            vfile.unlink()
            vfile.symlink_to(outside / f"missing-{rng.random()}")
        return f"symlink: {what}", False
    if kind == "current-odd":
        body = rng.choice(["v99999999\n", "garbage\n", "../v00000001\n", "", "\n", "v1\n", "v00000000\n",
                           "v00000001\nv00000002\n", "/etc\n", "v0000000a\n", "\0" * 10, "CURRENT\n", ".lock\n"])
        (dst / "CURRENT").write_text(body)
        return f"CURRENT = {body!r}", False
    if kind == "newer-format":
        fmt = 2 + rng.randrange(1, 250)
        data = bytearray(raw)
        data[4] = fmt
        fixed = rng.random() < 0.5
        vfile.write_bytes(fix_crc(bytes(data)) if fixed else bytes(data))
        return f"format byte {fmt} ({'CRC recomputed' if fixed else 'CRC left'})", False
    raise ValueError(kind)


def _npy_bytes(arr: np.ndarray) -> bytes:
    buf = io.BytesIO()
    np.lib.format.write_array(buf, arr, version=(1, 0))
    return buf.getvalue()


def _forge_field(vfile: Path, doc: dict, rng: random.Random) -> str:
    """Edit one header field and recompute the CRC: only the field checks can refuse it."""
    arrays = doc["arrays"]
    what = rng.choice(["dim", "dim", "ndim", "code", "code", "name", "count", "meta-len", "version", "overlong",
                       "drop", "duplicate", "swap-shape", "format-1", "name-code"])
    a = rng.choice(arrays)
    if what == "dim" and a["shape"]:
        i = rng.randrange(len(a["shape"]))
        a["shape"][i] = rng.choice([0, 1, a["shape"][i] + 1, max(0, a["shape"][i] - 1), 2**40, 2**63, 2**69])
    elif what == "ndim":
        a["shape"] = a["shape"] + [1] if rng.random() < 0.5 or not a["shape"] else a["shape"][:-1]
        if rng.random() < 0.2:
            a["shape"] = [1] * rng.choice([33, 64, 1000])
    elif what == "code":
        a["code"] = rng.randrange(256)
    elif what == "name":
        a["name"] = rng.choice(["", "UPPER", "../evil", "a b", "x" * 201, "\u00e9", arrays[0]["name"], "new_name"])
        a["spelled"] = True
    elif what == "name-code":  # format 3: a code past the list, or another listed array's
        a["name_code"] = rng.choice([len(NAMES) + 1, 255, 1 + rng.randrange(len(NAMES))])
    elif what == "count":
        vfile.write_bytes(build_v2(doc, n_arrays=rng.choice([0, len(arrays) - 1, len(arrays) + 1, 5000, 2**40])))
        return "header-field count"
    elif what == "meta-len":
        vfile.write_bytes(build_v2(doc, meta_len=rng.choice([0, len(doc["meta"]) - 1, len(doc["meta"]) + 1, 2**31])))
        return "header-field meta-len"
    elif what == "version":
        doc["version"] = rng.choice([0, doc["version"] + 1, 2**32 - 1])
    elif what == "overlong":
        vfile.write_bytes(build_v2(doc, descriptors=b"\xff" * rng.randrange(10, 40)))
        return "header-field overlong"
    elif what == "drop":
        arrays.remove(a)  # the header loses an array: its payload is left over
        desc = b"".join(descriptor(doc["format"], x) for x in arrays)
        body = bytearray(build_v2(doc, descriptors=desc))
        body += a["payload"]
        vfile.write_bytes(fix_crc(bytes(body)))
        return f"header-field drop {a['name']}"
    elif what == "duplicate":
        arrays.append(dict(a))
    elif what == "swap-shape" and len(a["shape"]) == 2:
        a["shape"] = a["shape"][::-1]  # same size, another shape
    elif what == "format-1":
        doc["format"] = 1
    if what not in ("drop",):
        try:
            vfile.write_bytes(build_v2(doc))
        except (UnicodeEncodeError, ValueError):  # a name latin-1 cannot hold: write it as UTF-8 bytes
            a["name"] = a["name"].encode("utf-8").decode("latin-1")
            vfile.write_bytes(build_v2(doc))
    return f"header-field {what} of {a['name'][:20]!r}"


def mutate(src: Path, dst: Path, kind: str, rng: random.Random, outside: Path) -> tuple[str, bool]:
    """Copy ``src`` to ``dst`` and damage (or forge) the copy: (what was done, forged)."""
    if kind == "legacy-v1":
        sub = rng.choice(V1_KINDS)
        return f"v1 {sub}: " + mutate_v1(src, dst, sub, rng, outside), sub.startswith("consistent")
    shutil.copytree(src, dst, symlinks=True)
    return mutate_v2(dst, kind, rng, outside)


# ----------------------------------------------------------------------------- opening
def open_all_ways(d: Path, base: dict, engine=None) -> dict:
    """Open ``d`` as a user would; returns {"outcome": ..., "detail": ...} (see module docstring)."""
    from miita_edge.cli import main as cli_main
    from miita_edge.errors import MiitaError
    from miita_edge.memory.bank import MemoryBank
    from miita_edge.memory.store import Store
    from miita_edge.miita import memory_fields

    res = {"store": None, "info": None, "bank": None, "ask": None, "silent": False, "meta_changed": False}

    def clean(exc: BaseException) -> bool:
        return isinstance(exc, MiitaError) and "\n" not in str(exc)

    try:
        snap = Store(d).read()
        got = {k: (str(v.dtype), v.shape, np.asarray(v).tobytes()) for k, v in snap.arrays.items()}
        res["store"] = "accepted"
        res["silent"] = got != base["arrays"]
        res["meta_changed"] = snap.manifest != base["manifest"]
    except Exception as exc:  # noqa: BLE001
        res["store"] = "rejected" if clean(exc) else f"CRASH {type(exc).__name__}: {str(exc)[:200]}"
        snap = None
    out, err = io.StringIO(), io.StringIO()
    try:
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
            rc = cli_main(["info", "--memory", str(d), "--json"])
        lines = err.getvalue().strip().splitlines()
        res["info"] = ("accepted" if rc == 0 else
                       "rejected" if rc == 2 and len(lines) == 1 else f"CRASH rc {rc}: {err.getvalue()[-200:]}")
    except BaseException as exc:  # noqa: BLE001 - SystemExit, tracebacks: all count
        res["info"] = f"CRASH {type(exc).__name__}: {str(exc)[:200]}"
    if snap is not None and isinstance(snap.manifest, dict) and ("preset" in snap.manifest or "m" in snap.manifest):
        try:
            fields, preset = memory_fields(d, snap)  # what Miita does first with a manifest
            n_embd = fields["fingerprint"]["n_embd"]
            MemoryBank.from_arrays(preset.bank, n_embd, snap.arrays,
                                   np.zeros(n_embd, np.float32) if preset.center_keys else None)
            res["bank"] = "accepted"
        except (KeyError, ValueError, TypeError) as exc:
            # what Miita.__init__ turns into a StoreError ("inconsistent arrays"): clean if it does
            res["bank"] = f"rejected-by-facade {type(exc).__name__}"
        except Exception as exc:  # noqa: BLE001
            res["bank"] = "rejected" if clean(exc) else f"CRASH {type(exc).__name__}: {str(exc)[:200]}"
    if engine is not None and snap is not None:
        from miita_edge.miita import Miita

        try:
            m = Miita(memory=d, engine=engine)
            m.ask("question about billing", max_tokens=2)
            res["ask"] = "accepted"
        except Exception as exc:  # noqa: BLE001
            res["ask"] = "rejected" if clean(exc) else f"CRASH {type(exc).__name__}: {str(exc)[:200]}"
    return res


WORKER = r"""
import json, sys
sys.path.insert(0, sys.argv[1])
import reliability_corruption as rc
from pathlib import Path
jobs = json.loads(sys.stdin.read())
engine = None
if any(j.get("model") for j in jobs):
    from miita_edge.runtime.engine import Engine, EngineConfig
    engine = Engine(None, EngineConfig(n_threads=1, n_ctx=512))
bases = {}
for j in jobs:
    if j["base"] not in bases:
        bases[j["base"]] = rc._normalise(json.loads(Path(j["base_json"]).read_text(), object_hook=rc.decode_base))
    r = rc.open_all_ways(Path(j["dir"]), bases[j["base"]], engine if j.get("model") else None)
    print(json.dumps({"i": j["i"], **r}), flush=True)
"""


def encode_base(obj):
    if isinstance(obj, bytes):
        return {"__b": obj.hex()}
    if isinstance(obj, tuple):
        return list(obj)
    raise TypeError(type(obj))


def decode_base(d):
    if "__b" in d:
        return bytes.fromhex(d["__b"])
    return d


def _normalise(base: dict) -> dict:
    """What open_all_ways compares against, in the form it builds (tuples of dtype, shape, bytes)."""
    return {"version": base["version"], "manifest": base["manifest"],
            "arrays": {k: (v[0], tuple(v[1]), v[2]) for k, v in base["arrays"].items()}}


def run_jobs(jobs: list[dict], batch: int = 200) -> list[dict]:
    """Open every job's directory in worker processes; a worker that dies charges its current job."""
    results: dict[int, dict] = {}
    todo = list(jobs)
    while todo:
        chunk, todo = todo[:batch], todo[batch:]
        p = subprocess.run([sys.executable, "-c", WORKER, str(Path(__file__).resolve().parent)],
                           input=json.dumps(chunk), capture_output=True, text=True)
        for line in p.stdout.splitlines():
            r = json.loads(line)
            results[r["i"]] = r
        done = [j for j in chunk if j["i"] in results]
        if len(done) < len(chunk):
            victim = next(j for j in chunk if j["i"] not in results)
            sig = -p.returncode if p.returncode < 0 else None
            results[victim["i"]] = {"i": victim["i"], "store": f"CRASH worker died (signal {sig}, rc {p.returncode}): "
                                                                   f"{p.stderr.strip()[-300:]}"}
            todo = [j for j in chunk if j["i"] not in results] + todo
    return [results[j["i"]] for j in jobs]


def failures_of(r: dict) -> list[str]:
    """Crashes always; for a damaged (not forged) store, an acceptance with changed arrays, and for
    a format-2 one also with a changed manifest (the CRC covers it)."""
    out = [f"{k}: {v}" for k, v in r.items() if isinstance(v, str) and v.startswith("CRASH")]
    if r.get("silent") and not r.get("consistent"):
        out.append("silent acceptance of changed array bytes")
    if r.get("meta_changed") and not r.get("consistent") and r.get("v2") and r.get("store") == "accepted":
        out.append("silent acceptance of a changed manifest")
    return out


def campaign(count: int, seed: int, work: Path, with_model: bool, model_sample: int, progress: bool = True) -> dict:
    rng = random.Random(seed)
    t0 = time.perf_counter()
    bases = make_bases(work, with_model)
    base_json = {}
    for b in bases:
        p = work / f"{b.name}.json"
        p.write_text(json.dumps(base_content(b), default=encode_base))
        base_json[b] = p
    outside = work / "outside"
    outside.mkdir()
    jobs, descr = [], {}
    model_bases = [b for b in bases if not b.name.startswith(("base-store", "base-v1-plain"))]
    v1_bases, v2_bases = [b for b in bases if is_v1(b)], [b for b in bases if not is_v1(b)]
    kinds = KINDS if v1_bases else tuple(k for k in KINDS if k != "legacy-v1")
    for i in range(count):
        kind = kinds[i % len(kinds)] if i < 2 * len(kinds) else rng.choice(kinds)
        base = rng.choice(v1_bases if kind == "legacy-v1" else v2_bases)
        d = work / "m" / f"{i:05d}"
        d.parent.mkdir(exist_ok=True)
        what, forged = mutate(base, d, kind, rng, outside)
        descr[i] = (kind, base.name, what, forged)
        jobs.append({"i": i, "dir": str(d), "base": str(base), "base_json": str(base_json[base]),
                     "model": with_model and base in model_bases and rng.random() < model_sample / max(count, 1) * 2})
    if progress:
        print(f"  {count} mutated directories made in {time.perf_counter() - t0:.0f} s", file=sys.stderr, flush=True)
    results = run_jobs(jobs)
    table: dict[str, Counter] = defaultdict(Counter)
    failures = []
    for j, r in zip(jobs, results):
        kind, base, what, forged = descr[j["i"]]
        r["consistent"] = forged  # a forgery (CRC recomputed) may be accepted: it is a valid store
        r["v2"] = kind != "legacy-v1"
        t = table[kind]
        t["count"] += 1
        fs = failures_of(r)
        if fs:
            failures.append(f"#{j['i']} {kind} on {base} ({what}): {'; '.join(fs)}")
            t["failures"] += 1
        store_ok = r.get("store") == "accepted"
        changed = bool(r.get("silent")) or bool(r.get("meta_changed"))
        t["forged"] += forged
        t["store rejected"] += r.get("store") == "rejected"
        t["store accepted identical"] += store_ok and not changed
        t["forgery accepted"] += store_ok and forged and changed
        t["manifest text changed, accepted"] += store_ok and not forged and not r.get("silent") and bool(r.get("meta_changed"))
        t["info rejected"] += r.get("info") == "rejected"
        t["facade rejected"] += (r.get("bank") or "").startswith("rejected") or r.get("ask") == "rejected"
        t["full open + ask"] += r.get("ask") is not None
    return {"table": table, "failures": failures, "seconds": time.perf_counter() - t0, "bases": len(bases)}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--count", type=int, default=10000)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--no-model", action="store_true", help="model-free bases only")
    ap.add_argument("--model-sample", type=int, default=200, help="about this many get a full Miita open + ask")
    args = ap.parse_args(argv)
    work = Path(tempfile.mkdtemp(prefix="miita-corrupt-"))
    print(f"# {' '.join(['python', 'tests/reliability/reliability_corruption.py'] + (argv if argv is not None else sys.argv[1:]))}")
    r = campaign(args.count, args.seed, work, not args.no_model, args.model_sample)
    print_table(r)
    shutil.rmtree(work, ignore_errors=True)
    return 1 if r["failures"] else 0


def print_table(r: dict) -> None:
    """Columns: count; forged (of them, CRC recomputed); st.rej the store refused it; st.same it
    accepted it with arrays and manifest identical to the base's (a CURRENT without its newline, a
    symlink to an identical copy); forg.acc it accepted a forgery with a changed content (a valid
    store); meta± it accepted a damaged copy whose arrays were intact but whose manifest changed
    (format 1 only: a failure for format 2); info.rej ``miita-edge info`` refused it; fac.rej the
    facade refused what the store accepted; open+ask a full Miita open and ask; FAILURES."""
    cols = ["count", "forged", "store rejected", "store accepted identical", "forgery accepted",
            "manifest text changed, accepted", "info rejected", "facade rejected", "full open + ask", "failures"]
    print(f"{'kind':18s}" + "".join(f"{c:>9s}" for c in ["count", "forged", "st.rej", "st.same", "forg.acc", "meta±",
                                                          "info.rej", "fac.rej", "open+ask", "FAILURES"]))
    total = Counter()
    for kind in KINDS:
        t = r["table"].get(kind, Counter())
        total.update(t)
        print(f"{kind:18s}" + "".join(f"{t[c]:>9d}" for c in cols))
    print(f"{'total':18s}" + "".join(f"{total[c]:>9d}" for c in cols))
    print(f"{r['bases']} bases, {r['seconds']:.0f} s; failures (crashes + silent acceptances): {len(r['failures'])}")
    for f in r["failures"][:30]:
        print("   ", f)


if __name__ == "__main__":
    sys.exit(main())
