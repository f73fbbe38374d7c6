"""Where each generated step's logits come from (``Engine.generate``): one decode per step, or the
memory's stored answer as a draft that one batched decode verifies (exact speculative decoding).

Why a draft: a steered step is a sequential one-token decode (and step 0 decodes the prompt's last
token again with the addition on), so a steered answer costs more per token than the frozen model,
while the memory usually knows the answer it is steering towards. The addition is made on
result_norm, after every layer, so the KV cache does not depend on it: the rows [x, g_0, ..,
g_{m-1}] (x the step's input token, g the draft) can be decoded in one call, row r with the
direction the plan gives step s + r after the prefix g[:r] (``Engine.set_steer`` with one direction
per row). Row r's logits are then those the sequential path computes at step s + r had it produced
g[:r] (up to the rounding of a batched matrix product). The caller samples from them in order, as
it would step by step, with the same sampler and random stream: while the sampled token is the
draft's, the next row stands; at the first other token (or an end), the token sampled there is
kept, the rows after it are dropped from the KV cache and their alphas from the report, and
decoding goes on one step at a time. So each token is drawn from the distribution the sequential
path has at its position, with sampling as with greedy decoding.

The engine is duck-typed here (``truncate``, ``decode``, ``set_steer``, ``n_past``, ``native``,
``config``): this module sits below ``runtime.engine``, and the bookkeeping can be tested against a
fake one.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Sequence

import numpy as np

#: A plan's draft: the tokens the memory expects after ``generated`` (the leading stored answer's
#: rest), [] where it has none.
DraftFn = Callable[[Sequence[int]], Sequence[int]]


@dataclass
class _Batch:
    """One verified batch: it starts at ``step`` with ``base`` positions in the cache; row r holds the
    logits and the direction of step ``step + r`` after the prefix ``draft[:r]``."""

    step: int
    base: int
    draft: list[int]
    logits: np.ndarray  # (len(draft) + 1, V)
    dirs: list  # per row: the direction, or None (the row was decoded without one)
    alpha_at: list  # per row: the index of its alpha in native.alphas(), or None (none logged / no direction)
    used: int = 0  # the last row whose logits were handed out


def draft_rows(step: int, generated: Sequence[int], draft: Sequence[int], plan, first) -> list:
    """The direction of each batch row: row 0's is ``first`` (the plan's at ``step``), row r's the
    plan's at ``step + r`` after the prefix ``generated + draft[:r]``."""
    prefix = list(generated)
    dirs = [first]
    for r, tok in enumerate(draft, start=1):
        prefix.append(int(tok))
        dirs.append(plan(step + r, prefix))
    return dirs


class Steps:
    """The logits of each step of one generation, in step order.

    ``draft`` None: one decode per step (the sequential path). Otherwise, at a steered step where no
    verified row applies, the draft ``draft(generated)`` (at most ``max_draft`` tokens, 0: no limit)
    is decoded with the step's input token in one batch, and the rows are handed out while the
    generated tokens follow the draft. ``finish()`` drops what was decoded beyond the last row used;
    ``dropped`` then lists the indices of ``native.alphas()`` that no step used."""

    def __init__(self, engine, state, plan, eta: float, mode: str, max_tokens: int,
                 draft: DraftFn | None = None, max_draft: int = 0):
        self.engine, self.state, self.plan = engine, state, plan
        self.eta, self.mode, self.max_tokens = eta, mode, max_tokens
        self.draft, self.max_draft = draft, max_draft
        self.dropped: set[int] = set()
        self.batch: _Batch | None = None
        self.batches = 0  # batched decodes of more than one row (benches, tests)

    def logits(self, step: int, generated: Sequence[int]) -> tuple[np.ndarray, np.ndarray | None]:
        """(the logits step ``step`` samples from, the direction they were steered with)."""
        b = self.batch
        if b is not None:
            r = step - b.step
            if r <= len(b.draft) and int(generated[step - 1]) == b.draft[r - 1]:
                b.used = r
                return b.logits[r], b.dirs[r]
            self._close()
        e = self.engine
        d = self.plan(step, generated) if self.plan is not None else None
        if d is None:
            if step == 0:
                return self.state.logits, None
            e.set_steer(None, None, 0.0, "off")
            return e.decode([generated[-1]], "last")[0], None
        if step == 0:  # re-decode the last prompt token with the addition on
            e.truncate(len(self.state.tokens) - 1)
            last = self.state.tokens[-1]
        else:
            last = generated[-1]
        draft = self._draft(step, generated)
        if not draft:
            e.set_steer(d, self.state.h_q, self.eta, self.mode)
            return e.decode([last], "last")[0], d
        return self._verify(step, generated, d, last, draft)

    def _draft(self, step: int, generated: Sequence[int]) -> list[int]:
        """The draft tokens to verify after ``step``'s input, cut to what the generation, the batch
        and the context can take (row m predicts step + m, which must be < max_tokens)."""
        if self.draft is None:
            return []
        e = self.engine
        room = min(self.max_tokens - step - 1, e.config.n_batch - 1, e.config.n_ctx - e.n_past - 1)
        if self.max_draft > 0:
            room = min(room, self.max_draft)
        if room <= 0:
            return []
        return [int(t) for t in list(self.draft(generated))[:room]]

    def _verify(self, step: int, generated: Sequence[int], d: np.ndarray, last: int, draft: list[int]):
        """Decode [last] + draft in one call, row r steered with its step's direction (zeros for a row
        without one); hand out row 0."""
        e = self.engine
        dirs = draft_rows(step, generated, draft, self.plan, d)
        rows = np.zeros((len(dirs), len(d)), np.float32)
        for r, x in enumerate(dirs):
            if x is not None:
                rows[r] = x
        base = e.n_past
        before = len(e.native.alphas())
        e.set_steer(rows, self.state.h_q, self.eta, self.mode)
        try:
            out = e.decode([last] + draft, "all")
        finally:  # per-row directions fit only this batch; every later decode sets its own steering
            e.set_steer(None, None, 0.0, "off")
        logged = len(e.native.alphas()) - before  # every row, or none (mode off logs nothing)
        alpha_at = [before + r if logged and dirs[r] is not None else None for r in range(len(dirs))]
        if logged:
            self.dropped.update(before + r for r in range(len(dirs)) if dirs[r] is None)
        self.batch = _Batch(step, base, draft, out, dirs, alpha_at)
        self.batches += 1
        return out[0], d

    def _close(self) -> None:
        """End the open batch: its rows after the last one used leave the cache and the alphas."""
        b = self.batch
        self.batch = None
        self.engine.truncate(b.base + b.used + 1)
        self.dropped.update(i for i in b.alpha_at[b.used + 1:] if i is not None)

    def settle(self) -> int | None:
        """End an open batch at the row just handed out, so that the cache ends with this step's input
        as one decode per step leaves it (the hold decodes that step again); the index of this step's
        alpha in ``native.alphas()`` (None: none was logged)."""
        b = self.batch
        if b is None:
            n = len(self.engine.native.alphas())
            return n - 1 if n else None
        at = b.alpha_at[b.used]
        self._close()
        return at

    def finish(self) -> None:
        """The generation ended: drop what the open batch decoded beyond the last row used."""
        if self.batch is not None:
            self._close()
