"""Peak resident memory of `miita-edge ask` against two plain llama-cpp-python baselines.

Why this is measured the way it is: Linux carries ``ru_maxrss`` across ``exec``, so a child
started from a process that had already loaded a model reports that parent's peak, and two such
children compare at a ratio of 1.000 by construction (an earlier section 3 of bench/memory.py
reported exactly that). Here

* every measured process is started by a small launcher (a bare Python that only reads requests
  on stdin and runs them), which this script starts before it imports anything large, and
* every measured process reads its own ``VmHWM`` from ``/proc/self/status`` — the high-water mark
  of its own address space, which a fresh ``exec`` starts from zero.

It reports, for the same model, prompt and 16 greedy tokens:

* ``plain``: llama-cpp-python's low-level API (bench/engine.py's PlainLlama), same n_ctx and
  n_batch as the engine, no callback, weights as mapped — the baseline of the target (ask <= 1.10x);
* ``plain-repack``: the same with llama.cpp's extra buffer types (weights repacked for faster
  matmuls, as the engine loads them on CPUs without AMX): which part of the gap is that choice;
* ``llama``: llama-cpp-python's high-level ``Llama`` (n_ctx 4096), what a user would otherwise run;
* ``ask``: ``Miita(model, memory).ask(...)`` on a real memory,

each with the resident size after every stage (imports, model, context, memory, answer), which is
where an overhead shows up. ``--self-test`` shows the measurement can report a difference: a child
that allocates nothing next to a parent that has touched ``--self-test-mib`` MiB.

    python bench/peak_rss.py --memory DIR [--prompt TEXT] [--n-ctx 4096] [--reps 3] [--target NAME=LIMIT]
    python bench/peak_rss.py --self-test
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
from _report import Target, Targets, add_target_argument, print_header  # noqa: E402  (bench/_report.py)


def targets() -> list[Target]:
    return [Target("ask_plain", "<=", 1.10, "x", "peak RSS of ask / plain low-level llama-cpp-python")]

LAUNCHER = r"""
import json, subprocess, sys
for line in sys.stdin:
    req = json.loads(line)
    p = subprocess.run(req["argv"], capture_output=True, text=True, env=req["env"])
    sys.stdout.write(json.dumps({"rc": p.returncode, "stdout": p.stdout, "stderr": p.stderr[-4000:]}) + "\n")
    sys.stdout.flush()
"""

CHILD = r"""
import json, sys
def status():
    out = {}
    with open("/proc/self/status") as fh:
        for line in fh:
            k, _, v = line.partition(":")
            if k in ("VmRSS", "VmHWM"):
                out[k] = int(v.split()[0])
    return out
stages = []
def mark(name):
    s = status()
    stages.append([name, s["VmRSS"], s["VmHWM"]])
mode, model, memory, prompt, n_ctx, bench_dir = sys.argv[1:7]
n_ctx = int(n_ctx)
mark("start")
if mode == "idle":
    pass
elif mode in ("plain", "plain-repack"):
    import numpy as np
    import llama_cpp as L
    sys.path.insert(0, bench_dir)
    from engine import PlainLlama
    mark("imports")
    pl = PlainLlama(model, 2, n_ctx=n_ctx, n_batch=512, use_extra_bufts=mode == "plain-repack")
    mark("model+context")
    vocab = L.llama_model_get_vocab(pl.model)
    buf = (L.llama_token * 4096)()
    raw = prompt.encode()
    n = L.llama_tokenize(vocab, raw, len(raw), buf, 4096, True, False)
    tok = int(np.argmax(pl.decode(list(buf[:n]))))
    for _ in range(16):
        tok = int(np.argmax(pl.decode([tok])))
    mark("answer")
elif mode == "llama":
    import llama_cpp
    mark("imports")
    llm = llama_cpp.Llama(model, n_ctx=n_ctx, n_threads=2, verbose=False)
    mark("model+context")
    llm(prompt, max_tokens=16, temperature=0.0)
    mark("answer")
elif mode == "ask":
    import miita_edge
    from miita_edge.miita import Miita
    from miita_edge.runtime.engine import Engine, EngineConfig
    mark("imports")
    eng = Engine(model, EngineConfig(n_ctx=n_ctx, n_threads=2))
    mark("model+context")
    m = Miita(memory=memory, engine=eng)
    mark("memory open")
    m.retrieval_index()
    mark("retrieval index")
    m.ask(prompt, max_tokens=16, stop=())
    mark("answer")
elif mode == "alloc":  # self-test: a process that does touch memory
    import numpy as np
    a = np.ones(int(prompt) * 2**20 // 8)
    mark("allocated")
else:
    raise SystemExit(f"unknown mode {mode}")
print(json.dumps({"vmhwm_kib": status()["VmHWM"], "stages": stages}))
"""


class Launcher:
    """A bare Python process that runs measured children on request (see module docstring)."""

    def __init__(self) -> None:
        self.p = subprocess.Popen([sys.executable, "-S", "-c", LAUNCHER], stdin=subprocess.PIPE,
                                  stdout=subprocess.PIPE, text=True)

    def run(self, argv: list[str]) -> dict:
        self.p.stdin.write(json.dumps({"argv": argv, "env": dict(os.environ)}) + "\n")
        self.p.stdin.flush()
        res = json.loads(self.p.stdout.readline())
        if res["rc"] != 0:
            raise RuntimeError(f"{argv[3]} child failed (rc {res['rc']}): {res['stderr'][-2000:]}")
        return json.loads(res["stdout"].strip().splitlines()[-1])

    def close(self) -> None:
        self.p.stdin.close()
        self.p.wait()
        self.p.stdout.close()


def measure(launcher: Launcher | None, mode: str, model: str = "", memory: str = "", prompt: str = "",
            n_ctx: int = 4096) -> dict:
    """One measured child: {"vmhwm_kib": peak, "stages": [[name, VmRSS KiB, VmHWM KiB], ...]}.
    Without a launcher the child is spawned from this process (only for the self-test's contrast)."""
    argv = [sys.executable, "-c", CHILD, mode, model, memory, prompt, str(n_ctx), str(HERE)]
    if launcher is not None:
        return launcher.run(argv)
    out = subprocess.run(argv, capture_output=True, text=True, check=True)
    return json.loads(out.stdout.strip().splitlines()[-1])


def own_vmhwm_kib() -> int:
    with open("/proc/self/status") as fh:
        for line in fh:
            if line.startswith("VmHWM:"):
                return int(line.split()[1])
    raise RuntimeError("no VmHWM in /proc/self/status")


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--memory", help="memory directory to ask against (required unless --self-test)")
    ap.add_argument("--model", help="GGUF (default: the embedded Gemma-3-270M)")
    ap.add_argument("--prompt", default="I was charged twice for the same coffee, can I get my money back?")
    ap.add_argument("--n-ctx", type=int, default=4096, help="context of ask and of both baselines (default: 4096, "
                    "the engine's default)")
    ap.add_argument("--reps", type=int, default=3, help="children per mode; the median peak is reported")
    ap.add_argument("--self-test", action="store_true", help="show that a small child next to a big parent "
                    "reports a small peak (and what ru_maxrss would have said)")
    ap.add_argument("--self-test-mib", type=int, default=512)
    add_target_argument(ap, targets())
    args = ap.parse_args(argv)
    goals = Targets.from_args(targets(), args.target, ap)

    launcher = Launcher()  # before anything large is imported or allocated
    print_header(argv)
    try:
        if args.self_test:
            import resource

            import numpy as np

            big = np.ones(args.self_test_mib * 2**20 // 8)
            idle = measure(launcher, "idle")["vmhwm_kib"]
            idle_direct = measure(None, "idle")["vmhwm_kib"]
            print(f"parent VmHWM {own_vmhwm_kib() / 1024:.0f} MiB (holds {big.nbytes >> 20} MiB); idle child: "
                  f"VmHWM via launcher {idle / 1024:.0f} MiB, VmHWM spawned directly {idle_direct / 1024:.0f} MiB; "
                  f"ru_maxrss of children {resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss / 1024:.0f} MiB")
            return 0
        if not args.memory:
            ap.error("--memory is required")
        from miita_edge.runtime.default_model import resolve_model_path

        model = str(resolve_model_path(args.model))
        rows = {}
        for mode in ("plain", "plain-repack", "llama", "ask"):
            runs = [measure(launcher, mode, model, args.memory, args.prompt, args.n_ctx) for _ in range(args.reps)]
            peaks = sorted(r["vmhwm_kib"] for r in runs)
            rows[mode] = (statistics.median(peaks), runs[0]["stages"], peaks)
        print(f"# model={Path(model).name}  memory={args.memory}  n_ctx={args.n_ctx}  "
              f"reps={args.reps}  (VmHWM of each child, spawned from a bare launcher)")
        for mode, (peak, stages, peaks) in rows.items():
            trail = "  ".join(f"{n} {rss / 1024:.0f}" for n, rss, _ in stages)
            print(f"  {mode:12s} peak {peak / 1024:6.1f} MiB  (runs: {', '.join(f'{p / 1024:.1f}' for p in peaks)})"
                  f"   RSS after each stage, MiB: {trail}")
        r_plain = rows["ask"][0] / rows["plain"][0]
        r_llama = rows["ask"][0] / rows["llama"][0]
        r_repack = rows["ask"][0] / rows["plain-repack"][0]
        print(f"  ask / plain (low-level) {r_plain:.3f}  ({goals.check('ask_plain', r_plain)})")
        print(f"  ask / plain with llama.cpp's repacked weights (use_extra_bufts, as the engine loads them) "
              f"{r_repack:.3f}")
        print(f"  ask / Llama (high-level) {r_llama:.3f}")
        print(goals.summary())
        return 1 if goals.missed else 0
    finally:
        launcher.close()


if __name__ == "__main__":
    sys.exit(main())
