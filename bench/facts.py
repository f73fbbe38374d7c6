"""Personal facts taught once: does one taught example answer its question asked otherwise, and
never with another fact's answer? (docs/evaluation.md, "Personal facts: teach once")

For each model and mode, a fresh memory (the model's default template, budget none) learns the
split's facts of ``evaluation/data/facts.json``: ``once`` the first teaching phrasing of each fact,
``twice`` both. Then every query of ``evaluation.facts.queries`` is asked (greedy, 16 new tokens):
the taught phrasings as taught, and the unseen ones: their case/punctuation/spacing forms, the
three paraphrases as written and the paraphrases' forms. Each answer is RIGHT (starts with the
taught answer, after normalising case, whitespace and trailing punctuation), OTHER (another taught
fact's answer), FROZEN (the memory did not steer, or the reply is the frozen model's word for
word) or WRONG (steered, none of the taught answers). The split's unrelated questions are asked
too: the share answered exactly as the frozen model answers them; and the questions of facts a
memory was not taught (each half of the split taught alone, asked the other half's paraphrases):
how many get a taught answer, which is always another fact's. An answer the memory did not
steer is the frozen model's (the same greedy pass), so the frozen model is asked only where the
memory steered.

Baseline, "notes in the prompt": the frozen model (``adapt=False``) asked each paraphrase after
all the mode's taught pairs written as notes (``Notes:\\nQ: ... A: ...\\nQuestion: ...``).

Targets (the product's goal; meant for the test split, printed for any): taught once >= 70% right
on unseen queries, taught twice >= 90%, another fact's answer <= 2% of unseen queries in every
mode, unrelated questions answered as the frozen model >= 95% in every mode.

    python bench/facts.py [--model GGUF]... [--split dev|test] [--modes once,twice] [--notes once,twice|none]
                          [--limit N] [--data FILE] [--show 5] [--threads N] [--target NAME=LIMIT]...
"""
from __future__ import annotations

import argparse
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path

from _report import Target, parse_with_targets, preset_for

MODES = {"once": 1, "twice": 2}
KIND_NAMES = {"taught": "as taught (not unseen)", "form": "forms of the taught phrasing",
              "paraphrase": "paraphrases as written", "paraphrase_form": "forms of the paraphrases"}
UNSEEN = ("form", "paraphrase", "paraphrase_form")
GEN = {"max_tokens": 16}


def pct(n: int, d: int) -> float:
    return 100.0 * n / d if d else 0.0


def line(name: str, tally: Counter) -> str:
    n = sum(tally.values())
    parts = ", ".join(f"{c.lower()} {tally[c]} ({pct(tally[c], n):.1f}%)" for c in ("OTHER", "FROZEN", "WRONG"))
    return f"  {name:34s} right {tally['RIGHT']}/{n} = {pct(tally['RIGHT'], n):5.1f}%; {parts}"


def run_mode(engine, fs, taught: int, show: int, ev, preset=None) -> dict:
    """One fresh memory taught ``taught`` phrasings of each fact; every query and unrelated question asked.
    ``preset``: the memory's preset (None: the default)."""
    from miita_edge import Example, Miita

    answers = [f.answer for f in fs.facts]
    by_kind: dict[str, Counter] = {k: Counter() for k in KIND_NAMES}
    shown: list[str] = []
    frozen: dict[str, str] = {}
    with tempfile.TemporaryDirectory() as tmp, Miita(memory=Path(tmp) / "mem", engine=engine, preset=preset) as m:
        t0 = time.perf_counter()
        rep = m.ingest([Example(t, f.answer) for f in fs.facts for t in f.teach[:taught]], budget="none")
        learn_s, t0 = time.perf_counter() - t0, time.perf_counter()

        def frozen_text(q: str) -> str:
            if q not in frozen:
                frozen[q] = m.ask(q, adapt=False, **GEN).text
            return frozen[q]

        for f in fs.facts:
            for q in ev.queries(f, taught):
                a = m.ask(q.text, **GEN)
                cls = ev.classify(a.text, f.answer, answers, adapted=a.adapted,
                                  frozen_text=frozen_text(q.text) if a.adapted else None)
                by_kind[q.kind][cls] += 1
                if cls in ("OTHER", "WRONG") and len(shown) < show:
                    shown.append(f"    {cls:5s} {q.kind:15s} {q.text!r} -> {a.text!r} (taught {f.answer!r})")
        touched, leaked = 0, 0
        for q in fs.unrelated:
            a = m.ask(q, **GEN)
            touched += a.adapted and a.text != frozen_text(q)
            leaked += any(ev.normalise(a.text).startswith(ev.normalise(x)) for x in answers)
        ask_s = time.perf_counter() - t0
        return {"by_kind": by_kind, "shown": shown, "touched": touched, "leaked": leaked,
                "examples": rep.examples, "prototypes": rep.prototypes, "template": m.template.name,
                "learn_s": learn_s, "ask_s": ask_s}


def run_untaught(engine, fs, taught: int, ev, preset=None) -> Counter:
    """Questions of facts the memory was not taught: the split's facts in two halves (even and odd
    positions), each half's memory asked the other half's paraphrases as written. A steered answer
    that is one of the memory's taught answers is OTHER: the wrong memory answering."""
    from miita_edge import Example, Miita

    tally: Counter = Counter()
    halves = (fs.facts[0::2], fs.facts[1::2])
    for taught_half, asked_half in (halves, halves[::-1]):
        answers = [f.answer for f in taught_half]
        with tempfile.TemporaryDirectory() as tmp, Miita(memory=Path(tmp) / "mem", engine=engine,
                                                         preset=preset) as m:
            m.ingest([Example(t, f.answer) for f in taught_half for t in f.teach[:taught]], budget="none")
            for f in asked_half:
                for p in f.ask:
                    a = m.ask(p, **GEN)
                    frozen = m.ask(p, adapt=False, **GEN).text if a.adapted else None
                    tally[ev.classify(a.text, f.answer, answers, adapted=a.adapted, frozen_text=frozen)] += 1
    return tally


def run_notes(engine, fs, taught: int, ev) -> Counter:
    """The frozen model with every taught pair of the mode as notes before each paraphrase."""
    from miita_edge import Miita

    pairs = [(t, f.answer) for f in fs.facts for t in f.teach[:taught]]
    answers = [f.answer for f in fs.facts]
    tally: Counter = Counter()
    with tempfile.TemporaryDirectory() as tmp, Miita(memory=Path(tmp) / "mem", engine=engine) as m:
        for f in fs.facts:
            for p in f.ask:
                a = m.ask(ev.notes_prompt(pairs, p), adapt=False, **GEN)
                tally[ev.classify(a.text, f.answer, answers, frozen_text=None)] += 1
    return tally


def report_mode(mode: str, res: dict, fs, targets) -> None:
    unseen = sum((res["by_kind"][k] for k in UNSEEN), Counter())
    n_unseen, n_unrel = sum(unseen.values()), len(fs.unrelated)
    print(f" taught {mode}: {res['examples']} examples -> {res['prototypes']} prototypes, template "
          f"{res['template']}; learn {res['learn_s']:.1f} s, asks {res['ask_s']:.0f} s")
    for kind, name in KIND_NAMES.items():
        print(line(name, res["by_kind"][kind]))
    print(line("unseen, together", unseen))
    right = pct(unseen["RIGHT"], n_unseen)
    print(f"  right on unseen queries: {right:.1f}%  {targets.check(f'{mode}_right', right)}")
    other = pct(unseen["OTHER"], n_unseen)
    print(f"  another fact's answer on unseen queries: {other:.1f}%  {targets.check('other', other)}")
    untouched = pct(n_unrel - res["touched"], n_unrel)
    print(f"  unrelated questions answered as the frozen model: {n_unrel - res['touched']}/{n_unrel} = "
          f"{untouched:.1f}% ({res['leaked']} answered with a taught answer)  {targets.check('untouched', untouched)}")
    for s in res["shown"]:
        print(s)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", action="append", default=None,
                    help="GGUF path; repeatable (default: the embedded Gemma-3-270M)")
    ap.add_argument("--split", choices=("dev", "test"), default="dev",
                    help="facts and unrelated questions at even (dev) or odd (test) positions of the file")
    ap.add_argument("--modes", default="once,twice", help="comma list of once, twice")
    ap.add_argument("--notes", default="once,twice",
                    help="modes whose taught pairs the notes-in-the-prompt baseline reads (comma list), or none")
    ap.add_argument("--limit", type=int, default=0, help="only the split's first N facts and 2N unrelated questions (0: all)")
    ap.add_argument("--data", type=Path, default=None, help="facts file (default: the package's facts.json)")
    ap.add_argument("--show", type=int, default=5, help="OTHER/WRONG answers printed per mode")
    ap.add_argument("--threads", type=int, default=0, help="llama.cpp threads (default: all cores)")
    ap.add_argument("--with", dest="candidate", metavar="CANDIDATE", help="the default with a candidate mechanism "
                    "switched on (evaluation/ablation.py CANDIDATES), as a memory's preset")
    wanted = [Target("once_right", ">=", 70.0, "%", "taught once: right on unseen queries"),
              Target("twice_right", ">=", 90.0, "%", "taught twice: right on unseen queries"),
              Target("other", "<=", 2.0, "%", "another fact's answer on unseen queries, every mode"),
              Target("untouched", ">=", 95.0, "%", "unrelated questions answered as the frozen model, every mode")]
    args, targets = parse_with_targets(ap, wanted)
    modes = [m for m in args.modes.split(",") if m]
    notes = [] if args.notes == "none" else [m for m in args.notes.split(",") if m]
    bad = [m for m in modes + notes if m not in MODES]
    if bad or not (modes or notes):  # the notes baseline may run alone (--modes '' --notes once)
        ap.error(f"unknown mode {bad[0] if bad else '(none)'!r}; expected once, twice")

    from miita_edge.evaluation import facts as ev
    from miita_edge.evaluation.facts import FactSet
    from miita_edge.runtime.engine import Engine, EngineConfig

    preset = preset_for("facts.py", args.candidate)
    fs = ev.load_facts(args.data, args.split)
    if args.limit > 0:
        fs = FactSet(fs.facts[: args.limit], fs.unrelated[: 2 * args.limit])
    print(f"# {args.split} split ({ev.SPLIT_RULE}): {len(fs.facts)} facts, {len(fs.unrelated)} unrelated questions")
    for model in args.model or [None]:
        name = Path(model).name if model else "embedded Gemma-3-270M"
        engine = Engine(model, EngineConfig(n_threads=args.threads, stop_after_text=True))
        try:
            print(f"{name}:", flush=True)
            if args.candidate:
                print(f"  the default with {args.candidate}", flush=True)
            for mode in modes:
                report_mode(mode, run_mode(engine, fs, MODES[mode], args.show, ev, preset), fs, targets)
                t0 = time.perf_counter()
                tally = run_untaught(engine, fs, MODES[mode], ev, preset)
                n = sum(tally.values())
                print(f"  untaught questions (each half's memory asked the other half's paraphrases): another "
                      f"fact's answer {tally['OTHER']}/{n} = {pct(tally['OTHER'], n):.1f}%, frozen {tally['FROZEN']}, "
                      f"wrong {tally['WRONG']} ({time.perf_counter() - t0:.0f} s)", flush=True)
            for mode in notes:
                t0 = time.perf_counter()
                tally = run_notes(engine, fs, MODES[mode], ev)
                print(line(f"notes in the prompt ({mode}): paraphrases", tally) +
                      f"  ({time.perf_counter() - t0:.0f} s)", flush=True)
        finally:
            engine.close()
    print(targets.summary())
    return 0


if __name__ == "__main__":
    sys.exit(main())
