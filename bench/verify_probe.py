"""How should the model check an answer the paraphrase reach alone trusts? (method/verify.py)

The personal facts' dev half (``bench/facts.py``) taught once, as labels. ``scores`` asks every unseen
question (each paraphrase and its forms, one per folded text) as the default does and, for each one
the gate steers by the reach alone, records the answer it steers to and the answers the check would
compare (the reach's answer, then the next four retrieved by best cosine), each scored three ways:
log P(query | VERIFY_PROMPT with the answer's taught question) (``v1``), log P(question | the prompt
with the query) (``v2``), and log P(question | the prompt with a neutral question) (``base``, for
a pointwise mutual information ``v2 − base``). The memory steers as the default would without the
check meanwhile (the check is only read, never applied). ``table`` prints, per scorer, per number of compared
answers k and per margin δ, the right answers kept and the answers of another fact avoided.

    python bench/verify_probe.py scores [--model GGUF] --out FILE.json
    python bench/verify_probe.py table FILE.json [FILE.json ...]

The facts' dev half is for choosing; this reads nothing else. Files of the choice:
docs/results/candidates/verify-reach/probe/.
"""
from __future__ import annotations

import argparse
import json
import math
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
NEUTRAL = "What is this about?"


def scores(args) -> int:
    sys.path.insert(0, str(ROOT / "python"))

    from miita_edge import Example, Miita
    from miita_edge.method.presets import default_preset
    from miita_edge.evaluation.facts import load_facts, queries
    from miita_edge.method import plan as plan_mod
    from miita_edge.method.steering import vote
    from miita_edge.method.templates import folded_text
    from miita_edge.method.verify import query_logprob
    from miita_edge.runtime.engine import Engine, EngineConfig

    fs = load_facts(split="dev")
    engine = Engine(args.model, EngineConfig(n_threads=args.threads))

    def logprob(question: str, text: str) -> tuple[float, int]:
        """method/verify's score of ``text`` after ``question``, and ``text``'s length in tokens."""
        return query_logprob(engine, question, text), len(engine.tokenize(text, add_bos=False))

    seen: list = []
    plan_mod._verified = lambda decision, index, eng, k_q, ids, text: seen.append((decision, index, k_q, ids)) or decision
    out, base = [], {}
    with tempfile.TemporaryDirectory() as d, Miita(memory=Path(d) / "m", preset=default_preset(),
                                                   engine=engine, template="auto") as m:
        m.ingest([Example(f.teach[0], f.answer) for f in fs.facts], budget="none")
        labels = [m.keyed_engine().detokenize(t).strip() for t in m.bank.answer_tokens()]
        ev = m.bank.evidence()
        for f in fs.facts:
            texts = dict.fromkeys(folded_text(q.text) for q in queries(f, 1) if q.kind not in ("taught", "form"))
            for t in texts:
                seen.clear()
                qp = m.plan(m.query_state(t))
                if not seen:
                    continue
                decision, index, k_q, ids = seen[0]
                best = plan_mod.anchor_best(index, k_q, ids).tolist()
                lead = int(ids[decision.reach_lead])
                order = sorted(range(len(ids)), key=lambda i: (-best[i], i))
                comp = [lead] + [int(ids[i]) for i in order if int(ids[i]) != lead][:4]
                qs = [engine.detokenize(ev[j]) for j in comp]
                for c in qs:
                    base.setdefault(c, logprob(NEUTRAL, c))
                out.append({"fact": f.answer, "got": vote(qp.ids, qp.weights, labels) or None, "text": t,
                            "compared": [labels[j] for j in comp], "v1": [logprob(c, t) for c in qs],
                            "v2": [logprob(t, c) for c in qs], "base": [base[c] for c in qs]})
    engine.close()
    Path(args.out).write_text(json.dumps(out), "utf-8")
    print(f"{len(out)} queries steered by the reach alone -> {args.out}")
    return 0


SCORERS = {
    "v1 log P(query | question)": lambda r: [a for a, _ in r["v1"]],
    "v2 log P(question | query)": lambda r: [a for a, _ in r["v2"]],
    "v2 - base (PMI)": lambda r: [a - b for (a, _), (b, _) in zip(r["v2"], r["base"])],
    "v1 + PMI": lambda r: [x + a - b for (x, _), (a, _), (b, _) in zip(r["v1"], r["v2"], r["base"])],
}


def table(args) -> int:
    for fn in args.files:
        rows = json.loads(Path(fn).read_text("utf-8"))
        right = sum(r["got"] == r["fact"] for r in rows)
        other = sum(r["got"] is not None and r["got"] != r["fact"] for r in rows)
        print(f"\n{fn}: {len(rows)} queries steered by the reach alone, right {right}, another fact's {other}")
        print("| scorer | k | margin δ | right kept (lost) | another's kept (avoided) |")
        print("|---|---|---|---|---|")
        for name, f in SCORERS.items():
            for k in (2, 3, 4, 5):
                for delta in (0, 1, 2, 3, 4, 6):
                    kr = ko = 0
                    for r in rows:
                        s = f(r)[:k]
                        if max(s[1:], default=-math.inf) - s[0] <= delta:
                            kr += r["got"] == r["fact"]
                            ko += r["got"] is not None and r["got"] != r["fact"]
                    print(f"| {name} | {k} | {delta} | {kr} ({right - kr}) | {ko} ({other - ko}) |")
    return 0


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = ap.add_subparsers(dest="cmd", required=True)
    s = sub.add_parser("scores")
    s.add_argument("--model", default=None)
    s.add_argument("--threads", type=int, default=1)
    s.add_argument("--out", required=True)
    t = sub.add_parser("table")
    t.add_argument("files", nargs="+")
    args = ap.parse_args(argv)
    return scores(args) if args.cmd == "scores" else table(args)


if __name__ == "__main__":
    sys.exit(main())
