"""A probe: does the model's own reading of an answer rerank the vote's candidates better?

For each budget a fresh default memory learns a classification benchmark's stream (as
``bench/bytes.py``), and each dev row's vote (gate off: retrieval alone) ranks its retrieved answers
by summed weight. For the top ``--top`` answers the frozen model scores log P(answer | the query's
prompt) (the template's target, newline included) and, once per answer, log P(answer | the prompt
of an empty input); their difference is the answer's pointwise mutual information with the query.
Prints, per budget: the vote's top-1, the share with the gold answer among the top K, and top-1
after reranking by log-probability, by PMI and by log(vote share) + lambda * PMI for a few lambdas.
Dev rows only; nothing here is a default.

    python bench/rerank_probe.py --budgets 1%,5% [--model M] [--top 4] [--out F.json] [--offtopic tests/data/offtopic.txt]
"""
from __future__ import annotations

import argparse
import dataclasses
import json
import sys
import tempfile
from contextlib import closing
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _report import ROOT, print_header  # noqa: E402

DATA = ROOT.parent / "shared" / "data"
LAMBDAS = (0.0, 0.05, 0.1, 0.2, 0.3, 0.5, 1.0, 2.0)


def score_prompt(engine, prompt: list[int], targets: list[list[int]]) -> list[float]:
    """log P(target | prompt) for each target, as the default reads them (answer_reading.prompt_logprobs)."""
    from miita_edge.method.answer_reading import prompt_logprobs

    out = prompt_logprobs(engine, prompt, targets)
    engine.reset()
    return out


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model")
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--benchmark", default="banking77")
    ap.add_argument("--budgets", default="1%,5%")
    ap.add_argument("--top", type=int, default=4)
    ap.add_argument("--limit", type=int, default=None)
    ap.add_argument("--cache", type=Path, default=ROOT / "bench-results" / "extract-cache")
    ap.add_argument("--out", type=Path)
    ap.add_argument("--offtopic", type=Path, help="also these prompts (one a line; tests/data/offtopic.txt), "
                    "for how the model's reading separates them from the dev rows the gate declines")
    args = ap.parse_args(argv)
    print_header(argv)
    sys.path.insert(0, str(ROOT / "python"))
    from miita_edge import Miita
    from miita_edge.evaluation.benchmarks import get_benchmark, load_benchmark
    from miita_edge.evaluation.extract_cache import ExtractCache
    from miita_edge.evaluation.metrics import label_match
    from miita_edge.memory.budget import parse_budget
    from miita_edge.method.extract import prompt_tokens
    from miita_edge.method.pipeline import Pipeline
    from miita_edge.method.presets import default_preset
    from miita_edge.runtime.engine import Engine, EngineConfig
    from miita_edge.runtime.fingerprint import model_sha256
    from miita_edge.streams import stream_bytes

    spec = get_benchmark(args.benchmark)
    _, stages = load_benchmark(spec, DATA / spec.data_name, limit_test=args.limit, split="dev")
    items = [it for s in stages for it in s.test]
    offtopic = [t.strip() for t in args.offtopic.read_text().splitlines() if t.strip()] if args.offtopic else []
    stream = stream_bytes(ex for s in stages for ex in s.train)
    results = {}
    with closing(Engine(args.model, EngineConfig(n_threads=args.threads, stop_after_text=True))) as engine:
        cache = ExtractCache(args.cache, model_sha256(engine.info.path))
        for text in [b.strip() for b in args.budgets.split(",") if b.strip()]:
            b = parse_budget(text)
            with tempfile.TemporaryDirectory() as tmp:
                m = Miita(memory=Path(tmp) / "mem", preset=default_preset(), template=spec.template, engine=engine,
                          extract_cache=cache, max_prompt_tokens=spec.max_prompt_tokens)
                for s in stages:
                    m.ingest(s.train, budget="none" if b.unlimited else str(b.resolve(stream)), progress=False)
                eng = m.keyed_engine()
                toks = [list(map(int, t)) for t in m.bank.answer_tokens()]
                labels = [eng.detokenize(t).strip() for t in toks]
                null_prompt = prompt_tokens(eng, m.template, "", m.max_prompt_tokens)
                null = score_prompt(eng, null_prompt, toks)
                open_pipe = Pipeline(dataclasses.replace(m.preset, relevance_gate=False, null_gate=False,
                                                         answer_reading=0.0), m.engine, m.template, m.fingerprint())
                unread_pipe = Pipeline(dataclasses.replace(m.preset, answer_reading=0.0), m.engine, m.template,
                                       m.fingerprint())
                def row_for(x: str, golds) -> dict:
                    prompt = prompt_tokens(eng, m.template, x, m.max_prompt_tokens)
                    state = eng.query(prompt, skip_bos_in_key=m.preset.skip_bos)
                    gated = m.plan(state)  # the default as it is (the gate, then its reading)
                    declined = gated.gate is not None and not gated.gate.adapted
                    unread = unread_pipe.plan(m.bank, None, state)  # the gate alone
                    kept = _shares(labels, unread.ids, unread.weights)
                    steered = _shares(labels, gated.ids, gated.weights)
                    qo = open_pipe.plan(m.bank, None, state)
                    acc: dict[str, float] = {}
                    first: dict[str, int] = {}
                    for j, w in zip(qo.ids, qo.weights):
                        acc[labels[j]] = acc.get(labels[j], 0.0) + float(w)
                        first.setdefault(labels[j], int(j))
                    ranked = sorted(acc, key=lambda k: -acc[k])[: args.top]
                    lp = score_prompt(eng, prompt, [toks[first[k]] for k in ranked])
                    total = sum(acc.values()) or 1.0
                    def right(k: str) -> bool:  # an unrelated prompt has no gold: nothing is right
                        return bool(golds) and label_match(k, golds)

                    return {"gold": [right(k) for k in ranked] if golds else [],
                            "share": [acc[k] / total for k in ranked], "lp": lp,
                            "null": [null[first[k]] for k in ranked], "declined": declined,
                            "kept": {k: [v, right(k)] for k, v in kept.items()},
                            "steered": {k: [v, right(k)] for k, v in steered.items()}}

                rows = []
                for qi, it in enumerate(items):
                    rows.append(row_for(it.example.input, it.golds))
                    if qi % 50 == 0:
                        print(f"# {text}: {qi}/{len(items)}", flush=True)
                off = [row_for(x, []) for x in offtopic]
                m.close()
            results[text] = {"dev": rows, "offtopic": off}
            report(text, rows)
            if off:
                report_offtopic(rows, off)
    if args.out:
        args.out.write_text(json.dumps(results))
    return 0


def _shares(labels: list[str], ids, weights) -> dict[str, float]:
    """Summed weight per answer label."""
    acc: dict[str, float] = {}
    for j, w in zip(ids, weights):
        acc[labels[int(j)]] = acc.get(labels[int(j)], 0.0) + float(w)
    return acc


def _top_right(shares: dict) -> bool:
    """Whether the answer of largest share (ties to the first) is right; False where none."""
    if not shares:
        return False
    k = max(shares, key=lambda a: shares[a][0])
    return bool(shares[k][1])


def report_gated(rows: list[dict], lam: float = 0.1) -> None:
    """Where the gate keeps one answer, two or more, or none: the gate alone, the default (gate then
    reading) and the ungated reading of the vote's leading answers on the same queries."""
    def ungated_read(r) -> bool:
        if not r["gold"]:
            return False
        s = np.log(np.maximum(r["share"], 1e-9)) + lam * np.subtract(r["lp"], r["null"])
        return bool(r["gold"][int(np.argmax(s))])

    groups = {"none kept": lambda r: len(r["kept"]) == 0, "one kept": lambda r: len(r["kept"]) == 1,
              "two or more kept": lambda r: len(r["kept"]) >= 2}
    for name, sel in groups.items():
        rs = [r for r in rows if sel(r)]
        if not rs:
            continue
        print(f"  {name}: {len(rs)} queries; gold kept {sum(any(v[1] for v in r['kept'].values()) for r in rs)}; "
              f"right: gate alone {sum(_top_right(r['kept']) for r in rs)}, default {sum(_top_right(r['steered']) for r in rs)}, "
              f"ungated reading (lambda {lam}) {sum(ungated_read(r) for r in rs)}, ungated vote "
              f"{sum(bool(r['gold'] and r['gold'][0]) for r in rs)}")


def _best_pmi(r: dict) -> float:
    """The largest PMI among a row's read answers (-inf where none was read)."""
    return max(np.subtract(r["lp"], r["null"]), default=-np.inf)


def report_offtopic(rows: list[dict], off: list[dict], lam: float = 0.1) -> None:
    """Whether the model's reading tells in-domain queries the gate declines from unrelated prompts:
    per threshold on the best PMI among the vote's leading answers, how many of each pass it, and how
    many of the declined in-domain ones the product of vote and reading would then answer right."""
    dec = [r for r in rows if r["declined"]]
    kept = [r for r in rows if not r["declined"]]
    off_dec = [r for r in off if r["declined"]]
    print(f"  off-topic prompts: {len(off)}, the gate declines {len(off_dec)}")
    for name, rs in (("dev, declined", dec), ("dev, kept", kept), ("off-topic, declined", off_dec),
                     ("off-topic, kept", [r for r in off if not r["declined"]])):
        v = sorted(_best_pmi(r) for r in rs)
        if v:
            q = [v[int(f * (len(v) - 1))] for f in (0.1, 0.5, 0.9)]
            print(f"  best PMI, {name}: n {len(v)}, 10/50/90% {q[0]:.1f} / {q[1]:.1f} / {q[2]:.1f}, max {v[-1]:.1f}")

    def right(r) -> bool:
        if not r["gold"]:
            return False
        sc = np.log(np.maximum(r["share"], 1e-9)) + lam * np.subtract(r["lp"], r["null"])
        return bool(r["gold"][int(np.argmax(sc))])

    for tau in (0, 2, 4, 6, 8, 10, 12, 15, 20):
        d = [r for r in dec if _best_pmi(r) >= tau]
        print(f"  PMI >= {tau:2d}: dev declined {len(d)} (right by the product {sum(right(r) for r in d)}), "
              f"off-topic declined {sum(_best_pmi(r) >= tau for r in off_dec)}")


def report(text: str, rows: list[dict]) -> None:
    n = len(rows)

    def top1(score) -> int:
        hit = 0
        for r in rows:
            if not r["gold"]:
                continue
            s = score(r)
            hit += r["gold"][int(np.argmax(s))]
        return hit

    print(f"## {text}: {n} dev rows, gate declines {sum(r['declined'] for r in rows)}")
    print(f"vote top-1 {top1(lambda r: r['share'])}, gold in top-K {sum(any(r['gold']) for r in rows)}")
    if rows and "kept" in rows[0]:
        report_gated(rows)
    print(f"log P rerank {top1(lambda r: r['lp'])}, PMI rerank {top1(lambda r: np.subtract(r['lp'], r['null']))}")
    for lam in LAMBDAS:
        f = lambda r, lam=lam: np.log(np.maximum(r["share"], 1e-9)) + lam * np.subtract(r["lp"], r["null"])
        g = lambda r, lam=lam: np.log(np.maximum(r["share"], 1e-9)) + lam * np.asarray(r["lp"])
        print(f"  lambda {lam}: share+PMI {top1(f)}, share+logP {top1(g)}")


if __name__ == "__main__":
    sys.exit(main())
