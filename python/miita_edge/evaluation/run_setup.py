"""Step 1 of a continual-learning run: check the arguments, read the rows, resolve the budget and
write down the configuration that decides whether finished cells may be reused (``run.json``).

Kept apart from the runner so that everything a run's numbers depend on is resolved in one place,
before any model is loaded.
"""
from __future__ import annotations

import hashlib
import json
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ..errors import BudgetError, InputError
from ..memory.budget import parse_budget
from ..streams import stream_bytes
from .benchmarks import BenchSpec, Stage, check_limit, get_benchmark, load_benchmark
from .registry import MethodInfo, get_method
from .splits import ANSWER_STARTS, DEV_RULE, REPORT_RULE

__all__ = ["AUTO", "CELL_MODES", "RESULT_FORMAT", "RunSetup", "claim_out_dir", "prepare_run", "read_json", "safe_name",
           "sha", "stage_records_frozen", "write_json"]

RESULT_FORMAT = "miita-edge-bench/1"
CELL_MODES = ("all", "summary", "final")
AUTO = "auto"  # max_prompt_tokens: the benchmark's own limit


def sha(obj: Any) -> str:
    return hashlib.sha256(json.dumps(obj, sort_keys=True, ensure_ascii=False).encode("utf-8")).hexdigest()


def write_json(path: Path, obj: Any) -> None:
    from .report import write_json as _w

    _w(obj, path)


def read_json(path: Path) -> Any | None:
    try:
        return json.loads(path.read_text("utf-8"))
    except (OSError, ValueError):
        return None


def safe_name(name: str) -> str:
    return re.sub(r"[^A-Za-z0-9_.-]+", "_", name)[:80]


def _model_id(model, engine) -> dict:
    if engine is not None:
        p = Path(engine.info.path)
    else:
        from ..runtime.default_model import resolve_model_path

        p = resolve_model_path(model)
    try:
        size = p.stat().st_size
    except OSError:
        size = None
    return {"file": p.name, "bytes": size}


@dataclass
class RunSetup:
    """Everything resolved before the first cell: what is run, on which rows, under which budget."""

    spec: BenchSpec
    method: str
    info: MethodInfo
    baseline: str | None
    base_info: MethodInfo | None
    learns: bool
    stores: bool
    budget: str
    budget_bytes: int | None
    learned_stream: int
    #: the stream the budget is a share of: what a test (or dev) run of the same options learns. A
    #: report run learns less (its report rows are held out), and its budget is still the test run's,
    #: so that "1%" is one byte count on every split
    budget_base: int
    meta: dict
    stages: list[Stage]
    max_tokens: int
    max_prompt_tokens: int | None
    model_id: dict | None
    data_hashes: list[dict]
    config: dict
    config_hash: str
    out: Path
    cells_mode: str
    limits: tuple[int | None, int | None]
    settings: dict | None = None  # the method's versioned settings (Method.provenance), for the result
    answer_start: str = "newline"  # where the newline stop may end an answer (ANSWER_STARTS)

    @property
    def names(self) -> list[str]:
        return [s.name for s in self.stages]

    @property
    def T(self) -> int:
        return len(self.stages)


def _check_prompt_limit(spec: BenchSpec, max_prompt_tokens):
    if max_prompt_tokens == AUTO:
        max_prompt_tokens = spec.max_prompt_tokens
    if max_prompt_tokens is not None:
        from ..method.extract import PROMPT_TAIL_TOKENS

        if isinstance(max_prompt_tokens, bool) or not isinstance(max_prompt_tokens, int) \
                or max_prompt_tokens <= PROMPT_TAIL_TOKENS:
            raise InputError(f"max_prompt_tokens must be an integer > {PROMPT_TAIL_TOKENS}, got {max_prompt_tokens!r}")
    return max_prompt_tokens


def _config(spec, method, budget, budget_bytes, stages, data_hashes, max_tokens, max_prompt_tokens, model_id,
            cells, split, rows, order_seed) -> dict:
    config = {"format": RESULT_FORMAT, "benchmark": spec.name, "method": method, "budget": budget,
              "budget_bytes": budget_bytes, "stages": [s.name for s in stages], "n_train": [len(s.train) for s in stages],
              "n_test": [len(s.test) for s in stages], "data": data_hashes, "template": spec.template,
              "metric": spec.metric, "max_tokens": max_tokens, "max_prompt_tokens": max_prompt_tokens,
              "model": model_id, "split": split, "dev_rule": DEV_RULE + ("; report rows: " + REPORT_RULE if split == "report" else ""), "rows": [s.rows for s in stages],
              "row_window": rows, "order_seed": order_seed}
    if cells != "all":  # absent for "all", so results written before the option still resume
        config["cells"] = cells
    return config


def prepare_run(benchmark: str, data_dir, method: str, out_dir, *, budget: str, stages, limit_per_stage,
                limit_train_per_stage, max_tokens, engine, max_prompt_tokens, baseline, model, cells,
                split: str = "test", rows: str | None = None, order_seed: int = 0, replies=None,
                answer_start: str = "newline") -> RunSetup:
    """Check every argument (one-line errors), read the rows and resolve the budget to bytes."""
    spec = get_benchmark(benchmark)
    if answer_start not in ANSWER_STARTS:
        raise InputError(f"answer_start must be one of {', '.join(ANSWER_STARTS)}, got {answer_start!r}")
    info = get_method(method)
    if cells not in CELL_MODES:
        raise InputError(f"cells must be one of {', '.join(CELL_MODES)}, got {cells!r}")
    base_info = get_method(baseline) if baseline is not None else None
    probe = info.factory()
    for name, inf in ((method, info), (baseline, base_info)):
        if inf is not None and inf.factory().classification_only and not spec.classification:
            raise InputError(f"method {name!r} is for classification benchmarks only (banking77, dsc), not {benchmark!r}")
    if max_tokens is None:
        max_tokens = spec.max_tokens
    check_limit("max_tokens", max_tokens)
    max_prompt_tokens = _check_prompt_limit(spec, max_prompt_tokens)
    b = parse_budget(budget)
    if limit_train_per_stage is None:
        limit_train_per_stage = limit_per_stage
    elif limit_train_per_stage == 0:  # explicitly: every training row
        limit_train_per_stage = None
    meta, stages_ = load_benchmark(spec, data_dir, stages, limit_per_stage, limit_train_per_stage, split=split,
                                   rows=rows, order_seed=order_seed, replies=replies)
    learned_stream = stream_bytes(ex for s in stages_ for ex in s.train)
    budget_base = learned_stream
    if split == "report":  # the budget of a test run of the same options: report rows are held out, not unbudgeted
        _, test_like = load_benchmark(spec, data_dir, stages, limit_per_stage, limit_train_per_stage, split="dev",
                                      order_seed=order_seed, replies=replies)
        budget_base = stream_bytes(ex for s in test_like for ex in s.train)
    budget_bytes = None if b.unlimited else b.resolve(budget_base)
    if budget_bytes == 0:
        raise BudgetError(f"budget {budget} of the {budget_base}-byte training stream is 0 bytes; "
                          "give a larger --budget or learn more examples")
    needs_model = probe.needs_model or (base_info is not None and base_info.factory().needs_model)
    model_id = _model_id(model, engine) if needs_model else None
    data_hashes = [{"stage": s.name, "train": sha([[e.input, e.output] for e in s.train]),
                    "test": sha([[it.example.input, it.golds, it.lang] for it in s.test])} for s in stages_]
    config = _config(spec, method, budget, budget_bytes, stages_, data_hashes, max_tokens, max_prompt_tokens,
                     model_id, cells, split, rows, order_seed)
    if replies is not None:  # only then: configurations of runs on the package's replies keep their hash
        config["replies_file"] = str(Path(replies).expanduser())
    if answer_start != "newline":  # only then: configurations of the archived runs keep their hash
        config["answer_start"] = answer_start
    return RunSetup(spec, method, info, baseline, base_info, probe.learns, probe.stores, budget, budget_bytes,
                    learned_stream, budget_base, meta, stages_, max_tokens, max_prompt_tokens, model_id, data_hashes, config,
                    sha(config), Path(out_dir).expanduser(), cells, (limit_per_stage, limit_train_per_stage),
                    probe.provenance(), answer_start)


def budget_stream(base: int, learned: int) -> str:
    """What a fractional budget was a share of, in words: the stream the run learned, or (a report
    run) the stream a test run of the same options learns."""
    return "learned stream" if base == learned else "stream a test run learns"


def claim_out_dir(setup: RunSetup) -> None:
    """Refuse an out_dir holding another configuration; record this one in ``run.json``."""
    out, config = setup.out, setup.config
    old = read_json(out / "run.json")
    if old is not None and old.get("config") != config:
        diff = sorted(k for k in set(config) | set(old.get("config") or {})
                      if (old.get("config") or {}).get(k) != config.get(k))
        raise InputError(f"{out} holds a run with another configuration (differs in: {', '.join(diff)}); "
                         "use another --out or delete it")
    out.mkdir(parents=True, exist_ok=True)
    write_json(out / "run.json", {"config": config, "config_hash": setup.config_hash})


def stage_records_frozen(setup: RunSetup) -> dict[int, dict]:
    """Per-stage records of a method that learns nothing: no time, no bytes."""
    st = setup.stages
    return {t: {"t": t, "stage": st[t].name, "n_train": len(st[t].train), "learn_seconds": 0.0, "memory_bytes": 0,
                "stream_bytes_learned": sum(stream_bytes(st[k].train) for k in range(t + 1))}
            for t in range(setup.T)}

