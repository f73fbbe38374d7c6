"""Key extraction on several llama.cpp contexts at once, one Python thread each.

A key-only pass (the default preset: no corrections to compute) is arithmetic on a few dozen
tokens; on a 2-core machine one context with two threads leaves part of both cores idle at every
operation's barrier, and batching prompts as separate sequences on one context stops gaining
past a few dozen per decode (docs/benchmarks.md). Two contexts with one thread each, sharing the loaded model
(``runtime.contexts.sibling``), each decoding 32 prompts per call, keep both cores busy.
``llama_decode`` is a ctypes call and releases the GIL, so Python threads are enough.

The stream is cut into shards of :data:`~.ingest.KEY_BATCH_EXAMPLES` consecutive examples; each
context takes the next shard when it is free, and results come back in stream order while later
shards are still decoding, so the caller writes the bank as they arrive. A shard's decodes are
the same whichever context runs it (same sequences per decode, same grouping), and llama.cpp's CPU
kernels compute each output element on one thread, so the keys do not depend on which context or
how many contexts ran it: bitwise equal to a one-context batched extraction of the same shards
(tested), and equal to the one-prompt-per-decode keys within rounding (batch shapes decide which
kernel path a row takes; the tolerance is :func:`.extract.extract_keys`'s).
"""
from __future__ import annotations

import queue
import threading
from dataclasses import dataclass
from typing import Iterator, Sequence

from ..runtime.contexts import siblings
from ..runtime.engine import Engine
from ..streams import Example
from .extract import Extracted, extract_keys
from .templates import Template

__all__ = ["ThreadExtractor", "KEY_SEQS_PER_DECODE"]

#: Prompts per ``llama_decode`` in each context: past the point where the rate stops rising
#: (docs/benchmarks.md), and one shard per decode.
KEY_SEQS_PER_DECODE = 32


@dataclass
class ThreadExtractor:
    """Extract keys of a stream's examples on ``contexts`` sibling contexts of ``engine``.

    Call it like ``extract_examples`` for a key-only preset: ``extractor(examples, bar)`` yields
    one ``Extracted | None`` per example, in stream order. ``threads``: llama.cpp threads per
    context. The contexts are the engine's (``runtime.contexts.siblings``): made on first use, reused
    by later calls and by other memories on the same engine, freed when the engine closes."""

    engine: Engine
    template: Template
    skip_bos: bool
    contexts: int = 2
    threads: int = 1
    max_prompt_tokens: int | None = None
    shard: int = 32

    def __post_init__(self) -> None:
        if self.contexts < 1 or self.threads < 1 or self.shard < 1:
            raise ValueError(f"contexts, threads and shard must be >= 1, got {self.contexts}, {self.threads}, "
                             f"{self.shard}")

    def _contexts(self) -> list[Engine]:
        pool = siblings(self.engine, self.contexts, self.threads, KEY_SEQS_PER_DECODE)
        for e in pool:  # the memory's key layers, whatever the engine pooled last
            if (e.key_layers, e.key_pooling) != (self.engine.key_layers, self.engine.key_pooling):
                e.set_key_layers(self.engine.key_layers, self.engine.key_pooling)
        return pool

    def __call__(self, examples: Sequence[Example], bar=None) -> Iterator[Extracted | None]:
        rows = [(ex.input, ex.output) for ex in examples]
        shards = [rows[i:i + self.shard] for i in range(0, len(rows), self.shard)]
        return self._run(shards, bar)

    def close(self) -> None:
        """Nothing to free: the contexts belong to the engine (the extractor protocol's close)."""

    def _run(self, shards: list[list[tuple[str, str]]], bar) -> Iterator[Extracted | None]:
        pool = self._contexts()
        todo: queue.SimpleQueue[int] = queue.SimpleQueue()
        for j in range(len(shards)):
            todo.put(j)
        done: dict[int, list | BaseException] = {}
        ready = threading.Condition()
        stop = threading.Event()

        def work(eng: Engine) -> None:
            while not stop.is_set():
                try:
                    j = todo.get_nowait()
                except queue.Empty:
                    return
                try:
                    got: list | BaseException = extract_keys(eng, self.template, shards[j], skip_bos=self.skip_bos,
                                                             max_prompt_tokens=self.max_prompt_tokens)
                except BaseException as exc:  # handed to the caller's thread, which raises it
                    got = exc
                    stop.set()
                with ready:
                    done[j] = got
                    ready.notify_all()

        workers = [threading.Thread(target=work, args=(e,), name=f"miita-keys-{i}", daemon=True)
                   for i, e in enumerate(pool)]
        for t in workers:
            t.start()
        try:
            for j in range(len(shards)):
                with ready:
                    while j not in done and not (stop.is_set() and not any(t.is_alive() for t in workers)):
                        ready.wait(0.1)
                    if j not in done:  # a worker failed on a later shard and the others stopped
                        raise next((v for v in done.values() if isinstance(v, BaseException)),
                                   RuntimeError("key extraction stopped"))
                    got = done.pop(j)
                if isinstance(got, BaseException):
                    raise got
                if bar is not None:
                    bar.update(len(got))
                yield from got
        finally:
            stop.set()  # the caller stopped early (an error while writing): no new shards
            for t in workers:
                t.join()
