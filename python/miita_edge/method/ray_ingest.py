"""Extraction (eqs. 1-2) on a Ray cluster, for streams too large for one machine's cores.

Only extraction is distributed: it is where ingest spends its time (one decode pass per example),
and it is a pure function of the model, the template, the preset and the example. Each worker is a
Ray actor that loads the model once and extracts contiguous shards of the stream; the driver
collects the results in stream order and applies them to the bank itself, with the same budget
repair, so the memory equals a single-machine ingest of the same stream (tested: the committed
arrays are identical on a local cluster).

Ray is an optional dependency (``pip install ".[ray]"``); nothing here imports it until a
cluster is asked for.
"""
from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Sequence

from ..errors import InputError
from ..runtime.engine import Engine, EngineConfig
from ..streams import Example
from .extract import Extracted
from .ingest import extract_examples
from .presets import Preset
from .templates import get_template

__all__ = ["RayExtractor"]


def _import_ray():
    try:
        import ray
    except ImportError:
        raise InputError('Ray is not installed; install it with: pip install "miita-edge[ray]"') from None
    return ray


@dataclass
class RayExtractor:
    """Extract a stream's examples on ``workers`` Ray actors; call it like ``extract_examples``.

    ``address``: a Ray cluster address (``ray.init(address)``), or None for a local cluster
    started here (and stopped in :meth:`close`). ``threads``: llama.cpp threads per worker
    (0: the CPUs Ray gives the actor). ``shard``: examples per task; small shards balance better,
    large ones pay less per-task overhead.
    """

    model_path: str
    preset_json: dict
    template: str
    max_prompt_tokens: int | None = None
    address: str | None = None
    workers: int = 2
    threads: int = 1
    shard: int = 16
    key_layers: list | None = None  # the memory's key layers (None: the engine's default)
    key_pooling: list | None = None  # their pooling (None: the mean of each)

    def __post_init__(self) -> None:
        if self.workers < 1:
            raise InputError(f"--contexts (Ray workers) must be >= 1, got {self.workers}")
        ray = _import_ray()
        self._started = False
        if not ray.is_initialized():
            try:
                if self.address:
                    ray.init(address=self.address, log_to_driver=False)
                else:
                    ray.init(num_cpus=max(self.workers, 1) * max(self.threads, 1), include_dashboard=False,
                             log_to_driver=False)
            except (ConnectionError, ValueError, RuntimeError) as exc:
                where = self.address or "a local cluster"
                raise InputError(f"cannot start or reach Ray at {where}: {str(exc).splitlines()[0]}") from None
            self._started = True
        actor = ray.remote(num_cpus=max(self.threads, 1))(_Worker)
        self._actors = [actor.remote(self.model_path, self.preset_json, self.template, self.max_prompt_tokens,
                                     self.threads, self.key_layers, self.key_pooling) for _ in range(self.workers)]

    def __call__(self, examples: Sequence[Example], bar=None) -> list[Extracted | None]:
        ray = _import_ray()
        rows = [(ex.input, ex.output) for ex in examples]
        shards = [rows[i:i + self.shard] for i in range(0, len(rows), self.shard)]
        futures = [self._actors[i % len(self._actors)].extract.remote(s) for i, s in enumerate(shards)]
        out: list[Extracted | None] = []
        pending = list(futures)
        results = {}
        while pending:
            done, pending = ray.wait(pending, num_returns=1)
            for f in done:
                results[f] = ray.get(f)
                if bar is not None:
                    bar.update(len(results[f]))
        for f in futures:  # stream order, whatever order the shards finished in
            out.extend(None if r is None else Extracted(*r) for r in results[f])
        return out

    def close(self) -> None:
        ray = _import_ray()
        for a in getattr(self, "_actors", []):
            ray.kill(a)
        self._actors = []
        if getattr(self, "_started", False) and ray.is_initialized():
            ray.shutdown()
            self._started = False


class _Worker:
    """One model per actor, loaded once; extracts shards as ``extract_examples`` does locally."""

    def __init__(self, model_path: str, preset_json: dict, template: str, max_prompt_tokens: int | None,
                 threads: int, key_layers: list | None = None, key_pooling: list | None = None) -> None:
        n = threads or len(os.sched_getaffinity(0))
        self.engine = Engine(model_path, EngineConfig(n_threads=n))
        if key_layers is not None:
            self.engine.set_key_layers(key_layers, key_pooling)
        self.preset = Preset.from_json(preset_json)
        self.template = get_template(template)
        self.max_prompt_tokens = max_prompt_tokens

    def extract(self, rows: list[tuple[str, str]]):
        exs = [Example(x, y, line=i + 1) for i, (x, y) in enumerate(rows)]
        got = extract_examples(self.engine, self.template, self.preset, exs, max_prompt_tokens=self.max_prompt_tokens)
        return [None if e is None else (e.prompt, e.target, e.key, e.R) for e in got]
