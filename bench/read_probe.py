"""What the model's reading sees on the personal facts, and what another rule over the same readings would do.

Under the default (docs/method.md §5, version 19 and on) an answer that keeps its taught inputs is trusted
by the model's reading: where it is the nearest retrieved answer, the query is read after its taught
question, after the next nearest answers' questions (up to ``VERIFY_TOP`` in all) and after a neutral
question, and it steers where its question makes the query ``READ_REACH`` nats likelier than the
neutral one and ``VERIFY_MARGIN`` likelier than every other. This records, for every query the
reading decides, the compared answers (nearest first), their scores, the neutral score and which
pass the general-question tests, over the facts' dev half taught once or twice:

* ``taught``: every fact's paraphrases as written, the facts taught;
* ``untaught``: each half of the facts taught alone and asked the other half's paraphrases (any
  answer steered is another fact's);
* ``unrelated``: the unrelated questions, every fact taught.

and prints (1) where the right answer stands among the compared answers and which of the reading's
two tests it passes: the ceiling of any rule that reads these scores; (2) the outcome (right /
another fact's / frozen) under the default's rule (``nearest``) and under ``choose``: the compared
answer whose question makes the query likeliest steers where it passes the same two tests and the
general-question tests, not only the nearest (docs/tried.md). The rules are applied to the recorded
numbers, so the two are paired on one set of readings. ``--grid`` prints the default's rule at other
thresholds and margins over the same readings (the trade between right answers and untaught questions
answered). ``--json FILE`` keeps the readings, or reads them again where FILE exists. ``--reverse``
also reads each compared answer's taught input after the query (and after the neutral question), and
prints how well each score family of ``FAMILIES`` (the default's forward reading, the reverse one,
their sum, ...) trades right answers against another fact's, each at its best threshold and margin
over the same rows.

    python bench/read_probe.py [--model GGUF] [--taught once|twice] [--threads 1] [--json FILE]
           [--grid THRESHOLDS:MARGINS] [--reverse]

Reads the facts' dev half only.
"""
from __future__ import annotations

import argparse
import dataclasses
import gzip
import json
import sys
import tempfile
from collections import Counter
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def nearest(r: dict, threshold: float, margin: float):
    """The default's rule (``verify.read_confirmed``) on recorded readings: the nearest answer, or None."""
    from miita_edge.method.verify import read_confirmed

    return r["compared"][0] if read_confirmed(r["scores"], r["neutral"], threshold, margin) else None


def choose(r: dict, threshold: float, margin: float):
    """The likeliest compared answer (ties: the nearer) where it passes the general-question tests
    and the default's rule in the nearest answer's place; else None."""
    from miita_edge.method.verify import read_confirmed

    s = r["scores"]
    w = max(range(len(s)), key=lambda i: (s[i], -i))
    ok = r["relevant"][w] and read_confirmed([s[w]] + s[:w] + s[w + 1:], r["neutral"], threshold, margin)
    return r["compared"][w] if ok else None


def general_tests(index, k_q, ids):
    """Which retrieved prototypes pass the gate's general-question tests (their null and the query's
    bar), as ``plan._relevance`` computes them for sign-bit queries (the default's ``gate_query``)."""
    import numpy as np

    from miita_edge.method.plan import anchor_best
    from miita_edge.method.relevance import nearest_margin

    K = index.key_dim
    floor = -np.inf
    if index.generic_packed is not None:
        floor = nearest_margin(np.packbits(np.asarray(k_q)[:K] >= 0), index.generic_packed, K)
    z = np.maximum(np.asarray(index.null, np.float64)[ids], floor) if index.null is not None else np.full(len(ids), floor)
    return anchor_best(index, k_q, ids) > z


def record(args) -> list[dict]:
    sys.path.insert(0, str(ROOT / "python"))
    import numpy as np

    from miita_edge import Example, Miita
    from miita_edge.evaluation.facts import load_facts
    from miita_edge.method import plan as plan_mod
    from miita_edge.method.relevance import GateDecision
    from miita_edge.method.presets import default_preset
    from miita_edge.method.verify import READ_NEUTRAL
    from miita_edge.runtime.engine import Engine, EngineConfig

    fs = load_facts(split="dev")
    if args.limit:
        fs = dataclasses.replace(fs, facts=fs.facts[:args.limit], unrelated=fs.unrelated[:2 * args.limit])
    times = 2 if args.taught == "twice" else 1
    engine = Engine(args.model, EngineConfig(n_threads=args.threads))
    seen: dict = {}

    def spy(decision, index, eng, k_q, ids, text, threshold):
        """What the default's reading compares, recorded; nothing steers (the rules above score the
        numbers), so each reading is made once."""
        lead = int(ids[decision.read_lead])
        compared = plan_mod._compared(index, k_q, ids, lead)
        q = plan_mod.folded_text(text)
        pos = {int(j): i for i, j in enumerate(ids.tolist())}
        ok = general_tests(index, k_q, ids)
        seen.update(compared=[int(index.answer_id()[j]) for j in compared],
                    neutral=plan_mod.query_logprob(eng, READ_NEUTRAL, q),
                    relevant=[bool(ok[pos[j]]) for j in compared])
        if not args.reverse:
            seen["scores"] = [plan_mod._reading(eng, index.evidence[j], q) for j in compared]
        else:  # each input read both ways: the query after it, and it after the query
            ins = [[eng.detokenize(x) for x in plan_mod.evidence_inputs(index.evidence[j])] for j in compared]
            fwd = [[plan_mod.query_logprob(eng, t, q) for t in ts] for ts in ins]
            seen.update(scores=[max(f) for f in fwd], fwd_in=fwd,
                        rev_in=[[plan_mod.query_logprob(eng, q, t) for t in ts] for ts in ins],
                        rev_neutral_in=[[rev_neutral(eng, t) for t in ts] for ts in ins],
                        q_len=len(eng.tokenize(q, add_bos=False)),
                        in_len=[[len(eng.tokenize(t, add_bos=False)) for t in ts] for ts in ins])
        return GateDecision(np.zeros(len(ids), bool), "scored by bench/read_probe.py")

    neutral_of: dict = {}

    def rev_neutral(eng, t: str) -> float:
        """log P(input | VERIFY_PROMPT around the neutral question), once per input text."""
        if t not in neutral_of:
            neutral_of[t] = plan_mod.query_logprob(eng, READ_NEUTRAL, t)
        return neutral_of[t]

    plan_mod._read = spy
    rows: list[dict] = []

    def ask(taught, asked: list[tuple[str, str | None]], kind: str) -> None:
        with tempfile.TemporaryDirectory() as d, Miita(memory=Path(d) / "m", preset=default_preset(),
                                                       engine=engine, template="auto") as m:
            m.ingest([Example(t, f.answer) for f in taught for t in f.teach[:times]], budget="none")
            labels = [m.keyed_engine().detokenize(t).strip() for t in m.bank.answer_tokens()]
            for q, right in asked:
                seen.clear()
                qp = m.plan(m.query_state(q))
                r = {"kind": kind, "q": q, "right": right, "reason": qp.gate.reason if qp.gate is not None else None,
                     **seen}
                if "compared" in r:
                    r["compared"] = [labels[a] for a in r["compared"]]
                rows.append(r)

    ask(fs.facts, [(p, f.answer.strip()) for f in fs.facts for p in f.ask], "taught")
    halves = (fs.facts[0::2], fs.facts[1::2])
    for a, b in (halves, halves[::-1]):
        ask(a, [(p, None) for f in b for p in f.ask], "untaught")
    ask(fs.facts, [(q, None) for q in fs.unrelated], "unrelated")
    engine.close()
    return rows


def report(rows: list[dict], threshold: float, margin: float) -> None:
    taught = [r for r in rows if r["kind"] == "taught"]
    where = Counter()
    for r in taught:
        if "compared" not in r:
            where["not read (the gate's key tests closed)"] += 1
            continue
        if r["right"] not in r["compared"]:
            where["right answer not among the compared"] += 1
            continue
        i = r["compared"].index(r["right"])
        s, n = r["scores"], r["neutral"]
        over = s[i] - n >= threshold
        lead = all(s[i] - x >= margin for k, x in enumerate(s) if k != i)
        where[f"right answer compared {'first' if i == 0 else 'later'}; "
              f"{'passes' if over else 'fails'} the threshold, {'leads' if lead else 'does not lead'} by the margin"] += 1
    print(f"paraphrases as written, facts taught ({len(taught)}):")
    for k, v in sorted(where.items()):
        print(f"  {k}: {v}")
    print("| rule | kind | n | right | another's | frozen |")
    print("|---|---|---|---|---|---|")
    for rule in (nearest, choose):
        for kind in ("taught", "untaught", "unrelated"):
            c = Counter()
            for r in rows:
                if r["kind"] != kind:
                    continue
                got = rule(r, threshold, margin) if "compared" in r else None
                c["frozen" if got is None else "right" if got == r["right"] else "other"] += 1
            n = sum(c.values())
            print(f"| {rule.__name__} | {kind} | {n} | {c['right']} | {c['other']} | {c['frozen']} |")


def grid(rows: list[dict], thresholds: list[float], margins: list[float]) -> None:
    """The default's rule at other thresholds and margins, over the same readings: right and
    another fact's answers on the taught facts' paraphrases, and untaught questions answered."""
    print("| threshold (nats) | margin (nats) | right | another's | untaught answered |")
    print("|---|---|---|---|---|")
    for t in thresholds:
        for mg in margins:
            c = Counter()
            for r in rows:
                if r["kind"] == "unrelated" or "compared" not in r:
                    continue
                got = nearest(r, t, mg)
                if got is not None:
                    c[r["kind"] if r["kind"] == "untaught" else "right" if got == r["right"] else "other"] += 1
            print(f"| {t:g} | {mg:g} | {c['right']} | {c['other']} | {c['untaught']} |")


#: Scores of one compared answer from readings made both ways (``--reverse``), per taught input i:
#: a_i = log P(query | its input) - log P(query | the neutral question), the default's;
#: b_i = log P(input | the query) - log P(input | the neutral question), the same read the other way;
#: the answer's score is the best over its inputs. Per-token variants divide by the read text's tokens.
FAMILIES = {
    "forward": lambda a, b, nq, ni: a,
    "reverse": lambda a, b, nq, ni: b,
    "sum": lambda a, b, nq, ni: a + b,
    "min": lambda a, b, nq, ni: min(a, b),
    "forward/token": lambda a, b, nq, ni: a / nq,
    "sum/token": lambda a, b, nq, ni: a / nq + b / ni,
}


def family_scores(r: dict, fam) -> list[float]:
    n, nq = r["neutral"], max(r["q_len"], 1)
    return [max(fam(f - n, rv - rn, nq, max(ni, 1)) for f, rv, rn, ni in zip(fs, rs, rns, nis))
            for fs, rs, rns, nis in zip(r["fwd_in"], r["rev_in"], r["rev_neutral_in"], r["in_len"])]


def families(rows: list[dict], limits: list[int]) -> None:
    """Each score family's best trade over the same readings, in sample: for every threshold T (a
    quantile of the nearest answer's score on the taught paraphrases) and margin M (a share of the
    median such score), the default's rule in that family's units (the nearest answer steers where
    its score is at least T and leads every other compared answer's by M); printed, per family, the
    most right answers on the taught facts' paraphrases with at most W answered by another fact
    (on the taught ones, plus untaught questions answered). Every family has the same two free
    numbers chosen on the same rows, so the comparison is of the signals, not of the fit."""
    import numpy as np

    read = [r for r in rows if r["kind"] != "unrelated" and "fwd_in" in r]
    print("| family | " + " | ".join(f"right, wrong <= {w}" for w in limits) + " | at the best of the last: T, M, right / another's / untaught |")
    print("|---|" + "---|" * (len(limits) + 1))
    for name, fam in FAMILIES.items():
        sc = [family_scores(r, fam) for r in read]
        lead = np.array([x[0] for x, r in zip(sc, read) if r["kind"] == "taught"])
        scale = float(np.median(np.abs(lead))) or 1.0
        best = {w: (-1, None) for w in limits}
        for T in np.quantile(lead, np.linspace(0, 1, 81)):
            for M in (0.0, 0.05, 0.1, 0.2, 0.3, 0.5):
                c = Counter()
                for x, r in zip(sc, read):
                    if x[0] >= T and all(x[0] - y >= M * scale for y in x[1:]):
                        c[r["kind"] if r["kind"] == "untaught" else "right" if r["compared"][0] == r["right"] else "other"] += 1
                wrong = c["other"] + c["untaught"]
                for w in limits:
                    if wrong <= w and c["right"] > best[w][0]:
                        best[w] = (c["right"], (T, M * scale, c["right"], c["other"], c["untaught"]))
        last = best[limits[-1]][1]
        tail = f"{last[0]:.2f}, {last[1]:.2f}, {last[2]} / {last[3]} / {last[4]}" if last else "-"
        print(f"| {name} | " + " | ".join(str(best[w][0]) for w in limits) + f" | {tail} |")


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", default=None, help="GGUF path (default: the embedded Gemma-3-270M)")
    ap.add_argument("--taught", choices=("once", "twice"), default="once")
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--grid", default="", help="thresholds x margins to print the default's rule at, e.g. 7,9.4,13:2,3,5")
    ap.add_argument("--limit", type=int, default=0, help="only the dev half's first N facts and 2N unrelated questions")
    ap.add_argument("--reverse", action="store_true",
                    help="also read each compared input after the query, and print each score family's trade (FAMILIES)")
    ap.add_argument("--json", default=None, help="write the recorded readings here; or read them, if it exists")
    args = ap.parse_args(argv)
    sys.path.insert(0, str(ROOT / "python"))
    from _report import print_header
    from miita_edge.method.presets import READ_REACH
    from miita_edge.method.verify import VERIFY_MARGIN

    print_header(argv)
    if args.json and Path(args.json).exists():
        print(f"# readings read from {args.json}")
        opener = gzip.open if args.json.endswith(".gz") else open
        with opener(args.json, "rt", encoding="utf-8") as f:
            rows = json.load(f)
    else:
        rows = record(args)
        if args.json:
            opener = gzip.open if args.json.endswith(".gz") else open
            with opener(args.json, "wt", encoding="utf-8") as f:
                f.write("[\n" + ",\n".join(json.dumps(r) for r in rows) + "\n]\n")
    print(f"# facts dev half taught {args.taught}; model {Path(args.model).name if args.model else 'embedded Gemma-3-270M'}; "
          f"READ_REACH {READ_REACH}, VERIFY_MARGIN {VERIFY_MARGIN}")
    report(rows, READ_REACH, VERIFY_MARGIN)
    if args.grid:
        ts, ms = args.grid.split(":")
        grid(rows, [float(x) for x in ts.split(",")], [float(x) for x in ms.split(",")])
    if any("fwd_in" in r for r in rows):
        families(rows, [10, 20, 30, 40])
    return 0


if __name__ == "__main__":
    sys.exit(main())
