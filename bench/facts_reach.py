"""Does an answer taught once reach its question's other forms when the answer is a reply?

The personal facts (``bench/facts.py``) teach short answers ("tulip-4821"), so their memory keeps
plain keys. A correction made in a chat is usually a reply of a sentence or two, and a memory
whose first answers are replies whitens its keys (docs/method.md §2.5). This teaches the facts'
dev half once in three ways and asks every unseen form and paraphrase, reading only the relevance
gate and the vote (``Miita.plan``, ``steering.vote``; no generation, so it takes minutes):

* ``labels``: each fact's answer as it is (the memory does not whiten);
* ``replies``: each answer inside a reply of about 20 tokens, ``REPLY`` (the memory whitens, as
  the default decides for replies);
* ``replies-unwhitened``: the same replies in a memory that keeps plain keys
  (``key_whitening = "none"``);
* ``replies-heldout-reach``: the same replies, whitened, with the reach measured on paraphrase
  groups the whitening was not fitted on (``single_reach = "paraphrase-heldout"``).

Per query kind: steered to its own fact's answer, to another fact's, or left to the frozen model
(the paraphrases' forms also by how each was typed: ``evaluation.facts.FORM_NAMES``); and the
unrelated questions some answer would steer. ``--margins`` adds, per mode, what a rule
that also abstains when the nearest two answers' best cosines differ by less than a margin would
give on the unseen queries (an exact repeat still steers): the trade between answers lost and
another fact's answers avoided.

``--taught twice`` teaches both phrasings of each fact (the second's forms are then asked too);
``--with CANDIDATE`` runs every mode with a candidate of ``evaluation/ablation.py`` switched on.
``--untaught`` asks, instead, the questions ``bench/facts.py`` calls untaught: the facts in two halves
(even and odd positions), each half taught alone and asked the other half's paraphrases as written;
every one steered is the wrong memory answering.

    python bench/facts_reach.py [--model GGUF] [--split dev] [--threads 1] [--margins 0.02,0.05,0.1]
           [--taught once|twice] [--with CANDIDATE] [--untaught]

The facts' dev half is for choosing; this reads nothing else.
"""
from __future__ import annotations

import argparse
import dataclasses
import sys
import tempfile
from collections import Counter
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
REPLY = "Thanks for asking! As you told me before, the answer is {answer}. Let me know if that ever changes."


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", default=None)
    ap.add_argument("--split", default="dev", choices=("dev",))
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--modes", default="labels,replies,replies-unwhitened,replies-heldout-reach")
    ap.add_argument("--margins", default="", help="comma list of margins between the nearest two answers")
    ap.add_argument("--taught", choices=("once", "twice"), default="once")
    ap.add_argument("--with", dest="candidate", default=None, help="a candidate mechanism switched on in every mode")
    ap.add_argument("--untaught", action="store_true", help="ask each half's memory the other half's paraphrases")
    args = ap.parse_args(argv)
    sys.path.insert(0, str(ROOT / "python"))
    from miita_edge import Example, Miita
    from miita_edge.evaluation.facts import FORM_NAMES, load_facts, named_variants, queries
    import numpy as np

    from miita_edge.method.plan import anchor_best, query_key
    from miita_edge.method.presets import default_preset
    from miita_edge.method.steering import vote
    from miita_edge.runtime.engine import Engine, EngineConfig

    fs = load_facts(split=args.split)
    engine = Engine(args.model, EngineConfig(n_threads=args.threads))
    print(f"# facts {args.split} half: {len(fs.facts)} facts taught {args.taught}"
          f"{', with ' + args.candidate if args.candidate else ''}, {len(fs.unrelated)} unrelated questions; "
          f"model {Path(args.model).name if args.model else 'embedded Gemma-3-270M'}; reply form: {REPLY!r}")
    from miita_edge.evaluation.ablation import with_candidate

    times = 2 if args.taught == "twice" else 1
    for mode in args.modes.split(","):
        preset = with_candidate(args.candidate) if args.candidate else default_preset()
        if mode == "replies-unwhitened":
            preset = dataclasses.replace(preset, key_whitening="none")
        if mode == "replies-heldout-reach":
            preset = dataclasses.replace(preset, single_reach="paraphrase-heldout")
        answer_of = {f.id: (f.answer if mode == "labels" else REPLY.format(answer=f.answer)) for f in fs.facts}
        if args.untaught:
            untaught(engine, preset, fs, answer_of, times, mode)
            continue
        with tempfile.TemporaryDirectory() as d, Miita(memory=Path(d) / "m", preset=preset, engine=engine,
                                                       template="auto") as m:
            m.ingest([Example(t, answer_of[f.id]) for f in fs.facts for t in f.teach[:times]], budget="none")
            labels = [m.keyed_engine().detokenize(t).strip() for t in m.bank.answer_tokens()]

            gaps: list[tuple[float, bool, bool]] = []  # (nearest two answers' gap, steered, right) per unseen query

            def steer(text: str) -> tuple[str | None, float]:
                """The answer the memory steers to (None: the frozen model) and the gap between the
                best cosines of the query's nearest two answers (inf: an exact repeat or one answer)."""
                state = m.query_state(text)
                qp = m.plan(state)
                index = m.pipeline.index(m.bank, None)
                best = np.sort(anchor_best(index, query_key(m.preset, m.bank, index, state),
                                           np.arange(m.bank.n_prototypes)))[::-1]
                gap = np.inf if len(best) < 2 or best[0] >= 1 - 1e-6 else float(best[0] - best[1])
                if qp.gate is not None and not qp.gate.adapted:
                    return None, gap
                return vote(qp.ids, qp.weights, labels) or None, gap

            counts: dict[str, Counter] = {}
            by_form: dict[str, Counter] = {}  # the paraphrases' forms, by how each was typed
            for f in fs.facts:
                form_of = {v: name for p in f.ask for name, v in named_variants(p)}
                for q in queries(f, times):
                    got, gap = steer(q.text)
                    outcome = "frozen" if got is None else "right" if got == answer_of[f.id].strip() else "other"
                    for c in [counts.setdefault(q.kind, Counter())] + (
                            [by_form.setdefault(form_of[q.text], Counter())] if q.kind == "paraphrase_form" else []):
                        c["n"] += 1
                        c[outcome] += 1
                    if q.kind != "taught":
                        gaps.append((gap, got is not None, got == answer_of[f.id].strip()))
            off = sum(steer(q)[0] is not None for q in fs.unrelated)
            print(f"\n{mode}: whitened {m.key_whitened}, template {m.template.name}")
            print("| query kind | n | own answer | another's | frozen |")
            print("|---|---|---|---|---|")
            for kind, c in counts.items():
                n = c["n"]
                print(f"| {kind} | {n} | {100 * c['right'] / n:.1f}% | {100 * c['other'] / n:.1f}% | "
                      f"{100 * c['frozen'] / n:.1f}% |")
            print("| paraphrase form | n | own answer | another's | frozen |")
            print("|---|---|---|---|---|")
            for name in FORM_NAMES:
                c = by_form.get(name)
                if c:
                    print(f"| {name} | {c['n']} | {100 * c['right'] / c['n']:.1f}% | "
                          f"{100 * c['other'] / c['n']:.1f}% | {100 * c['frozen'] / c['n']:.1f}% |")
            print(f"unrelated questions some answer would steer: {off} of {len(fs.unrelated)}", flush=True)
            for margin in [float(x) for x in args.margins.split(",") if x]:
                kept = [(s, r) for g, s, r in gaps if s and g >= margin]
                right, other = sum(r for _, r in kept), sum(not r for _, r in kept)
                print(f"  abstaining below a gap of {margin:g}: unseen right {100 * right / len(gaps):.1f}%, "
                      f"another's {100 * other / len(gaps):.1f}% (of {len(gaps)})")
    engine.close()
    return 0


def untaught(engine, preset, fs, answer_of: dict, times: int, mode: str) -> None:
    """Each half of the facts taught alone (``times`` phrasings each), asked the other half's
    paraphrases as written: how many the gate lets steer (any steered answer is another fact's)."""
    from miita_edge import Example, Miita

    halves = (fs.facts[0::2], fs.facts[1::2])
    steered, asked = 0, 0
    for taught_half, asked_half in (halves, halves[::-1]):
        with tempfile.TemporaryDirectory() as d, Miita(memory=Path(d) / "m", preset=preset, engine=engine,
                                                       template="auto") as m:
            m.ingest([Example(t, answer_of[f.id]) for f in taught_half for t in f.teach[:times]], budget="none")
            for f in asked_half:
                for p in f.ask:
                    qp = m.plan(m.query_state(p))
                    steered += qp.gate is None or qp.gate.adapted
                    asked += 1
    print(f"\n{mode}: untaught questions (each half's memory asked the other half's paraphrases) steered to "
          f"another fact's answer: {steered} of {asked} ({100 * steered / asked:.1f}%)", flush=True)


if __name__ == "__main__":
    sys.exit(main())
