"""Can the model's reading decide which taught-once answer a question wants, where the keys cannot?

The personal facts' dev half (``bench/facts.py``) taught once, as labels. ``scores`` asks every
unseen question (each paraphrase and its forms, one per folded text; the taught phrasing's forms
fold to the taught text and are left out) and every unrelated question as the default does,
recording the default's outcome (the answer it steers to, or None and the gate's reason) and, for
the nearest ``--top`` answers by best cosine (one prototype per fact): their best cosine, whether
the query beats the gate's general-question tests for them (null score and the query's own bar),
and log P(query | VERIFY_PROMPT with the answer's taught question) (``v1``, method/verify's
score), with the same score after a neutral question (``base``) for a pointwise mutual information.

``groups`` records the same scores on the model's paraphrase groups (each phrasing after its nearest
sibling, its nearest non-sibling and the neutral question): the PMI threshold that separates them
is the default's ``READ_REACH``.

``table`` replays rules over those records: the key reach as the default (version 18) decides, and
the reading (the nearest answer steers where its PMI is at least t nats and its v1 leads every
other compared answer's by at least m); per rule, the unseen questions right / another fact's and
the untaught questions steered (each record with its own fact removed).

    python bench/admit_probe.py scores [--model GGUF] [--top 4] --out FILE.json
    python bench/admit_probe.py groups [--model GGUF] --out FILE-groups.json
    python bench/admit_probe.py table FILE.json [FILE.json ...]

The facts' dev half is for choosing; this reads nothing else.
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
    import numpy as np

    from miita_edge import Example, Miita
    from miita_edge.evaluation.facts import load_facts, queries
    from miita_edge.method.plan import anchor_best, query_key
    from miita_edge.method.presets import default_preset
    from miita_edge.method.relevance import nearest_margin
    from miita_edge.method.steering import vote
    from miita_edge.method.templates import folded_text
    from miita_edge.method.verify import query_logprob
    from miita_edge.runtime.engine import Engine, EngineConfig

    fs = load_facts(split="dev")
    engine = Engine(args.model, EngineConfig(n_threads=args.threads))
    out = []
    with tempfile.TemporaryDirectory() as d, Miita(memory=Path(d) / "m", preset=default_preset(),
                                                   engine=engine, template="auto") as m:
        m.ingest([Example(f.teach[0], f.answer) for f in fs.facts], budget="none")
        labels = [m.keyed_engine().detokenize(t).strip() for t in m.bank.answer_tokens()]
        ev = [engine.detokenize(e) if e is not None else None for e in m.bank.evidence()]
        asks = [(f.answer, t) for f in fs.facts
                for t in dict.fromkeys(folded_text(q.text) for q in queries(f, 1) if q.kind not in ("taught", "form"))]
        asks += [(None, folded_text(q)) for q in fs.unrelated]
        for n, (fact, t) in enumerate(asks):
            state = m.query_state(t)
            qp = m.plan(state)
            index = m.pipeline.index(m.bank, None)
            assert index.null_float is None, "a float gate: this probe reads the sign-bit gate only"
            J = m.bank.n_prototypes
            k_q = query_key(m.preset, m.bank, index, state)
            best = anchor_best(index, k_q, np.arange(J))
            K = index.key_dim
            floor = nearest_margin(np.packbits(np.asarray(k_q)[:K] >= 0), index.generic_packed, K)
            order = [int(j) for j in np.argsort(-best, kind="stable")[:args.top]]
            got = None if (qp.gate is not None and not qp.gate.adapted) else (vote(qp.ids, qp.weights, labels) or None)
            out.append({"fact": fact, "text": t, "got": got, "reason": qp.gate.reason if qp.gate else None,
                        "reach": float(index.reach), "compared": [labels[j] for j in order],
                        "cos": [float(best[j]) for j in order],
                        "general": [bool(best[j] > max(float(index.null[j]), floor)) for j in order],
                        "v1": [query_logprob(engine, ev[j], t) if ev[j] else None for j in order],
                        "base": query_logprob(engine, NEUTRAL, t)})
            if (n + 1) % 50 == 0:
                print(f"{n + 1}/{len(asks)}", flush=True)
    engine.close()
    Path(args.out).write_text(json.dumps(out), "utf-8")
    print(f"{len(out)} queries -> {args.out}")
    return 0


def groups(args) -> int:
    """The same scores on the model's paraphrase groups (key_whitening.GROUPS): each phrasing read
    after its nearest sibling and after its nearest non-sibling (by key cosine in the memory's
    frame), and after the neutral question; with each text's length in tokens."""
    sys.path.insert(0, str(ROOT / "python"))
    import numpy as np

    from miita_edge import Example, Miita
    from miita_edge.evaluation.facts import load_facts
    from miita_edge.method.key_whitening import GROUPS
    from miita_edge.method.plan import query_key
    from miita_edge.method.presets import default_preset
    from miita_edge.method.templates import folded_text
    from miita_edge.method.verify import query_logprob
    from miita_edge.runtime.engine import Engine, EngineConfig

    fs = load_facts(split="dev")
    engine = Engine(args.model, EngineConfig(n_threads=args.threads))
    texts = [folded_text(t) for g in GROUPS for t in g]
    gid = np.array([i for i, g in enumerate(GROUPS) for _ in g])
    out = []
    with tempfile.TemporaryDirectory() as d, Miita(memory=Path(d) / "m", preset=default_preset(),
                                                   engine=engine, template="auto") as m:
        m.ingest([Example(f.teach[0], f.answer) for f in fs.facts], budget="none")
        index = m.pipeline.index(m.bank, None)
        keys = np.stack([np.asarray(query_key(m.preset, m.bank, index, m.query_state(t)), np.float64) for t in texts])
        keys /= np.linalg.norm(keys, axis=1, keepdims=True)
        cos = keys @ keys.T
        np.fill_diagonal(cos, -np.inf)
        for i, t in enumerate(texts):
            same = gid == gid[i]
            sib = int(np.argmax(np.where(same, cos[i], -np.inf)))
            non = int(np.argmax(np.where(~same, cos[i], -np.inf)))
            out.append({"text": t, "n_tok": len(engine.tokenize(t, add_bos=False)),
                        "sib": query_logprob(engine, texts[sib], t), "non": query_logprob(engine, texts[non], t),
                        "base": query_logprob(engine, NEUTRAL, t)})
    engine.close()
    Path(args.out).write_text(json.dumps(out), "utf-8")
    print(f"{len(out)} phrasings -> {args.out}")
    return 0


def _lead_rule(cos, v1, general, base, t: float, m: float):
    """The reading's rule over one record's compared answers (nearest first): the position that
    steers (0, the nearest) or None: its PMI v1 - base >= t, its v1 ahead of every other's by >= m,
    and it beats its general-question tests."""
    if not cos or not general[0] or v1[0] is None:
        return None
    rest = [x for x in v1[1:] if x is not None]
    return 0 if v1[0] - base >= t and all(v1[0] - x >= m for x in rest) else None


def _reach_rule(cos, v1, general, base, reach: float):
    """The default's rule, restated from a record (for the untaught count): the nearest answer
    within the key reach and beating its tests, leading the next by 0.01, and no other compared
    answer's question making the query more than VERIFY_MARGIN (3) nats likelier."""
    if not cos or not (cos[0] >= reach and general[0]):
        return None
    if len(cos) > 1 and cos[0] - cos[1] < 0.01:
        return None
    rest = [x for x in v1[1:] if x is not None]
    return None if v1[0] is not None and any(x - v1[0] > 3 for x in rest) else 0


def table(args) -> int:
    """Per rule: unseen questions steered to their own fact / to another fact (of the texts), and
    untaught questions steered (the asked fact's own answer removed from the record, so the next
    nearest answer leads: what a memory without that fact would do, restated from the same scores)."""
    sys.path.insert(0, str(ROOT / "python"))
    import numpy as np

    from miita_edge.method.relevance import separating_threshold
    for fn in args.files:
        rows = json.loads(Path(fn).read_text("utf-8"))
        un = [r for r in rows if r["fact"] is not None]
        groups = Path(fn).with_name(Path(fn).stem + "-groups.json")
        print(f"\n{fn}: {len(un)} unseen question texts (default as run: right "
              f"{sum(r['got'] == r['fact'] for r in un)}, another's {sum(r['got'] not in (None, r['fact']) for r in un)})")
        if groups.exists():
            g = json.loads(groups.read_text("utf-8"))
            t = separating_threshold(np.array([x["sib"] - x["base"] for x in g]), np.array([x["non"] - x["base"] for x in g]))
            print(f"paraphrase groups ({len(g)} phrasings): the PMI threshold that separates the nearest sibling "
                  f"from the nearest non-sibling: {t:.2f} nats")
        print("| rule | right | another's | untaught steered |")
        print("|---|---|---|---|")

        def line(name, rule):
            right = other = untaught = 0
            for r in un:
                c, v, gen, names = r["cos"], r["v1"], r["general"], r["compared"]
                i = rule(c, v, gen, r["base"], r["reach"])
                right += i is not None and names[i] == r["fact"]
                other += i is not None and names[i] != r["fact"]
                keep = [k for k in range(len(c)) if names[k] != r["fact"]]
                untaught += rule([c[k] for k in keep], [v[k] for k in keep], [gen[k] for k in keep],
                                 r["base"], r["reach"]) is not None
            print(f"| {name} | {right} | {other} | {untaught} of {len(un)} |")

        line("the key reach, verified (default)", lambda c, v, g, b, reach: _reach_rule(c, v, g, b, reach))
        for t in (0, 5, 8, READ_T, 10, 12, 14):
            for m in (0, 2, 3):
                line(f"reading t={t:g} m={m:g}", lambda c, v, g, b, reach, t=t, m=m: _lead_rule(c, v, g, b, t, m))
    return 0


READ_T = 9.4


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = ap.add_subparsers(dest="cmd", required=True)
    s = sub.add_parser("scores")
    s.add_argument("--model", default=None)
    s.add_argument("--threads", type=int, default=1)
    s.add_argument("--top", type=int, default=4)
    s.add_argument("--out", required=True)
    g = sub.add_parser("groups")
    g.add_argument("--model", default=None)
    g.add_argument("--threads", type=int, default=1)
    g.add_argument("--out", required=True)
    t = sub.add_parser("table")
    t.add_argument("files", nargs="+")
    args = ap.parse_args(argv)
    return {"scores": scores, "groups": groups, "table": table}[args.cmd](args)


if __name__ == "__main__":
    sys.exit(main())
