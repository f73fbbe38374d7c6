"""OP, BWT and FWT over several stream orders, with bootstrap intervals over orders and queries.

Why: one run per cell leaves two sources of chance unmeasured, which queries were drawn and in
which order the stream came. The paper averages three orders; here the point estimate is the
mean over order seeds of each run's OP / BWT / FWT (each exactly as ``CLMatrix`` computes it),
and the interval is a two-level percentile bootstrap: every replicate draws the seeds with
replacement and, per stage, the query indices with replacement (the same indices for every seed,
since every seed scores the same rows of a stage), recomputes each drawn seed's metric on those
queries and averages over the drawn seeds.

Everything here is a pure function of per-query scores (0..1, as ``result.json``'s
``per_query`` holds them); scores come out on the 0..100 scale.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Mapping, Sequence

import numpy as np

__all__ = ["Draws", "RunScores", "aggregate", "draw", "metrics_on_draws", "run_metrics", "runs_from_results",
           "with_baseline"]

METRICS = ("op", "bwt", "fwt")


@dataclass
class RunScores:
    """One run's per-query scores by stage name; ``order`` is the order it learned the stages."""

    order: list[str]
    final: dict[str, np.ndarray]  # A[T-1, τ]
    diagonal: dict[str, np.ndarray]  # A[τ, τ]
    next: dict[str, np.ndarray]  # A[τ-1, τ], for every stage but the first learned
    baseline: dict[str, np.ndarray] | None  # b[τ]


def runs_from_results(results: Sequence[Mapping]) -> list[RunScores]:
    """RunScores of result.json dicts (their ``per_query`` block); refuses runs whose stages or
    per-stage query counts differ, since the bootstrap pairs queries across runs."""
    runs = []
    for r in results:
        pq, names = r.get("per_query"), list(r["stage_names"])
        if not isinstance(pq, dict):
            raise ValueError(f"{r.get('out_dir', 'a result')} has no per_query scores (written before they were kept)")
        f = {n: np.asarray(v, np.float64) for n, v in zip(names, pq["final"])}
        d = {n: np.asarray(v, np.float64) for n, v in zip(names, pq["diagonal"])}
        nx = {n: np.asarray(v, np.float64) for n, v in zip(names[1:], pq["next"][1:])}
        b = None if not pq.get("baseline") else {n: np.asarray(v, np.float64) for n, v in zip(names, pq["baseline"])}
        runs.append(RunScores(names, f, d, nx, b))
    if runs:
        sizes = {n: len(v) for n, v in runs[0].final.items()}
        for r in runs[1:]:
            if {n: len(v) for n, v in r.final.items()} != sizes:
                raise ValueError("runs disagree in their stages or in the number of queries per stage")
    return runs


def with_baseline(runs: Sequence[RunScores], baseline: Mapping) -> list[RunScores]:
    """The runs with FWT's b[τ] replaced by another non-learning method's per-query scores (its
    result.json, e.g. ``frozen-labels``'), which scored the same rows."""
    (b,) = runs_from_results([baseline])
    out = []
    for r in runs:
        if {n: len(v) for n, v in b.final.items()} != {n: len(v) for n, v in r.final.items()}:
            raise ValueError("the baseline scored other stages or another number of queries per stage")
        out.append(RunScores(r.order, r.final, r.diagonal, r.next, dict(b.final)))
    return out


def _means(scores: dict[str, np.ndarray], idx: dict[str, np.ndarray] | None) -> dict[str, np.ndarray]:
    """Per stage: the mean score, or (idx given) one mean per replicate row of idx."""
    if idx is None:
        return {n: np.asarray(v.mean()) for n, v in scores.items()}
    return {n: v[idx[n]].mean(axis=-1) for n, v in scores.items()}


def _metrics(run: RunScores, idx: dict[str, np.ndarray] | None) -> dict[str, np.ndarray | None]:
    """OP, BWT, FWT (0..100) of one run: scalars, or one per bootstrap replicate."""
    o = run.order
    f, d = _means(run.final, idx), _means(run.diagonal, idx)
    op = 100.0 * np.mean([f[n] for n in o], axis=0)
    bwt = 100.0 * np.mean([f[n] - d[n] for n in o[:-1]], axis=0) if len(o) > 1 else None
    fwt = None
    if run.baseline is not None and len(o) > 1:
        nx, b = _means(run.next, idx), _means(run.baseline, idx)
        fwt = 100.0 * np.mean([nx[n] - b[n] for n in o[1:]], axis=0)
    return {"op": op, "bwt": bwt, "fwt": fwt}


def run_metrics(run: RunScores) -> dict[str, float | None]:
    """OP, BWT and FWT of one run on all its queries (what ``CLMatrix`` gives from its cells)."""
    return {k: None if v is None else float(v) for k, v in _metrics(run, None).items()}


@dataclass
class Draws:
    """One bootstrap's random draws: seeds (B, S) and per-stage query indices (B, n_stage)."""

    seeds: np.ndarray
    queries: dict[str, np.ndarray]


def draw(runs: Sequence[RunScores], n_boot: int, rng: np.random.Generator) -> Draws:
    S = len(runs)
    seeds = rng.integers(0, S, size=(n_boot, S))
    queries = {n: rng.integers(0, len(v), size=(n_boot, len(v))) for n, v in sorted(runs[0].final.items())}
    return Draws(seeds, queries)


def metrics_on_draws(runs: Sequence[RunScores], dr: Draws) -> dict[str, np.ndarray | None]:
    """Each metric's bootstrap replicates: mean over each replicate's drawn seeds of that seed's
    metric on the replicate's drawn queries."""
    per_run = [_metrics(r, dr.queries) for r in runs]  # per run: (B,) arrays
    out: dict[str, np.ndarray | None] = {}
    B, S = dr.seeds.shape
    for k in METRICS:
        if any(p[k] is None for p in per_run):
            out[k] = None
            continue
        M = np.stack([p[k] for p in per_run], axis=1)  # (B, runs)
        out[k] = np.take_along_axis(M, dr.seeds, axis=1).mean(axis=1)
    return out


def aggregate(runs: Sequence[RunScores], n_boot: int = 2000, level: float = 0.95,
              seed: int = 0) -> dict[str, dict | None]:
    """Per metric: the mean over runs, each run's value, and the bootstrap interval."""
    if not runs:
        raise ValueError("no runs to aggregate")
    if not 0.0 < level < 1.0:
        raise ValueError(f"level must lie in (0, 1), got {level}")
    single = [run_metrics(r) for r in runs]
    reps = metrics_on_draws(runs, draw(runs, n_boot, np.random.default_rng(seed)))
    q = [(1.0 - level) / 2.0, (1.0 + level) / 2.0]
    out: dict[str, dict | None] = {}
    for k in METRICS:
        if reps[k] is None:
            out[k] = None
            continue
        vals = [s[k] for s in single]
        lo, hi = np.quantile(reps[k], q)
        out[k] = {"mean": float(np.mean(vals)), "per_run": vals, "ci": [float(lo), float(hi)], "level": level}
    out["n_runs"] = len(runs)  # type: ignore[assignment]
    return out
