"""The values the engine takes and gives: its configuration, what a prompt pass leaves for
retrieval, a generation, a steering plan; and where a preset's key layers fall in a model."""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable, Sequence

import numpy as np

from .key_pooling import key_mean

__all__ = ["DEFAULT_KEY_DEPTHS", "EngineConfig", "Generation", "QueryState", "HoldFn", "SteerPlan", "layers_at_depths",
           "stop_position"]


#: The default preset's fixed key layers as shares of the depth (method/presets.py): 12 and 9 on Gemma-3-270M's
#: 18 layers. The default measures its layers on the model and falls back to these on a model of fewer than 4
#: layers (docs/method.md, "Which layers"). Here so that check-model can check them on any model.
DEFAULT_KEY_DEPTHS = (2 / 3, 1 / 2)


def layers_at_depths(depths, n_layer: int) -> list[int]:
    """Key layers at shares of a model's depth: round(depth·n_layer), at most n_layer - 2 (the last
    layer keeps only output rows), in the order given, a layer that two depths round to once."""
    out: list[int] = []
    for d in depths:
        k = int(min(max(round(d * n_layer), 0), n_layer - 2))
        if k not in out:
            out.append(k)
    return out


@dataclass
class EngineConfig:
    n_ctx: int = 4096
    n_batch: int = 512
    n_threads: int = 0  # 0: all cores
    key_layer: int | None = None  # None: n_layer // 2 (must be <= n_layer - 2: earlier layers hold all rows)
    use_extra_bufts: bool | None = None  # None: off on CPUs with AMX, on elsewhere
    verbose: bool = False
    # Prompts decoded together as separate sequences by ``prompt_keys`` (batched ingest; at most
    # n_batch). 1 (the default) keeps llama.cpp's single-sequence context exactly as before; above 1
    # the KV cache is unified (one pool of n_ctx cells), so one sequence can still use all of it.
    n_seq_max: int = 1
    # Sequences beside the main one that ``runtime.branches.decode_branches`` may fill at once: several short
    # continuations of the held prompt (the answers method/answer_reading scores) decoded in one
    # llama_decode, which streams the 262,144-row LM head once instead of once per continuation.
    # Above 0 the context holds 1 + n_branches sequences in a unified KV cache; one sequence's
    # decodes are bitwise those of a one-sequence context (tests/test_branches.py). 0: continuations
    # are decoded one after another.
    n_branches: int = 4
    # Key-only passes (ingest's keys, calibration) stop the graph after the deepest key layer
    # instead of computing the layers above it (keys bitwise the same; off: the full depth).
    keys_stop_early: bool = True
    # Zero the KV buffers at every reset (llama_memory_clear's data flag), once per pass (the
    # benches' stand-in for an engine that did). Off: only the cells are marked free, which is what
    # makes them invisible to the next decode (its mask excludes them), without writing the whole
    # cache each pass. The clear after a key-only pass never zeroes.
    clear_kv_data: bool = False
    # A key-only pass (``prompt_key``) starts from the rows of the previous one that its prompt
    # shares, where the key stays bitwise that of a whole pass (runtime.key_prefix says when);
    # checked once per model, off where the check fails. Off: every pass decodes the whole prompt.
    key_prefix_cache: bool = True
    # The model is a copy cut after its deepest key layer (runtime.key_twin, fast ingest): that
    # layer is the model's last, where llama.cpp keeps only the rows asked for as outputs, so a
    # key-only pass marks each prompt's last selected row as its output and computes the layer's
    # feed-forward half for that row only. Allowed for a last-row key layer; keys only.
    key_cut: bool = False
    # Where a stop string may end a generation (``stop_position``). False: anywhere, so a model
    # whose first token is the newline stop answers "" (the rule every archived result used).
    # True: only after the first non-blank character, so blank lines before an answer are
    # skipped instead of ending it: SmolLM2 opens 14 of SuperNI's 15 tasks with a newline after
    # "Output: ", which the first rule scores as empty answers. The product's edges choose True
    # (a Miita that builds its own engine, every CLI command, the server); the benchmarks choose
    # per run (--answer-start), so this lower layer keeps the rule of the archived results.
    stop_after_text: bool = False
    # A steering plan's draft (its ``draft(generated)``, the memory's stored answer) is verified in one
    # batched decode instead of one decode per step (runtime.draft; the tokens are the sequential
    # path's). Off: one decode per step (the benches' and tests' reference). max_draft: at most
    # this many draft tokens per batch (0: as many as the generation can still take).
    draft: bool = True
    max_draft: int = 0


def stop_position(text: str, stops: Sequence[str], after_text: bool = False) -> int:
    """Where the first stop string in ``text`` starts, or -1 when none does.

    With ``after_text`` a stop string counts only where it starts after the first non-blank
    character (leading whitespace, newlines included, is not an answer's end). Why a pure
    function: generation checks it after every token and cuts the final text with it, and the
    two must agree."""
    start = 0
    if after_text:
        body = text.lstrip()
        if not body:
            return -1
        start = len(text) - len(body)
    hits = [i for i in (text.find(s, start) for s in stops if s) if i >= 0]
    return min(hits, default=-1)


@dataclass
class QueryState:
    """What one prompt pass leaves behind for retrieval (eqs. 1, 6, 7, 11)."""

    tokens: list[int]
    key_sum: np.ndarray  # (L·H,) each key layer's pooled rows (summed, or its last row), one H-block per layer
    key_rows: int  # prompt rows the key mask selected
    h_q: np.ndarray  # (H,) result_norm row of the last prompt token (answer start)
    logits: np.ndarray  # (V,) logits of the first answer token, unsteered
    pooled_rows: np.ndarray  # (L,) each block's divisor: rows summed, or 1 for a last-row block
    text: str | None = None  # the query as typed, where the caller had it (method/verify reads it)

    @property
    def key(self) -> np.ndarray:
        """Eq. 1's pooled key: (L·H,), each key layer's pooled rows (``Engine.key_pooling``), layers
        in ``Engine.key_layers`` order (one layer: the usual (H,) key)."""
        return key_mean(self.key_sum, self.pooled_rows)

    @property
    def keys(self) -> np.ndarray:
        """(L, H) the pooled key of every key layer."""
        return self.key.reshape(-1, self.h_q.shape[0])


@dataclass
class Generation:
    text: str
    tokens: list[int]
    alphas: list[float] = field(default_factory=list)  # one per steered step
    stop_reason: str = "length"  # "stop" | "eog" | "length"
    raised: list[int] = field(default_factory=list)  # steps whose push a hold raised (Engine.generate)


# A steering plan gives, before each generated token, the direction for that
# step (or None for no addition). step 0 predicts the first answer token. A plan may also offer
# ``plan.draft(generated)``: the tokens the memory expects next (runtime.draft verifies them).
SteerPlan = Callable[[int, Sequence[int]], "np.ndarray | None"]
# A hold, after a steered step produced ``token`` from ``logits``: None where the token stands,
# else a vector to add to the final hidden state on top of the step's addition, so that the
# memory's leading token wins (zeros: it already leads these logits; take it). Called as
# hold(step, generated, logits, token).
HoldFn = Callable[[int, Sequence[int], "np.ndarray", int], "np.ndarray | None"]
