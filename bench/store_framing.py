"""Framing of committed memories: every persisted byte that is not array payload, per format.

For each memory directory given: its arrays (dtype, shape, payload bytes), where its framing goes
(format 1: one .npy header per array and manifest.json; format 2: the fixed prefix, the array
count and meta length, the array descriptors, the memory's fields as compact JSON, the alignment
padding), the bytes on disk against the file system, and what the same arrays and fields would
take in the other format (``encoded_size`` / ``encoded_size_v1``: the sizes budget repair uses).

    python bench/store_framing.py MEMORY_DIR [MEMORY_DIR ...]

docs/method.md §5 has the Banking77 1% figures (format 1 vs format 2, made by ``miita-edge ingest``
of the training rows with ``--budget 1% --template banking77`` by each format's code).
"""
from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path


def report(path: Path) -> dict:
    from miita_edge.memory import meta as meta_mod
    from miita_edge.memory.store import Store
    from miita_edge.memory.store_format import FIXED, encode_meta, encoded_size, layout, ordered_specs, varint
    from miita_edge.memory.store_format_v1 import MANIFEST, encoded_size_v1, npy_header
    from miita_edge.memory.budget import parse_budget

    snap = Store(path).read()
    fields = meta_mod.expand(snap.manifest, snap.arrays)
    arrays = {k: v for k, v in snap.arrays.items()}
    payload = sum(a.nbytes for a in arrays.values())
    vpath = path / (path / "CURRENT").read_text().strip()
    on_disk = vpath.stat().st_size if vpath.is_file() else sum(f.stat().st_size for f in vpath.iterdir())
    long_meta = {k: v for k, v in fields.items() if k != "format"} | {"format": meta_mod.FORMAT_V1}
    compact = meta_mod.compact(fields)
    out = {"memory": str(path), "format": snap.format_version, "version": snap.version,
           "prototypes": fields.get("prototypes"), "anchors": fields.get("anchors"),
           "examples": fields.get("examples"), "budget": fields.get("budget"),
           "budget_bytes": parse_budget(fields["budget"]).resolve(int(fields["stream_bytes"])),
           "arrays": {k: {"dtype": str(a.dtype), "shape": list(a.shape), "payload": int(a.nbytes)} for k, a in arrays.items()},
           "payload": payload, "bytes_on_disk": snap.bytes_on_disk, "bytes_by_file_system": on_disk}
    if snap.format_version == 1:
        from numpy.lib import format as npy_format

        headers = sum(len(npy_header(npy_format.dtype_to_descr(a.dtype), tuple(a.shape))) for a in arrays.values())
        out["framing"] = {"npy headers": headers, "manifest.json": (vpath / MANIFEST).stat().st_size}
    else:
        header, entries, size = layout(ordered_specs(arrays), encode_meta(snap.manifest))
        meta_len = len(encode_meta(snap.manifest))
        counts = len(varint(len(arrays))) + len(varint(meta_len))
        out["framing"] = {"prefix (magic, format, crc32, version)": FIXED.size, "array count + meta length": counts,
                          "array descriptors": len(header) - FIXED.size - counts - meta_len,
                          "memory fields (compact JSON)": meta_len, "alignment padding": size - len(header) - payload}
        out["meta"] = snap.manifest
    out["framing total"] = snap.bytes_on_disk - payload
    out["same content in format 1"] = encoded_size_v1(arrays, long_meta)
    out["same content in format 2"] = encoded_size(arrays, compact)
    return out


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("memories", nargs="+", type=Path)
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args(argv)
    print(f"# python bench/store_framing.py {' '.join(map(str, args.memories))}   ({os.uname().machine}, "
          f"Python {sys.version.split()[0]})")
    for path in args.memories:
        r = report(path)
        if args.json:
            print(json.dumps(r))
            continue
        print(f"\n{r['memory']}: format {r['format']}, version {r['version']}, {r['examples']} examples -> "
              f"{r['prototypes']} prototypes, {r['anchors']} anchors; budget {r['budget']} = {r['budget_bytes']} B")
        print(f"  {'array':14s} {'dtype':8s} {'shape':>10s} {'payload B':>10s}")
        for k, a in r["arrays"].items():
            print(f"  {k:14s} {a['dtype']:8s} {str(tuple(a['shape'])):>10s} {a['payload']:>10d}")
        print(f"  {'payload':35s} {r['payload']:>6d} B")
        for k, v in r["framing"].items():
            print(f"  framing: {k:26s} {v:>6d} B")
        print(f"  {'framing total':35s} {r['framing total']:>6d} B")
        print(f"  {'bytes on disk (store / file system)':35s} {r['bytes_on_disk']:>6d} / {r['bytes_by_file_system']} B")
        print(f"  same arrays and fields in format 1: {r['same content in format 1']} B, "
              f"in format 2: {r['same content in format 2']} B")
        if "meta" in r:
            print(f"  memory fields as stored: {json.dumps(r['meta'], separators=(',', ':'))}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
