"""Do long taught replies survive sampling? Teach canned replies (banking77-replies: one 25-36 token
support reply per intent, two Banking77 training utterances each), then ask each taught
utterance with temperature sampling (several seeds): whole replies that come back, and the Rouge-L
of each answer against its reply (a reply that slipped once and went on right scores near 100, one
that turned into other text after the slip does not), with
the default preset's recovery from a divergent token (version 6) and without it (version 5, where
the memory lets go of a reply at its first slip). Greedy answers are counted too, as the control:
the two versions must agree there.

    python bench/recovery.py [--intents 12] [--seeds 3] [--temperature 0.8] [--show 3]
                             [--data ../shared/data/banking77] [--versions 5,6]

``--versions A,B`` compares two other versions of the default preset the same way (11,12: the hold,
which replaces a sampled token outside the steering answers by the leading reply's).
"""
from __future__ import annotations

import argparse
import sys
import tempfile
from pathlib import Path

from _report import ROOT, Target, parse_with_targets


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", default=None, help="GGUF path (default: the embedded Gemma-3-270M)")
    ap.add_argument("--data", type=Path, default=ROOT.parent / "shared" / "data" / "banking77")
    ap.add_argument("--intents", type=int, default=12)
    ap.add_argument("--seeds", type=int, default=3)
    ap.add_argument("--temperature", type=float, default=0.8)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--show", type=int, default=3, help="misses printed per version")
    ap.add_argument("--versions", default="5,6", help="two versions of the default preset, before,after")
    wanted = [Target("gain", ">=", 0.0, " points", "Rouge-L under sampling, the second version minus the first")]
    args, targets = parse_with_targets(ap, wanted)

    from miita_edge import Miita
    from miita_edge.evaluation.benchmarks import get_benchmark, load_benchmark
    from miita_edge.evaluation.metrics import normalize_reply, rouge_l
    from miita_edge.method.presets import preset_version
    from miita_edge.runtime.engine import Engine, EngineConfig

    _, stages = load_benchmark(get_benchmark("banking77-replies"), args.data, stages="1")
    by_reply: dict[str, list] = {}
    for ex in stages[0].train:
        by_reply.setdefault(ex.output, []).append(ex)
    taught = [ex for exs in list(by_reply.values())[: args.intents] for ex in exs[:2]]
    engine = Engine(args.model, EngineConfig(n_threads=args.threads))
    rates = {}
    before, after = (int(v) for v in args.versions.split(","))
    for version in (before, after):
        with tempfile.TemporaryDirectory() as tmp, \
                Miita(engine=engine, memory=Path(tmp) / "m", preset=preset_version("default", version),
                      template="plain") as m:
            m.ingest(taught, budget="none", progress=False)
            greedy = sum(normalize_reply(m.ask(ex.input, max_tokens=80).text) == normalize_reply(ex.output)
                         for ex in taught)
            sampled, misses, rouge = 0, [], []
            for ex in taught:
                for s in range(1, args.seeds + 1):
                    got = m.ask(ex.input, max_tokens=80, temperature=args.temperature, seed=s).text
                    rouge.append(rouge_l(got, ex.output))
                    if normalize_reply(got) == normalize_reply(ex.output):
                        sampled += 1
                    else:
                        misses.append((ex.output, got))
        n_s = len(taught) * args.seeds
        rates[version] = 100.0 * sum(rouge) / len(rouge)
        print(f"default v{version}: greedy {greedy}/{len(taught)} whole replies; temperature {args.temperature}: "
              f"{sampled}/{n_s} = {100.0 * sampled / n_s:.1f}% whole, Rouge-L {rates[version]:.1f}")
        for want, got in misses[: args.show]:
            print(f"    taught {want[:60]!r}...\n      gave {got[:200]!r}")
    gain = rates[after] - rates[before]
    print(f"gain (v{after} - v{before}): {gain:+.1f} points  {targets.check('gain', gain)}")
    print(targets.summary())
    engine.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
