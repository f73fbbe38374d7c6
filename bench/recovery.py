"""Does a mechanism of the default change answers under sampling? Dev rows, paired.

Teach stage 1 of a Banking77 stream (two training utterances for each of the first ``--intents``
answers: canned replies with ``--benchmark banking77-replies``, the intent labels with
``banking77``), then ask the *dev* rows of those intents with temperature sampling (several seeds),
once with the default and once with the default without ``--without`` (``evaluation/ablation.py``:
recovery, the hold, ...). Each (row, seed) is asked with the same seed by both, so the two are
paired: whole answers that come back, and the Rouge-L of each answer against its own (a reply that
slipped once and went on right scores near 100, one that turned into other text after the slip
does not), with paired bootstrap 95% intervals of the difference. Greedy answers are counted too.

Recovery (docs/method.md, "Steering") exists for sampling: the ablation's greedy runs cannot see it.
This is its dev-row measurement.

    python bench/recovery.py [--benchmark banking77-replies] [--without hold] [--intents 12]
                             [--seeds 3] [--temperature 0.8] [--model GGUF] [--data ../shared/data/banking77]
"""
from __future__ import annotations

import argparse
import sys
import tempfile
from pathlib import Path

import numpy as np

from _report import ROOT, Target, parse_with_targets
from paired_diff import paired_interval


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", default=None, help="GGUF path (default: the embedded Gemma-3-270M)")
    ap.add_argument("--data", type=Path, default=ROOT.parent / "shared" / "data" / "banking77")
    ap.add_argument("--benchmark", default="banking77-replies", choices=("banking77-replies", "banking77"))
    ap.add_argument("--without", default="hold", help="the mechanism switched off (evaluation/ablation.py)")
    ap.add_argument("--intents", type=int, default=12)
    ap.add_argument("--seeds", type=int, default=3)
    ap.add_argument("--temperature", type=float, default=0.8)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--show", type=int, default=3, help="answers printed where the two differ")
    ap.add_argument("--boot", type=int, default=10_000)
    wanted = [Target("gain", ">=", 0.0, " points", "Rouge-L under sampling, the default minus the default without")]
    args, targets = parse_with_targets(ap, wanted)

    from miita_edge import Miita
    from miita_edge.evaluation.ablation import without
    from miita_edge.evaluation.benchmarks import get_benchmark, load_benchmark
    from miita_edge.evaluation.metrics import normalize_reply, rouge_l
    from miita_edge.method.presets import default_preset
    from miita_edge.runtime.engine import Engine, EngineConfig

    spec = get_benchmark(args.benchmark)
    _, taught_stage = load_benchmark(spec, args.data, stages="1")
    _, dev_stage = load_benchmark(spec, args.data, stages="1", split="dev")
    by_answer: dict[str, list] = {}
    for ex in taught_stage[0].train:
        by_answer.setdefault(ex.output, []).append(ex)
    answers = list(by_answer)[: args.intents]
    taught = [ex for a in answers for ex in by_answer[a][:2]]
    asked = [it.example for it in dev_stage[0].test if it.example.output in set(answers)]
    if not asked:
        raise SystemExit(f"no dev row of stage 1 has one of the first {args.intents} answers")
    print(f"# {args.benchmark}: {len(taught)} training rows taught ({len(answers)} answers), "
          f"{len(asked)} dev rows asked x {args.seeds} seeds at temperature {args.temperature}")
    engine = Engine(args.model, EngineConfig(n_threads=args.threads))
    scores: dict[str, dict[str, np.ndarray]] = {}
    texts: dict[str, list[str]] = {}
    for name, preset in (("default", default_preset()), (f"without {args.without}", without(args.without))):
        with tempfile.TemporaryDirectory() as tmp, \
                Miita(engine=engine, memory=Path(tmp) / "m", preset=preset, template=spec.template) as m:
            m.ingest(taught, budget="none", progress=False)
            greedy = np.array([normalize_reply(m.ask(ex.input, max_tokens=80).text) == normalize_reply(ex.output)
                               for ex in asked], float)
            whole, rouge, got_all = [], [], []
            for ex in asked:
                for s in range(1, args.seeds + 1):
                    got = m.ask(ex.input, max_tokens=80, temperature=args.temperature, seed=s).text
                    got_all.append(got)
                    rouge.append(rouge_l(got, ex.output))
                    whole.append(float(normalize_reply(got) == normalize_reply(ex.output)))
        scores[name] = {"greedy": greedy, "whole": np.array(whole), "rouge": np.array(rouge)}
        texts[name] = got_all
        print(f"{name:>22}: greedy {100 * greedy.mean():5.1f}% whole; sampled {100 * np.mean(whole):5.1f}% whole, "
              f"Rouge-L {100 * np.mean(rouge):5.1f}")
    a, b = scores.values()
    names = list(scores)
    for what in ("greedy", "whole", "rouge"):
        mean, lo, hi = paired_interval(b[what], a[what], args.boot)
        print(f"{what:>6}: default minus {names[1]}: {mean:+.1f} [{lo:+.1f}, {hi:+.1f}] points (paired, 95%)")
    differ = [i for i, (x, y) in enumerate(zip(*texts.values())) if x != y]
    print(f"sampled answers that differ: {len(differ)} of {len(texts[names[0]])}")
    for i in differ[: args.show]:
        print(f"    default: {texts[names[0]][i][:160]!r}\n    without: {texts[names[1]][i][:160]!r}")
    gain = 100.0 * (a["rouge"].mean() - b["rouge"].mean())
    print(f"gain (Rouge-L): {gain:+.1f} points  {targets.check('gain', gain)}")
    print(targets.summary())
    engine.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
