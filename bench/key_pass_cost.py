"""What one key-only pass costs per prompt row, and the most any one-prompt, bitwise ingest can gain.

Issue 15 asks default-preset ingest for >= 2x the pre-issue rate. Ingest is one key-only pass per
example (cProfile: ~95% of an ingest of the demo stream is ``llama_decode``), so its rate is set by
what such a pass costs as a function of the prompt's length n. This script times passes over one
text cut to n = 4..40 tokens and fits t(n) = a + b*n (ms) for:

* ``full depth``: every layer, the KV buffers zeroed at each reset, as the pre-issue code decoded
  (its stand-in in bench/memory.py; bench/ingest_baseline.py shows it runs at that code's own rate);
* each ``--presets`` entry: a key-only pass stopping after that preset's deepest key layer, one
  prompt per decode (keys bitwise the ones ``ask`` computes).

Then, at the mean prompt length of the stream (the demo stream under its ``plain`` template by
default, or ``--data``/``--template``), it prints each preset's ratio as measured and its ceiling:
the ratio if the pass's whole intercept ``a`` vanished and only the per-row cost ``b*n`` remained.
A one-prompt pass cannot go below its per-row cost without computing fewer rows or layers, which
would change the key; decoding several prompts at once (batched keys) shares ``a`` between them
but is not bitwise (docs/benchmarks.md, seventh pass).

    python bench/key_pass_cost.py [--threads 2] [--reps 11] [--presets default,default/1]
                                  [--data ../shared/data/banking77/train.jsonl --template banking77]
"""
from __future__ import annotations

import argparse
import json
import statistics
import sys
import time

import numpy as np

TEXT = ("The quick brown fox jumps over the lazy dog while seven wizards quietly judge boxing matches "
        "at dawn; meanwhile the harbour lights flicker and a tired sailor counts the waves. ")
LENGTHS = (4, 8, 12, 16, 20, 24, 28, 32, 40)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--reps", type=int, default=11, help="timed passes per length (median)")
    ap.add_argument("--presets", default="default,default/1", help="key-only presets to time")
    ap.add_argument("--data", default=None, help="JSONL stream whose prompt lengths to use (default: the demo's)")
    ap.add_argument("--template", default="plain")
    args = ap.parse_args(argv)

    from miita_edge.demo.run import demo_stream
    from miita_edge.method.presets import get_preset
    from miita_edge.method.templates import get_template
    from miita_edge.runtime.engine import Engine, EngineConfig

    eng = Engine(None, EngineConfig(n_threads=args.threads, key_prefix_cache=False))
    tpl = get_template(args.template)
    if args.data:
        with open(args.data, encoding="utf-8") as f:
            inputs = [json.loads(line)["input"] for _, line in zip(range(500), f)]
    else:
        inputs = [e.input for e in demo_stream()[0]]
    lens = [len(eng.tokenize(tpl.render_prompt(x))) for x in inputs]
    n_bar = statistics.fmean(lens)
    base = eng.tokenize(TEXT * 3, add_bos=True)

    def timed(full_depth: bool) -> tuple[float, float, list[float]]:
        # full depth: the pre-issue pass, which also zeroed the KV buffers at each reset
        eng.config.keys_stop_early, eng.config.clear_kv_data = not full_depth, full_depth
        ts = []
        for n in LENGTHS:
            toks, mask = base[:n], [True] * n
            for _ in range(2):
                eng.prompt_key(toks, mask)
            reps = []
            for _ in range(args.reps):
                t0 = time.perf_counter()
                eng.prompt_key(toks, mask)
                reps.append((time.perf_counter() - t0) * 1e3)
            ts.append(statistics.median(reps))
        eng.config.keys_stop_early, eng.config.clear_kv_data = True, False
        b, a = np.polyfit(LENGTHS, ts, 1)  # least squares t = a + b*n
        return float(a), float(b), ts

    print(f"# bench/key_pass_cost.py  threads={args.threads}, n = {LENGTHS[0]}..{LENGTHS[-1]} tokens, "
          f"medians of {args.reps}; stream: {len(lens)} prompts of {args.data or 'the demo stream'} "
          f"under template {args.template}, mean {n_bar:.1f} tokens")
    rows = []
    rows.append(("full depth (pre-issue)", eng.n_layer, *timed(True)))
    for name in args.presets.split(","):
        p = get_preset(name)
        layers = p.key_layers(eng.n_layer)
        eng.set_key_layers(layers, p.key_poolings(eng.n_layer))
        rows.append((f"{name} key-only (layers {','.join(map(str, layers))})", max(layers) + 1, *timed(False)))
    _, _, a0, b0, _ = rows[0]
    t_full = a0 + b0 * n_bar
    for label, depth, a, b, ts in rows:
        t = a + b * n_bar
        print(f"   {label:38s} {depth:2d} layers  t(n) = {a:5.2f} + {b:.3f} n ms  ({b / depth * 1e3:5.1f} us per row-layer)"
              f"  t({n_bar:.1f}) = {t:5.2f} ms   measured {t_full / t:4.2f}x   ceiling {t_full / (b * n_bar):4.2f}x")
        print(f"      {'':36s} times at n = {', '.join(f'{x:.1f}' for x in ts)}")
    print("   (ratios against full depth at the stream's mean length; ceiling: the pass's intercept removed)")
    eng.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
