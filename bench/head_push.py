"""How much the head geometry's estimates depend on their three sampling constants: the covariance's
row stride (``COV_STRIDE``), the number of word tokens the push is measured on (``N_WORDS``) and the
percentile that makes the push (``PUSH_PERCENTILE``). No generation, no memory: the head's rows and
the 16 calibration states (docs/method.md §6.1-6.2).

Why: the direction d_y and the push G are derived from the model, but through estimates whose sizes
were set a priori. An estimate from a sample is as good as the full one when the full one is no
further from it than its own resampling noise; this prints both, so each size either stands on a
measurement or shows that it moves the method.

    python bench/head_push.py [--model GGUF] [--template plain]

Prints, per setting: G (the push, in logits), and for the stride the mean cosine between the
directions of the sampled and the full covariance over the word tokens; for the words the spread
of G over disjoint draws of N_WORDS words.
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _report import ROOT, print_header  # noqa: E402


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", help="GGUF path (default: the embedded Gemma-3-270M)")
    ap.add_argument("--template", default="plain")
    ap.add_argument("--draws", type=int, default=4, help="disjoint word draws of N_WORDS each")
    args = ap.parse_args(argv)
    print_header(argv)
    sys.path.insert(0, str(ROOT / "python"))
    from miita_edge.method import head_geometry as hg
    from miita_edge.method.templates import get_template
    from miita_edge.runtime.engine import Engine, EngineConfig

    engine = Engine(args.model, EngineConfig(n_threads=1))
    try:
        tpl = get_template(args.template)
        states = hg._states(engine, tpl)
        mult = engine.info.logit_mult
        words = hg.word_tokens(engine, hg.N_WORDS * args.draws)
        mu4, P4 = hg.head_statistics(engine)
        mu1, P1 = hg.head_statistics(engine, stride=1)

        def push(mu, P, toks, pct=hg.PUSH_PERCENTILE):
            s = hg.needed_steps(engine, mu, P, states, toks, mult)
            f = s[np.isfinite(s)]
            return float(np.percentile(f, pct)) if f.size else float("nan"), s

        shipped = words[:hg.N_WORDS]
        g4, s4 = push(mu4, P4, shipped)
        g1, _ = push(mu1, P1, shipped)
        geo4, geo1 = hg.HeadGeometry(mu4, P4, 1.0, mult), hg.HeadGeometry(mu1, P1, 1.0, mult)
        rows = engine.lm_head.rows(shipped).astype(np.float64)
        cos = [float(a @ b / (np.linalg.norm(a) * np.linalg.norm(b)))
               for a, b in ((geo4.direction(w), geo1.direction(w)) for w in rows)]
        print(f"model {engine.info.path.name}: vocabulary {engine.n_vocab}, width {engine.n_embd}")
        print("| setting | G (logits) | note |")
        print("|---|---|---|")
        print(f"| shipped: stride {hg.COV_STRIDE}, {hg.N_WORDS} words, {hg.PUSH_PERCENTILE:g}th percentile "
              f"| {g4:.3f} | |")
        print(f"| covariance of every row (stride 1) | {g1:.3f} | directions: mean cosine {np.mean(cos):.5f}, "
              f"least {np.min(cos):.5f} against stride {hg.COV_STRIDE} |")
        draws = [push(mu4, P4, words[i * hg.N_WORDS:(i + 1) * hg.N_WORDS])[0] for i in range(args.draws)]
        print(f"| {args.draws} disjoint draws of {hg.N_WORDS} words | {np.mean(draws):.3f} "
              f"(range {min(draws):.3f}–{max(draws):.3f}) | |")
        g_all, s_all = push(mu4, P4, words)
        print(f"| all {len(words)} words | {g_all:.3f} | |")
        for pct in (90.0, 95.0, 99.9, 100.0):
            f = s4[np.isfinite(s4)]
            print(f"| {pct:g}th percentile (shipped words) | {float(np.percentile(f, pct)):.3f} | |")
    finally:
        engine.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
