"""A teach's two kinds of worker job: decode one batch of examples' keys, and commit them all.

Why two: decoding (one prompt pass per example, a quarter to half a second each on a CPU) is
nearly all of a teach's time, and must run on the one llama.cpp context; the bank write, budget
repair and commit that follow need no decode once the keys are known. So a teach decodes
``batch`` examples per worker job, with answers queued in between (``jobs.run_teach``), and keeps
what it decoded in a ``RowCache``; the commit is one more job, an ordinary ``Miita.ingest`` of all
the rows that finds every decode in the cache. That ingest is the same call a synchronous teach
makes, through the same seam the results sweep shares decode passes with (``Miita.extract_cache``,
``method.ingest.extract_examples``): what a decode pass computes depends only on the model, the
template, the example and the extraction settings, never on what the memory holds, so keys decoded
before another writer's commit are still the keys of the memory that commit made.
"""
from __future__ import annotations

import json
from typing import Any

from ..method.ingest import extract_examples
from ..streams import Example


class RowCache:
    """An in-memory ``ExtractCache``: the decode passes of one teach, dropped with it."""

    MISS = object()

    def __init__(self) -> None:
        self._rows: dict[str, Any] = {}
        self.hits = 0
        self.misses = 0

    @staticmethod
    def _key(kind: str, fields: dict) -> str:
        return json.dumps({"kind": kind, **fields}, sort_keys=True, ensure_ascii=False)

    def get(self, kind: str, fields: dict):
        key = self._key(kind, fields)
        if key not in self._rows:
            self.misses += 1
            return self.MISS
        self.hits += 1
        return self._rows[key]

    def put(self, kind: str, fields: dict, value) -> None:
        self._rows[self._key(kind, fields)] = value

    def __len__(self) -> int:
        return len(self._rows)


class Progress:
    """``extract_examples``'s progress bar: counts decoded examples into the job (read by polls)."""

    def __init__(self, job) -> None:
        self.job = job

    def update(self, n: int) -> None:
        if self.job.state == "running":  # not after a cancel, while the batch in hand finishes
            self.job.done += n

    def close(self) -> None:
        pass


def decode_batch(r, job, cache: RowCache, rows: list[Example]) -> None:
    """On the worker: decode ``rows`` into ``cache`` for the memory at its committed version, with
    the keys that version's ``ingest`` would ask for (``Miita.keyed_engine``: the layers and the
    special-token rule of this memory, which an answer on another memory may have changed)."""
    if job.state == "queued":
        job.mark_running()
    m = r.memory(job.memory)
    eng = m.keyed_engine()
    extract_examples(eng, m.template, m.preset, rows, max_prompt_tokens=m.max_prompt_tokens, cache=cache,
                     bar=Progress(job))


def commit_rows(r, name: str, cache: RowCache, rows: list[Example], budget: str | None):
    """On the worker: one ``Miita.ingest`` of every row, decodes read from ``cache`` (through
    ``Registry.write``, which reopens and retries when another process committed meanwhile)."""

    def op(m):
        saved, m.extract_cache = m.extract_cache, cache
        try:
            return m.ingest(rows, budget=budget, progress=False)
        finally:
            m.extract_cache = saved

    return r.write(name, op)
