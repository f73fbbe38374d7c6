"""Corruption campaign: open thousands of damaged memory directories the ways a user would.

Bases: model-free stores written through ``memory.store.Store``, and (unless ``--no-model``) real
memories of both presets made by ``Miita.ingest``. Each mutation copies a base and damages it
(kinds below); worker processes then open it with ``Store.read()``, ``miita-edge info`` (in
process) and the facade's parse of the arrays (``Preset.from_json`` + ``MemoryBank.from_arrays``,
what ``Miita`` does after reading), and — for a sample of the real memories — a full ``Miita``
open and one ``ask``. Workers run in subprocesses, so a segfault is seen and charged to the
mutation that caused it.

Outcomes per opening: *rejected* with the documented error (a ``MiitaError`` subclass whose message
is one line; the CLI exits 2 with one stderr line), or *accepted*. Failures:

* crash: a signal (segfault, abort), any other exception, or a multi-line error;
* silent acceptance: an accepted read whose arrays differ in any byte from the base's.

``consistent-*`` kinds rewrite an array *and* its manifest entry (size, CRC, dtype/shape) so the
store sees a valid memory with different content: accepting it is not a silent acceptance, but
the facade must still open it or refuse it cleanly. Manifest text that stays valid JSON after a
mutation (a digit of a count, a padding character) is reported as its own figure: the manifest
has no checksum of its own (docs/reliability.md says what that means).

    python bench/reliability_corruption.py [--count 10000] [--seed 0] [--no-model] [--model-sample 200]
"""
from __future__ import annotations

import argparse
import contextlib
import io
import json
import os
import random
import shutil
import subprocess
import sys
import tempfile
import time
from collections import Counter, defaultdict
from pathlib import Path

import numpy as np

KINDS = ("truncate", "bitflip", "npy-header", "wrong-dtype", "wrong-shape", "consistent-dtype",
         "consistent-shape", "manifest-garbage", "manifest-json", "missing-file", "symlink", "current-odd",
         "newer-format")


# ----------------------------------------------------------------------------- bases
def make_bases(work: Path, with_model: bool) -> list[Path]:
    from miita_edge.memory.store import Store

    bases = []
    rng = np.random.default_rng(0)
    for b in range(2):
        d = work / f"base-store-{b}"
        with Store(d).writer() as w:
            w.commit({"anchors": rng.standard_normal((7 + b, 16)).astype(np.float32),
                      "tokens": rng.integers(0, 1000, 11).astype(np.int32),
                      "bits": rng.integers(0, 255, (5, 10)).astype(np.uint8),
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
    return bases


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


def mutate(src: Path, dst: Path, kind: str, rng: random.Random, outside: Path) -> str:
    """Copy ``src`` to ``dst`` and damage the copy; returns a description of what was done."""
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
        if kind.endswith("dtype"):
            new = arr.astype(rng.choice([np.float64, np.int16, np.uint8, np.float32, np.int64]))
            if new.dtype == arr.dtype:
                new = arr.astype(np.complex64)
        else:
            new = np.concatenate([arr, arr[:1]]) if arr.ndim and len(arr) else np.zeros((3,) + arr.shape[1:], arr.dtype)
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


# ----------------------------------------------------------------------------- opening
def open_all_ways(d: Path, base: dict, engine=None) -> dict:
    """Open ``d`` as a user would; returns {"outcome": ..., "detail": ...} (see module docstring)."""
    from miita_edge.cli import main as cli_main
    from miita_edge.errors import MiitaError
    from miita_edge.memory.bank import MemoryBank
    from miita_edge.memory.store import Store
    from miita_edge.miita import check_memory_meta

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
    if snap is not None and isinstance(snap.manifest, dict) and "preset" in snap.manifest:
        try:
            preset = check_memory_meta(d, snap.manifest)  # what Miita does first with a manifest
            n_embd = snap.manifest["fingerprint"]["n_embd"]
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
    out = [f"{k}: {v}" for k, v in r.items() if isinstance(v, str) and v.startswith("CRASH")]
    if r.get("silent") and not r.get("consistent"):
        out.append("silent acceptance of changed array bytes")
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
    model_bases = [b for b in bases if not b.name.startswith("base-store")]
    for i in range(count):
        kind = KINDS[i % len(KINDS)] if i < 2 * len(KINDS) else rng.choice(KINDS)
        base = rng.choice(bases)
        d = work / "m" / f"{i:05d}"
        d.parent.mkdir(exist_ok=True)
        descr[i] = (kind, base.name, mutate(base, d, kind, rng, outside))
        jobs.append({"i": i, "dir": str(d), "base": str(base), "base_json": str(base_json[base]),
                     "model": with_model and base in model_bases and rng.random() < model_sample / max(count, 1) * 2})
    if progress:
        print(f"  {count} mutated directories made in {time.perf_counter() - t0:.0f} s", file=sys.stderr, flush=True)
    results = run_jobs(jobs)
    table: dict[str, Counter] = defaultdict(Counter)
    failures = []
    for j, r in zip(jobs, results):
        kind, base, what = descr[j["i"]]
        r["consistent"] = kind.startswith("consistent")
        t = table[kind]
        t["count"] += 1
        fs = failures_of(r)
        if fs:
            failures.append(f"#{j['i']} {kind} on {base} ({what}): {'; '.join(fs)}")
            t["failures"] += 1
        store_ok = r.get("store") == "accepted"
        t["store rejected"] += r.get("store") == "rejected"
        t["store accepted identical"] += store_ok and not r.get("silent")
        t["manifest text changed, accepted"] += store_ok and not r.get("silent") and bool(r.get("meta_changed"))
        t["consistent rewrite accepted"] += store_ok and bool(r.get("silent")) and r["consistent"]
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
    print(f"# {' '.join(['python', 'bench/reliability_corruption.py'] + (argv if argv is not None else sys.argv[1:]))}")
    r = campaign(args.count, args.seed, work, not args.no_model, args.model_sample)
    cols = ["count", "store rejected", "store accepted identical", "manifest text changed, accepted",
            "consistent rewrite accepted", "info rejected", "facade rejected", "full open + ask", "failures"]
    print(f"{'kind':18s}" + "".join(f"{c:>10s}" for c in ["count", "st.rej", "st.ident", "meta±", "consist",
                                                           "info.rej", "fac.rej", "open+ask", "FAILURES"]))
    total = Counter()
    for kind in KINDS:
        t = r["table"].get(kind, Counter())
        total.update(t)
        print(f"{kind:18s}" + "".join(f"{t[c]:>10d}" for c in cols))
    print(f"{'total':18s}" + "".join(f"{total[c]:>10d}" for c in cols))
    print(f"{r['bases']} bases, {r['seconds']:.0f} s; failures (crashes + silent acceptances): {len(r['failures'])}")
    for f in r["failures"][:30]:
        print("   ", f)
    shutil.rmtree(work, ignore_errors=True)
    return 1 if r["failures"] else 0


if __name__ == "__main__":
    sys.exit(main())
