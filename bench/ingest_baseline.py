"""Issue 15's ingest baseline, measured on the pre-issue code itself rather than emulated.

``bench/memory.py`` and ``bench/ingest_batch.py`` stand for "ingest before issue 15" with today's
engine configured as it was then (every layer, KV buffers zeroed at each reset, one prompt per
decode). This script checks that stand-in against the real thing: it builds the commit before
issue 15 (``--commit``, default c8e0a89) from this repository into a private directory, then
times, in alternating child processes on the same demo rows (model load excluded, 3 ingests per
child, rounds interleaved):

* ``pre-issue code``: that commit's package, its default preset;
* ``stand-in``: today's code, full depth, KV zeroed once per pass (the baseline of the other two
  scripts);
* ``default, whole passes``: today's code with ``EngineConfig.key_prefix_cache`` off (every pass
  decodes its whole prompt, as before the ninth pass);
* ``default``: today's code as shipped (stop after the key layers, one prompt per decode, each pass
  continuing the rows it shares with the previous prompt: ``runtime.key_prefix``);
* ``batched``: today's code, ``Miita.batch_keys`` with 16 prompts per decode (opt-in);
* ``fast keys``: today's code, ``Miita.fast_keys`` (``--fast-keys``: the model's lossless Q8_0 twin,
  two one-thread contexts side by side, 32 prompts per decode; opt-in; the twin is written to the
  cache before the timing if it is not there);
* ``default/1``, ``batched default/1``: the same two with version 1 of the default preset, the one
  the pre-issue code ships (one key layer at half depth; version 4 adds one at two thirds, which the
  key pass must reach).

    python bench/ingest_baseline.py [--examples 120] [--rounds 3] [--threads 2] [--old-site DIR]
                                    [--data ../shared/data/banking77/train.jsonl --template banking77]

``--data``: rows of a JSONL stream (``input``/``output``) instead of the demo stream, under
``--template`` (default ``plain``, the demo's); a template's shared instruction is what the prefix
cache reuses, and the plain template shares nothing but BOS.

Building the old package takes about a minute (``pip install --target``; needs git, cmake and the
build dependencies, as ``.ci/run`` installs them).
"""
from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
MODES = ("pre-issue code", "stand-in", "default, whole passes", "default", "batched", "fast keys", "default/1",
         "batched default/1")


def child(mode: str, n: int, reps: int, threads: int, data: str | None, template: str) -> None:
    """Time ``reps`` ingests of ``n`` rows with whichever miita_edge is importable."""
    import json

    from miita_edge.demo.run import demo_stream
    from miita_edge.miita import Miita
    from miita_edge.runtime.engine import Engine, EngineConfig
    from miita_edge.streams import Example

    if data:
        with open(data, encoding="utf-8") as f:
            rows = [json.loads(line) for _, line in zip(range(n), f)]
        train = [Example(r["input"], r["output"], None, i + 1) for i, r in enumerate(rows)]
    else:
        train, _ = demo_stream()
    train = (train * (n // len(train) + 1))[:n]
    batched = mode.startswith("batched")
    preset = "default/1" if mode.endswith("default/1") else "default"
    eng = Engine(None, EngineConfig(n_threads=threads, n_seq_max=16) if batched else EngineConfig(n_threads=threads))
    if mode == "stand-in":
        eng.config.keys_stop_early, eng.config.clear_kv_data = False, True
    if mode == "default, whole passes":
        eng.config.key_prefix_cache = False
    kw = {} if mode == "pre-issue code" else {"preset": preset}  # the old package knows no versions
    fast = mode == "fast keys"
    warm = Miita(engine=eng, memory=tempfile.mkdtemp(), template=template, **kw)
    warm.fast_keys = fast  # the twin engine and its contexts are made here, once per process
    warm.ingest(train[:8], budget="none", progress=False)
    for _ in range(reps):
        m = Miita(engine=eng, memory=tempfile.mkdtemp(), template=template, **kw)
        m.batch_keys = batched
        m.fast_keys = fast
        t0 = time.perf_counter()
        m.ingest(train, budget="none", progress=False)
        print(f"RATE {n / (time.perf_counter() - t0):.3f}", flush=True)
    eng.close()


def build_old(commit: str, site: Path) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        src = Path(tmp) / "src"
        subprocess.run(["git", "-C", str(ROOT), "worktree", "add", "--detach", "-f", str(src), commit],
                       check=True, capture_output=True)
        try:
            subprocess.run([sys.executable, "-m", "pip", "install", "-q", "--no-build-isolation", "--no-deps",
                            "--target", str(site), str(src)], check=True)
        finally:
            subprocess.run(["git", "-C", str(ROOT), "worktree", "remove", "--force", str(src)], capture_output=True)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--examples", type=int, default=120)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--commit", default="c8e0a89", help="the last commit before issue 15")
    ap.add_argument("--old-site", type=Path, help="an already built package of --commit (pip install --target DIR)")
    ap.add_argument("--data", type=Path, help="a JSONL stream (input/output rows) instead of the demo rows")
    ap.add_argument("--template", default="plain", help="the template of --data (default: plain, the demo's)")
    ap.add_argument("--modes", default=",".join(MODES),
                    help="comma-separated rows to time (the first is the baseline of the ratios)")
    ap.add_argument("--child", choices=MODES, help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.child:
        child(args.child, args.examples, 3, args.threads, str(args.data) if args.data else None, args.template)
        return 0

    site = args.old_site
    if site is None:
        site = Path(tempfile.mkdtemp(prefix="miita-pre-issue-"))
        print(f"building {args.commit} into {site} ...", flush=True)
        build_old(args.commit, site)
    if not (site / "miita_edge").is_dir():
        raise SystemExit(f"{site}: no miita_edge package there")
    modes = [x.strip() for x in args.modes.split(",") if x.strip()]
    bad = [x for x in modes if x not in MODES]
    if bad or not modes:
        raise SystemExit(f"--modes: unknown {bad or 'empty'}; choose from {', '.join(MODES)}")
    rates: dict[str, list[float]] = {m: [] for m in modes}
    for _ in range(args.rounds):
        for mode in modes:
            env = dict(os.environ, PYTHONPATH=str(site if mode == "pre-issue code" else ROOT / "python"))
            # the child is this script run from outside the repository, so the old package's
            # import is not shadowed by the working tree
            out = subprocess.run([sys.executable, str(Path(__file__).resolve()), "--child", mode,
                                  "--examples", str(args.examples), "--threads", str(args.threads),
                                  "--template", args.template] + (["--data", str(args.data.resolve())] if args.data else []),
                                 env=env, cwd=tempfile.gettempdir(), capture_output=True, text=True)
            got = [float(line.split()[1]) for line in out.stdout.splitlines() if line.startswith("RATE ")]
            if out.returncode != 0 or not got:
                raise SystemExit(f"{mode}: child failed\n{out.stderr[-2000:]}")
            rates[mode] += got
    base = statistics.median(rates[modes[0]])
    what = f"{args.data} rows, template {args.template}" if args.data else "demo rows"
    print(f"# bench/ingest_baseline.py  {args.examples} {what}, threads={args.threads}, "
          f"{args.rounds} rounds x 3 ingests (medians), pre-issue = {args.commit}")
    for mode in modes:
        r = statistics.median(rates[mode])
        lo, hi = min(rates[mode]), max(rates[mode])
        print(f"   {mode:22s} {r:6.1f} examples/s  [{lo:5.1f}, {hi:5.1f}]   {r / base:5.2f}x the {modes[0]}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
