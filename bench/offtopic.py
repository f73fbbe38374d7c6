"""Does a memory leave alone what it has nothing to say about? For each benchmark, a memory of its
first stage (the first N training rows of stage 1, outside the dev rows, through the benchmark's
template, no budget), then each prompt of tests/data/offtopic.txt (202 general questions and
small talk that no benchmark answer fits) asked with and without the memory: the share answered
exactly as the frozen model answers it. Target: >= 95% on every benchmark and model.

``--answer-start text`` (the default) ends an answer at the newline only after its first non-blank
character, as ask, demo and serve do. ``newline`` ends it at any newline, the rule of the runs
recorded before 2026-11-30: a frozen and an adapted answer that both open with a newline are
then both "" and count as untouched whatever follows it. A ``text`` run also reports the
``newline`` figure, from the same answers cut at their first newline: decoding is greedy and the
push at a step depends only on the prefix, so that is what a ``newline`` run generates
(bench/answer_start.py makes the same recomputation for benchmark runs).

Each (model, benchmark) runs in a child process: llama.cpp cannot load a BPE vocabulary in a process
that has imported usearch (docs/models.md), and each child holds one model.

    python bench/offtopic.py [--model GGUF]... [--benchmarks banking77,dsc,xquad,superni]
                             [--rows 200] [--data ../shared/data] [--show 5] [--key-whitening default|none|paraphrase|replies]
                             [--answer-start text|newline] [--threads N] [--without MECHANISM]
"""
from __future__ import annotations

import argparse
import json
import subprocess
import sys
from pathlib import Path

from _report import ROOT, Target, parse_with_targets

OFFTOPIC = ROOT / "tests" / "data" / "offtopic.txt"
DATA_DIRS = {"banking77": "banking77", "dsc": "dsc", "xquad": "paxqa_substitute_xquad", "superni": "superni"}

CHILD = r"""
import json, sys, time
from pathlib import Path
from miita_edge import Example, Miita
from miita_edge.evaluation.benchmarks import get_benchmark, load_benchmark
from miita_edge.method.presets import default_preset
from miita_edge.runtime.engine import EngineConfig
from miita_edge.runtime.engine_types import stop_position
def at_newline(t):  # the answer the newline rule would have ended here
    p = stop_position(t, ["\n"], False)
    return t if p < 0 else t[:p]
model, bench, data, rows_n, off, mem, whitening, after_text, threads, without = (json.loads(a) for a in sys.argv[1:])
if without:
    from miita_edge.evaluation.ablation import without as switched_off
    preset = switched_off(without)
else:
    preset = default_preset()
if whitening != "default":
    preset.key_whitening = whitening
spec = get_benchmark(bench)
_, stages = load_benchmark(spec, data, stages="1")
stage = stages[0]
rows = stage.train[:rows_n]
qs = [ln.strip() for ln in Path(off).read_text("utf-8").splitlines() if ln.strip()]
t0 = time.perf_counter()
with Miita(model, mem, preset=preset, template=spec.template, max_prompt_tokens=spec.max_prompt_tokens or None,
           engine_config=EngineConfig(n_threads=threads, stop_after_text=after_text)) as m:
    m.ingest(rows, budget="none")
    changed, blank, nl_changed, nl_blank = [], 0, 0, 0
    for q in qs:
        a, f = m.ask(q, max_tokens=8), m.ask(q, max_tokens=8, adapt=False)
        blank += not f.text.strip()
        nl_blank += not at_newline(f.text).strip()
        nl_changed += at_newline(a.text) != at_newline(f.text)
        if a.text != f.text:
            changed.append({"q": q, "frozen": f.text, "adapted": a.text})
print(json.dumps({"stage": stage.name, "rows": len(rows), "n": len(qs), "changed": changed, "blank": blank,
                  "newline_rule": {"changed": nl_changed, "blank": nl_blank},
                  "key_whitened": m.key_whitened,
                  "seconds": time.perf_counter() - t0}))
"""


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", action="append", default=None,
                    help="GGUF path; repeatable (default: the embedded Gemma-3-270M)")
    ap.add_argument("--benchmarks", default="banking77,dsc,xquad,superni")
    ap.add_argument("--rows", type=int, default=200, help="training rows of stage 1 in the memory")
    ap.add_argument("--data", type=Path, default=ROOT.parent / "shared" / "data")
    ap.add_argument("--show", type=int, default=5, help="changed answers printed per run")
    ap.add_argument("--key-whitening", choices=("default", "none", "paraphrase", "replies"), default="default",
                    help="the default preset's key whitening (docs/method.md, 'Whitening, for a memory of replies'); "
                         "'default': the preset's own "
                         "('replies': whitened where the first ingest teaches long replies)")
    ap.add_argument("--answer-start", choices=("text", "newline"), default="text",
                    help="text: a newline ends an answer only after its first non-blank character (what "
                         "ask and serve do); newline: anywhere (the rule of runs before 2026-11-30)")
    ap.add_argument("--threads", type=int, default=0, help="llama.cpp threads (default: all cores)")
    ap.add_argument("--without", metavar="MECHANISM", help="the default with one mechanism switched off "
                    "(evaluation/ablation.py; the ablation's off-topic column)")
    wanted = [Target("untouched", ">=", 95.0, "%", "off-topic prompts answered as the frozen model, worst run")]
    args, targets = parse_with_targets(ap, wanted)
    import tempfile

    worst = 100.0
    for model in args.model or [None]:
        name = Path(model).name if model else "embedded Gemma-3-270M"
        for bench in args.benchmarks.split(","):
            with tempfile.TemporaryDirectory() as tmp:
                argv = [json.dumps(a) for a in (model, bench, str(args.data / DATA_DIRS[bench]), args.rows,
                                                 str(OFFTOPIC), str(Path(tmp) / "mem"), args.key_whitening,
                                                 args.answer_start == "text", args.threads, args.without)]
                proc = subprocess.run([sys.executable, "-c", CHILD, *argv], capture_output=True, text=True)
            if proc.returncode != 0:
                print(f"{name} {bench}: failed\n{proc.stderr[-2000:]}")
                return 1
            res = json.loads(proc.stdout.strip().splitlines()[-1])
            rate = 100.0 * (res["n"] - len(res["changed"])) / res["n"]
            worst = min(worst, rate)
            print(f"{name:32s} {bench:10s} stage {res['stage']} ({res['rows']} rows): "
                  f"{res['n'] - len(res['changed'])}/{res['n']} untouched = {rate:.1f}%; "
                  f"{res['blank']} frozen answers blank; keys {'' if res['key_whitened'] else 'not '}whitened  "
                  f"({res['seconds']:.0f} s)")
            if args.answer_start == "text":
                nl = res["newline_rule"]
                print(f"{'':32s} {'':10s} the same answers under the newline rule: "
                      f"{res['n'] - nl['changed']}/{res['n']} untouched = "
                      f"{100.0 * (res['n'] - nl['changed']) / res['n']:.1f}%; {nl['blank']} frozen answers blank")
            for c in res["changed"][: args.show]:
                print(f"    {c['q']!r}: frozen {c['frozen']!r} -> {c['adapted']!r}")
    print(f"worst (model, benchmark): {worst:.1f}%  {targets.check('untouched', worst)}")
    print(targets.summary())
    return 0


if __name__ == "__main__":
    sys.exit(main())
