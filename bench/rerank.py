"""Does the model's own reading of the vote's leading answers pick the taught intent more often
than the anchor vote alone? The measurement behind the default preset's rerank (docs/method.md, "Rerank: the
model reads the leading replies").

    python bench/rerank.py probe --data ../shared/data/banking77 --seed 11 --out bench-results/rerank
    python bench/rerank.py probe --data ../shared/data/banking77 --seed 11 --labels --intents 77 --asked 5 \\
        --out bench-results/rerank
    python bench/rerank.py choose bench-results/rerank/replies-*.json

Rows: only ``train.jsonl`` is read. ``--intents`` intents are drawn with ``--seed``; the first
``--taught`` training rows of each are learned (with the intent's canned reply from the package,
or with ``--labels`` its label), and the next ``--asked`` training rows of the intent are asked.
No test row is read, so nothing here touches what RESULTS reports; the harness's dev split holds
about four rows per intent, too few for a per-intent probe, so held-out training rows play its part.

``probe`` learns the rows into a default-preset memory with the rerank off, and for every asked
row records the relevance gate's decision, the vote's weight for each of its three leading
answers, and their PMI (log p(answer | query) - log p(answer | empty query), by the model);
``choose`` scores the vote with λ·PMI added to the log weights, for each λ of the grid, as the
share of asked rows whose leading answer is the taught one (0 where the gate declined), and
applies the rule fixed before the runs: the λ with the best mean over the files, if it beats
λ = 0 by more than 0.5 points, else 0.

Other readings than the shipped PMI are recorded beside it, to be gridded by ``choose
--baselines``: the PMI against each answer's log p after other stored answers' texts
(``replies``) or after taught inputs of other intents (``inputs``, a reference: a memory does not
store inputs), and with ``probe --channel`` the noisy-channel score log p(query | answer)
(``channel``). docs/method.md has what they gave ("Rerank: the model reads the leading replies" for the
channel, "Tried and not adopted" for the other baselines); every baseline's table, the ``inputs``
reference included, is in ``git show f98d7e6:docs/method.md``, §18.
"""
from __future__ import annotations

import argparse
import json
import shutil
import sys
import time
from pathlib import Path
from typing import Sequence

import numpy as np

LAMBDAS = (0.0, 0.01, 0.03, 0.1, 0.3, 1.0, 3.0)
MARGIN = 0.5

sys.path.insert(0, str(Path(__file__).resolve().parent))

from intents import draw  # noqa: E402  (the draw every probe of intents shares)


def probe(args) -> Path:
    from miita_edge.method.rerank import channel_logprob, continuation_logprob
    from miita_edge.miita import Miita
    from miita_edge.streams import Example

    taught, asked, answer = draw(args.data, args.seed, args.intents, args.taught, args.asked, args.labels)
    taught = [Example(x, y) for x, y in taught]
    chosen = list(answer)
    kind = "labels" if args.labels else "replies"
    args.out.mkdir(parents=True, exist_ok=True)
    mem = args.out / f"mem-{kind}-{args.seed}-{args.intents}{args.tag}"
    shutil.rmtree(mem, ignore_errors=True)
    m = Miita(model=args.model, memory=mem, template="banking77" if args.labels else "plain")
    m.preset.rerank_lambda = 0.0
    m.ingest(taught, budget=None, progress=False)
    eng = m.keyed_engine()
    seqs = m.retrieval_index().seqs
    owner = {}
    for j, s in enumerate(seqs):
        text = eng.detokenize([int(t) for t in s]).strip()
        owner[j] = next((lab for lab in chosen if answer[lab].strip() == text), None)
    null = m.prompt_tokens("")
    prior: dict[int, float] = {}
    base: dict[int, dict] = {}
    taught_by: dict[str, list[str]] = {}
    for e in taught:
        taught_by.setdefault(next(lab for lab in chosen if answer[lab] == e.output), []).append(e.input)
    out, t0 = [], time.time()
    for i, (x, lab) in enumerate(asked):
        toks = m.prompt_tokens(x)
        state = eng.query(toks, skip_bos_in_key=m.preset.skip_bos)
        qp = m.plan(state)
        adapted = qp.gate is None or qp.gate.adapted
        lead = [int(k) for k in np.argsort(-np.asarray(qp.weights), kind="stable")[:args.top]] if adapted else []
        cands = []
        for k in lead:
            j = int(qp.ids[k])
            cands.append({"answer": owner[j], "w": float(qp.weights[k]), "n_tokens": len(seqs[j]),
                          "lp": continuation_logprob(eng, state.logits, seqs[j])})
        for c, k in zip(cands, lead):
            j = int(qp.ids[k])
            if j not in prior:
                eng.reset()
                first = eng.decode(list(null), "last")[0]
                prior[j] = continuation_logprob(eng, first, seqs[j])
                base[j] = baselines(m, eng, seqs, j, owner, taught_by)
            c["pmi"] = c["lp"] - prior[j]
            c["prior"] = {"empty": prior[j], **base[j]}
            if args.channel:
                c["channel"] = channel_logprob(eng, seqs[j], x)  # the product's (method/rerank.py)
        out.append({"input": x, "gold": lab, "adapted": adapted, "cands": cands})
        if args.progress:
            print(f"\r{i + 1}/{len(asked)} asked, {time.time() - t0:.0f} s", end="", file=sys.stderr)
    m.close()
    f = args.out / f"{kind}-{args.seed}-{args.intents}{args.tag}.json"
    f.write_text(json.dumps({"seed": args.seed, "intents": args.intents, "taught": args.taught,
                             "asked": args.asked, "kind": kind, "top": args.top, "rows": out}), "utf-8")
    print(f"\n{f}: {len(out)} asked; vote alone {accuracy(out, 0.0):.1f}%", file=sys.stderr)
    return f


CONTEXTS = 4


def context_answers(seqs: Sequence[Sequence[int]], n: int) -> list[int]:
    """Prototype ids of ``n + 1`` distinct stored answers spread evenly over the store's order
    (each answer by its first prototype), or of all of them where there are fewer: the contexts the
    ``"replies"`` baseline reads each answer after (:func:`context_priors`).

    Why ``n + 1``: an answer is never its own context, so each answer keeps ``n`` of them, and
    one decode of each context serves every answer."""
    first: dict[tuple, int] = {}
    for j, s in enumerate(seqs):
        first.setdefault(tuple(int(t) for t in s), j)
    ids = sorted(first.values())
    if len(ids) <= n + 1:
        return ids
    pos = np.round(np.linspace(0, len(ids) - 1, n + 1)).astype(np.int64)
    return [ids[int(p)] for p in pos]


def context_priors(engine, contexts: Sequence[tuple[Sequence[int], Sequence[int]]],
                   seqs: Sequence[Sequence[int]], n: int) -> dict[int, float]:
    """Each scored answer's mean log p(its tokens | a context's prompt) over its first ``n``
    contexts that are not the answer itself: the ``"replies"`` baseline of the rerank's PMI.

    ``contexts``: (context prompt tokens, answer ids to score after it); the caller lists under a
    context only answers other than the context's own. Why another answer as the
    context: the empty prompt says nothing of the domain, so a reply that any in-domain question
    makes likely (a "hub") gains PMI from every query; after other in-domain text it does not.
    The engine's cache is reset for each context and left holding the last one."""
    from miita_edge.method.rerank import continuation_logprob

    sums: dict[int, list[float]] = {}
    for ctx_prompt, ids in contexts:
        todo = [j for j in ids if len(sums.get(j, ())) < n]
        if not todo:
            continue
        engine.reset()
        first = engine.decode(list(ctx_prompt), "last")[0]
        for j in todo:
            sums.setdefault(j, []).append(continuation_logprob(engine, first, seqs[j]))
    return {j: float(np.mean(v)) for j, v in sums.items() if v}



def baselines(m, eng, seqs: list, j: int, owner: dict, taught_by: dict[str, list[str]]) -> dict:
    """Answer ``j``'s log p after other contexts than the empty prompt: ``replies``, the mean over
    ``CONTEXTS`` other stored answers' texts asked as inputs (:func:`context_priors`, what a
    memory can compute: it stores answers' tokens), and ``inputs``, the mean over ``2·CONTEXTS``
    taught inputs of other intents (a reference: a memory does not store its inputs)."""
    own = tuple(int(t) for t in seqs[j])
    ctx = [c for c in context_answers(seqs, CONTEXTS) if tuple(int(t) for t in seqs[c]) != own][:CONTEXTS]
    prompts = [(m.prompt_tokens(eng.detokenize([int(t) for t in seqs[c]]).strip()), [j]) for c in ctx]
    out = {"replies": context_priors(eng, prompts, seqs, CONTEXTS).get(j)}
    others = [x for lab, xs in taught_by.items() if lab != owner[j] for x in xs]
    pick = [others[int(i)] for i in np.round(np.linspace(0, len(others) - 1, 2 * CONTEXTS)).astype(np.int64)] if others else []
    out["inputs"] = context_priors(eng, [(m.prompt_tokens(x), [j]) for x in pick], seqs, 2 * CONTEXTS).get(j)
    return out


def cost(args) -> None:
    """Seconds per ``ask`` with the rerank off and on, alternating query by query over the same
    memory (a dozen-intent draw, the rerank's priors decoded before timing), and their ratio."""
    from miita_edge.miita import Miita
    from miita_edge.streams import Example

    taught, asked, _ = draw(args.data, args.seed, args.intents, args.taught, args.asked, False)
    mem = args.out / f"mem-cost-{args.seed}"
    shutil.rmtree(mem, ignore_errors=True)
    args.out.mkdir(parents=True, exist_ok=True)
    m = Miita(model=args.model, memory=mem, template="plain")
    lam = m.preset.rerank_lambda or 0.1
    m.ingest([Example(x, y) for x, y in taught], budget=None, progress=False)
    m.preset.rerank_lambda = lam
    for x, _ in asked:  # warm: the index, the calibration prompts and every prior the queries need
        m.ask(x, max_tokens=1)
    t = {0.0: [], lam: []}
    for i, (x, _) in enumerate(asked):
        for value in ((0.0, lam) if i % 2 == 0 else (lam, 0.0)):
            m.preset.rerank_lambda = value
            t0 = time.perf_counter()
            m.ask(x, max_tokens=args.max_tokens)
            t[value].append(time.perf_counter() - t0)
    m.close()
    off, on = float(np.mean(t[0.0])), float(np.mean(t[lam]))
    print(f"{len(asked)} queries, {args.max_tokens} tokens at most: ask {off:.3f} s without the rerank, "
          f"{on:.3f} s with it (λ {lam:g}): ratio {on / off:.2f}")


def pmi(c: dict, baseline: str = "empty") -> float:
    """A recorded candidate's PMI against ``baseline``: "empty" (the prompt of an empty input, what
    the shipped rerank reads) or one of the recorded context baselines ("replies", "inputs"); or,
    for "channel", the query's log p after the answer (method/rerank.channel_logprob), which needs no
    baseline: it is compared only between one query's candidates."""
    if baseline == "empty":
        return c["pmi"]
    if baseline == "channel":
        if "channel" not in c:
            raise SystemExit("a probe file has no 'channel' score (probe it again with --channel)")
        return c["channel"]
    b = c.get("prior", {}).get(baseline)
    if b is None:
        raise SystemExit(f"a probe file has no {baseline!r} baseline (probe it again with this bench/rerank.py)")
    return c["lp"] - b


def accuracy(rows: list[dict], lam: float, top: int = 3, baseline: str = "empty") -> float:
    """Share of rows whose leading answer, after adding λ·PMI to the log vote weights of the ``top``
    leading answers, is the gold one (0 where the gate declined)."""
    ok = 0
    for r in rows:
        if r["adapted"] and r["cands"]:
            best = max(r["cands"][:top], key=lambda c: np.log(max(c["w"], 1e-300)) + lam * pmi(c, baseline))
            ok += best["answer"] == r["gold"]
    return 100.0 * ok / max(len(rows), 1)


def choose(files: list[Path], tops: tuple[int, ...] = (3,), shipped: tuple[int, float] | None = None,
           baselines: tuple[str, ...] = ("empty",), guard: float | None = None) -> tuple[str, int, float]:
    """The grid of (baseline, top, λ) over the probe files and the rule's pick, fixed before the
    runs: the point with the best mean; it replaces ``shipped`` (with the "empty" baseline) only if
    it beats it by more than ``MARGIN``, and then the point with the fewest leading answers (the
    cost: one decode each) among those within ``MARGIN`` of the best is taken. With ``guard``, a
    point that lowers the mean of any one model's files (the name's last "-"-part before the
    extension's tag) by more than ``guard`` points against ``shipped`` cannot be picked. Without
    ``shipped``, λ = 0 at the smallest top plays its part."""
    runs = [json.loads(f.read_text("utf-8")) for f in files]
    for f, r in zip(files, runs):
        if r.get("top", 3) < max(tops):
            raise SystemExit(f"{f}: recorded {r.get('top', 3)} leading answers, fewer than --tops asks")
    grid = [(b, t, lam) for b in baselines for t in tops for lam in LAMBDAS]
    name = lambda g: (f"{g[0]} " if len(baselines) > 1 else "") + f"top {g[1]} λ {g[2]:g}"  # noqa: E731
    print("| file | asked | " + " | ".join(name(g) for g in grid) + " | leading hold gold |")
    print("|---|---:|" + "---:|" * (len(grid) + 1))
    means = {g: [] for g in grid}
    for f, r in zip(files, runs):
        accs = [accuracy(r["rows"], lam, t, b) for b, t, lam in grid]
        for g, a in zip(grid, accs):
            means[g].append(a)
        hold = "/".join(f"{100.0 * np.mean([x['adapted'] and any(c['answer'] == x['gold'] for c in x['cands'][:t]) for x in r['rows']]):.1f}"
                        for t in tops)
        print(f"| {f.name} | {len(r['rows'])} | " + " | ".join(f"{a:.1f}" for a in accs) + f" | {hold} |")
    mean = {g: float(np.mean(v)) for g, v in means.items()}
    print("| mean | | " + " | ".join(f"{mean[g]:.2f}" for g in grid) + " | |")
    base = ("empty", *shipped) if shipped is not None else ("empty", min(tops), 0.0)
    if base not in mean:
        raise SystemExit(f"shipped point top {base[1]}, λ {base[2]:g} is not on the grid")
    allowed = set(grid)
    if guard is not None:
        groups: dict[str, list[int]] = {}
        for i, f in enumerate(files):
            groups.setdefault(f.stem.split("-")[-2] if f.stem.count("-") >= 3 else f.stem, []).append(i)
        for key, idx in groups.items():
            per = {g: float(np.mean([means[g][i] for i in idx])) for g in grid}
            print(f"{key}: " + ", ".join(f"{name(g)} {per[g]:.2f}" for g in grid))
            allowed -= {g for g in grid if per[g] < per[base] - guard}
    best = max(allowed, key=lambda g: (mean[g], g == base, -g[1], -g[2]))
    pick = base
    if mean[best] > mean[base] + MARGIN:
        near = [g for g in allowed if mean[g] >= mean[best] - MARGIN]
        pick = min(near, key=lambda g: (g[1], -mean[g], g[2]))
    print(f"rule: best {name(best)} ({mean[best]:.2f}); against {name(base)} ({mean[base]:.2f}): "
          f"chosen {name(pick)}")
    return pick


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = ap.add_subparsers(dest="cmd", required=True)
    p = sub.add_parser("probe", help="learn a drawn set of intents and record the vote and PMI of each asked row")
    p.add_argument("--data", type=Path, default=Path("../shared/data/banking77"))
    p.add_argument("--model", default=None, help="GGUF (default: the embedded Gemma-3-270M)")
    p.add_argument("--seed", type=int, default=11)
    p.add_argument("--intents", type=int, default=12)
    p.add_argument("--taught", type=int, default=10)
    p.add_argument("--asked", type=int, default=20)
    p.add_argument("--labels", action="store_true", help="teach each intent's label instead of its canned reply")
    p.add_argument("--top", type=int, default=3, help="leading answers recorded per asked row (choose --tops reads them)")
    p.add_argument("--tag", default="", help="added to the output file's name")
    p.add_argument("--channel", action="store_true",
                   help="also record each candidate's channel score, log p(query | answer) (one decode each)")
    p.add_argument("--out", type=Path, default=Path("bench-results/rerank"))
    p.add_argument("--progress", action=argparse.BooleanOptionalAction, default=sys.stderr.isatty())
    t = sub.add_parser("cost", help="seconds per ask with the rerank off and on, over one memory")
    t.add_argument("--data", type=Path, default=Path("../shared/data/banking77"))
    t.add_argument("--model", default=None)
    t.add_argument("--seed", type=int, default=11)
    t.add_argument("--intents", type=int, default=12)
    t.add_argument("--taught", type=int, default=10)
    t.add_argument("--asked", type=int, default=2, help="asked rows per intent")
    t.add_argument("--max-tokens", type=int, default=80)
    t.add_argument("--out", type=Path, default=Path("bench-results/rerank"))
    c = sub.add_parser("choose", help="the λ grid over probe files, and the rule's choice")
    c.add_argument("files", type=Path, nargs="+")
    c.add_argument("--tops", default="3", help="comma-separated numbers of leading answers to rerank (default 3)")
    c.add_argument("--shipped", default=None, help="TOP,LAMBDA the preset ships; kept unless beaten by more than 0.5")
    c.add_argument("--baselines", default="empty",
                   help="comma-separated PMI baselines to grid: empty, replies, inputs, channel (default: empty)")
    c.add_argument("--guard", type=float, default=None,
                   help="points any one model's mean may lose against the shipped point (default: no guard)")
    args = ap.parse_args(argv)
    if args.cmd == "probe":
        if not (args.data / "train.jsonl").is_file():
            ap.error(f"{args.data}: no train.jsonl (give Banking77's data directory)")
        probe(args)
    elif args.cmd == "cost":
        cost(args)
    else:
        shipped = None
        if args.shipped:
            t, lam = args.shipped.split(",")
            shipped = (int(t), float(lam))
        choose(args.files, tuple(int(t) for t in args.tops.split(",")), shipped,
               tuple(args.baselines.split(",")), args.guard)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
