"""Ingest as a pipeline: examples → eqs. 1-2 (key, target, correction) → bank write → budget repair.

The facade (:class:`miita_edge.Miita`) owns the store, its lock and the commit; this module does
the work between them and touches no file. It mutates only what it is handed: the bank and the
stream counters (their new values are what the facade commits).
"""
from __future__ import annotations

import sys
from dataclasses import asdict, dataclass, field
from typing import Iterable, Sequence

import numpy as np

from ..errors import BudgetError
from ..memory.bank import MemoryBank
from ..memory.manifest import Manifest, StreamCounts, call_stream_bytes
from ..runtime.engine import Engine
from ..streams import Example
from .extract import (HIDDEN_BATCH_EXAMPLES, HIDDEN_R_MAX_TOKENS, Extracted, PendingR, extract, extract_keys,
                      finish_corrections)
from .presets import Preset
from .templates import Template, key_template

__all__ = ["IngestReport", "StreamCounts", "call_stream_bytes", "extract_examples", "learn", "progress_bar"]


@dataclass
class IngestReport:
    examples: int
    skipped: int
    prototypes: int
    anchors: int
    bytes: int
    budget_bytes: int | None
    repair: dict
    seconds: float
    skipped_lines: list[int] = field(default_factory=list)

    def to_json(self) -> dict:
        return asdict(self)


def per_position(preset: Preset) -> bool:
    return preset.bank.payload != "mean"  # the mean payload needs only R_m


#: Examples whose keys one batched decode computes (default preset: no corrections to compute).
KEY_BATCH_EXAMPLES = 32


def extract_examples(engine: Engine, template: Template, preset: Preset, examples: Sequence[Example], *,
                     max_prompt_tokens: int | None = None, cache=None, bar=None,
                     batch_keys: bool = False) -> list[Extracted | None]:
    """eqs. 1-2 for every example, in order (None: the example cannot be learned, e.g. an
    answer that tokenises to nothing). Examples whose exact R comes from the hidden rows are
    decoded one by one and their R computed HIDDEN_BATCH_EXAMPLES at a time in one shared pass
    over the LM head (bitwise the per-example result, ``finish_corrections``). Goes through
    ``cache`` (an ``ExtractCache``) when one is given, so sweeps share decode passes. Without
    corrections to compute (the ``tokens`` payload) and with ``batch_keys``, prompts are decoded
    several at a time as separate sequences (:func:`extract_keys`)."""
    need_R = preset.bank.payload != "tokens"
    # a key-only pass renders the key's own prompt (the target stays the memory's); a preset that
    # computes corrections keys the answer's prompt (``Preset.validate_keys``)
    template = key_template(preset.key_prompt, template)
    bar = bar or progress_bar(0, False, "")
    if not need_R and batch_keys and cache is None:
        out: list[Extracted | None] = []
        for i in range(0, len(examples), KEY_BATCH_EXAMPLES):
            part = examples[i:i + KEY_BATCH_EXAMPLES]
            out += extract_keys(engine, template, [(ex.input, ex.output) for ex in part], skip_bos=preset.skip_bos,
                                max_prompt_tokens=max_prompt_tokens)
            bar.update(len(part))
        return out
    out: list[Extracted | None] = [None] * len(examples)
    pending: list[tuple[int, PendingR, dict | None]] = []

    def flush():
        done = finish_corrections(engine, [p for _, p, _ in pending], per_position(preset))
        for (i, _, fields), e in zip(pending, done):
            out[i] = e
            if fields is not None:
                cache.put("extract", fields, _cache_value(e))
            bar.update(1)
        pending.clear()

    for i, ex in enumerate(examples):
        r, fields = _extract_one(engine, template, preset, ex, need_R, max_prompt_tokens, cache)
        if isinstance(r, PendingR):
            pending.append((i, r, fields))
            if len(pending) >= HIDDEN_BATCH_EXAMPLES:
                flush()
            continue
        out[i] = r
        bar.update(1)
    flush()
    return out


def _cache_value(e: Extracted | None) -> dict | None:
    if e is None:
        return None
    out = {"prompt": np.asarray(e.prompt, np.int64), "target": np.asarray(e.target, np.int64),
           "key": np.asarray(e.key)}
    if e.R is not None:
        out["R"] = np.asarray(e.R)
    return out


def _extract_one(engine: Engine, template: Template, pr: Preset, ex: Example, need_R: bool,
                 max_prompt_tokens: int | None, cache) -> tuple[Extracted | PendingR | None, dict | None]:
    """eqs. 1-2 for one example, through ``cache`` when one is set: (the extraction or a
    PendingR whose R is still to be computed, the cache fields to store it under)."""
    fields = None
    if cache is not None:
        fields = {"what": "extract", "prompt": template.render_prompt(ex.input),
                  "target": template.render_target(ex.output), "skip_bos": pr.skip_bos,
                  "corrections": need_R, "top_k": pr.correction_top_k, "per_position": per_position(pr),
                  "max_prompt_tokens": max_prompt_tokens, "n_batch": engine.config.n_batch,
                  "key_layers": list(engine.key_layers)}
        if any(p != "mean" for p in engine.key_pooling):  # mean-pooled entries keep their fields
            fields["key_pooling"] = list(engine.key_pooling)
        if need_R and pr.correction_top_k <= 0:
            # since the one-pass kernel, short answers' exact R is softmax(W h), not llama.cpp's
            # logits; key-only passes (the default preset) are unchanged and keep their entries
            fields["exact_R_from"] = f"hidden<={HIDDEN_R_MAX_TOKENS}"
        a = cache.get("extract", fields)
        if a is not cache.MISS:
            if a is None:
                return None, None
            return Extracted([int(t) for t in a["prompt"]], [int(t) for t in a["target"]], a["key"],
                             a.get("R")), None
    r = extract(engine, template, ex.input, ex.output, skip_bos=pr.skip_bos,
                corrections=need_R, top_k=pr.correction_top_k, max_prompt_tokens=max_prompt_tokens,
                per_position=per_position(pr), defer=True)
    if fields is not None and not isinstance(r, PendingR):
        cache.put("extract", fields, _cache_value(r))
    return r, fields


def learn(bank: MemoryBank, preset: Preset, examples: Sequence[Example], extracted: Iterable[Extracted | None],
          record: Manifest, *, limit: int | None, evidence_of=None) -> tuple[list[int], dict]:
    """Write each extraction into ``bank`` in stream order and repair after each one (eqs. 3-5).

    ``limit`` is the byte budget for the whole call (None: unlimited): a fractional budget is
    resolved by the caller once, against ``call_stream_bytes`` — the stream as it will be after
    this call — not against the stream so far at each example, which would leave a fresh memory
    a few bytes for its first rows (a ``5%`` budget of one 40-byte row is 2 bytes). The memory
    stays within ``limit`` after every example, measured as ``record.committed_size``: the exact
    committed size, which reads ``record.counts`` too (the manifest holds them), so the counts are
    updated before each repair. ``evidence_of(example)``: the input's tokens the bank keeps as an
    answer's evidence (method/verify), or None. Returns (the lines of skipped examples, the repair
    counts)."""
    counts = record.counts
    total_log = {"pruned": 0, "narrowed": 0, "merged": 0, "evicted": 0}
    skipped_lines: list[int] = []
    stream = counts.stream_bytes
    for ex, e in zip(examples, extracted):
        stream += len(ex.input.encode()) + len(ex.output.encode())
        if e is None:
            counts.skipped += 1
            skipped_lines.append(ex.line)
            continue
        if preset.bank.payload == "mean":
            dirs = e.R_mean[None]
        elif preset.bank.payload == "sequence":
            dirs = e.R
        else:
            dirs = np.zeros((0, bank.n_embd), np.float32)
        bank.write(dirs, np.asarray(e.target), e.key, None if evidence_of is None else evidence_of(ex))
        counts.examples += 1
        counts.stream_bytes = stream
        if limit is not None:
            try:
                log = bank.repair(limit, record.committed_size)
            except BudgetError as exc:
                raise BudgetError(f"{exc} (line {ex.line}; budget {record.budget.spec} = {limit} bytes)") from None
            for k in total_log:
                total_log[k] += getattr(log, k)
    counts.stream_bytes = stream
    return skipped_lines, total_log


def progress_bar(total: int, enabled: bool | None, desc: str):
    """A tqdm bar on stderr when it is a terminal (or when asked), else a no-op with the same API."""
    if enabled is None:
        enabled = sys.stderr.isatty()
    if enabled:
        try:
            from tqdm import tqdm  # optional: without it the bar is a no-op

            return tqdm(total=total, desc=desc, unit="ex", file=sys.stderr)
        except ImportError:  # pragma: no cover
            pass

    class _Null:
        def update(self, n): ...

        def close(self): ...

    return _Null()
