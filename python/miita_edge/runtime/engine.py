"""The engine: one llama.cpp model + context, driven through llama-cpp-python's
low-level API, with miita-edge's native eval callback installed.

Why the low-level API: the high-level ``Llama`` class has no ``cb_eval`` hook,
and we need a *native* callback (a Python ctypes callback would run per graph
node, per token; DESIGN.md §3 has its cost).

What the callback does is configured between decode calls through
``Engine.native`` (a ``native.ext.State``); nothing Python runs per graph node.
The state object is created before the context and freed after it, so the
callback never sees a dangling pointer.

The engine owns the llama.cpp handles only: load, decode, the callback's state, generation and
sampling. Key-only passes are ``runtime.key_pass``; more contexts on the loaded model and its Q8_0
twin are ``runtime.contexts``; the LM head's row kernels are ``runtime.lm_head``.
"""
from __future__ import annotations

import ctypes
import os
import sys
from typing import Iterable, Sequence

import llama_cpp
import numpy as np

from ..errors import ContextOverflow, ModelError
from ..native import ext
from .abi import check_abi
from .default_model import resolve_model_path
from .engine_types import (DEFAULT_KEY_DEPTHS, EngineConfig, Generation, HoldFn, QueryState,  # noqa: F401
                           SteerPlan,
                           layers_at_depths, stop_position)  # re-exported: callers import them with the Engine
from .gguf_model import ModelInfo, inspect_gguf
from .key_pooling import KEY_POOLINGS
from .key_prefix import KeyPrefix
from .lm_head import LMHeadRows
from .draft import Steps
from .sampling import sample  # noqa: F401  also reached as runtime.engine.sample
from .llama_setup import cpu_has_amx, install_log_filter  # noqa: F401  cpu_has_amx re-exported for the benches
from .support import missing_tensor_reason, refusal_after_load, refusal_reason, self_test

STEER_MODES = {"off": 0, "ungated": 1, "gated": 2}
#: How many times a hold may decode one step again with a larger push before it gives up (each
#: raise is exact against the token that led; a third token can overtake, rarely twice).
MAX_RAISES = 4


def key_tensor_name(layer: int) -> str:
    """The name llama.cpp's graph gives layer ``layer``'s output, the tensor a key pools."""
    return f"l_out-{layer}"


class Engine:
    """Owns the llama.cpp model/context and the native callback state.

    Not thread-safe: one engine per thread. Call ``close()`` (or use ``with``).
    """

    def __init__(self, model: str | os.PathLike | None = None, config: EngineConfig | None = None):
        check_abi()
        L = llama_cpp
        self._L = L
        self.config = config or EngineConfig()
        self.info: ModelInfo = inspect_gguf(resolve_model_path(model))
        reason = refusal_reason(self.info)  # the same text as `miita-edge check-model`
        if reason:
            raise ModelError(f"unsupported model {self.info.path.name}: {reason}")
        self.n_embd = self.info.n_embd
        self.n_layer = self.info.n_layer
        k = self.config.key_layer if self.config.key_layer is not None else self.n_layer // 2
        if not 0 <= k <= self.n_layer - 2:
            raise ModelError(f"key layer {k} out of range 0..{self.n_layer - 2} for {self.info.path.name}")
        self.key_layer = k
        self.n_threads = self.config.n_threads or (os.cpu_count() or 1)

        self._set_verbose(self.config.verbose)
        L.llama_backend_init()
        mparams = L.llama_model_default_params()
        extra = self.config.use_extra_bufts
        mparams.use_extra_bufts = (not cpu_has_amx()) if extra is None else bool(extra)
        mparams.use_mmap = True
        self._model = L.llama_model_load_from_file(str(self.info.path).encode(), mparams)
        if not self._model:
            hint = ("; usearch is loaded in this process, and its bundled C++ runtime makes llama.cpp fail on "
                    "BPE vocabularies: load the model before the usearch index, or in another process"
                    if "usearch.compiled" in sys.modules else "")
            raise ModelError(f"llama.cpp could not load {self.info.path}{hint}")
        reason = refusal_after_load(L, self._model)
        if reason:
            L.llama_model_free(self._model)
            raise ModelError(f"unsupported model {self.info.path.name}: {reason}")
        self._vocab = L.llama_model_get_vocab(self._model)
        self.n_vocab = int(L.llama_vocab_n_tokens(self._vocab))
        if self.n_vocab != self.info.n_vocab:
            raise ModelError(f"vocabulary size {self.n_vocab} != LM-head rows {self.info.n_vocab}")

        self._owner: "Engine | None" = None  # set on siblings: the engine whose model they share
        self._key_prefix_verdict: bool | None = None  # key_prefix_ok, once probed (read on the owner)
        self._siblings: list[Engine] = []
        self._q8_twins: dict[int | None, Engine | None] = {}  # q8_twin() by cut, made on first use
        self._make_context()
        self.graph_tensors = self._probe_graph()

    def _make_context(self) -> None:
        """The llama.cpp context, its callback state and its batch, on the loaded model."""
        L = self._L
        # The callback state must outlive the context: created first, freed last.
        self.native = ext.State(self.n_embd)
        self.key_layers: tuple[int, ...] = (self.key_layer,)
        self.key_pooling: tuple[str, ...] = ("mean",)
        self._key_outputs: list[bool] = [False]  # per key layer: its tensor holds only output rows
        self._key_names = [key_tensor_name(self.key_layer)]
        cparams = L.llama_context_default_params()
        cparams.n_ctx = self.config.n_ctx
        cparams.n_batch = self.config.n_batch
        cparams.n_ubatch = self.config.n_batch
        cparams.n_threads = self.n_threads
        cparams.n_threads_batch = self.n_threads
        cparams.no_perf = True
        self._n_seq_ctx = max(1, min(max(int(self.config.n_seq_max), 1 + max(0, int(self.config.n_branches))),
                                     int(self.config.n_batch)))
        if self._n_seq_ctx > 1:  # llama.cpp asserts n_outputs <= n_seq_max... keep n_seq_max <= n_batch
            cparams.n_seq_max = self._n_seq_ctx
            cparams.kv_unified = True
        self._cb = ctypes.cast(ctypes.c_void_p(ext.callback_address()), L.ggml_backend_sched_eval_callback)
        cparams.cb_eval = self._cb
        cparams.cb_eval_user_data = ctypes.c_void_p(self.native.user_data)
        self._ctx = L.llama_init_from_model(self._model, cparams)
        if not self._ctx:
            if self._owner is None:
                L.llama_model_free(self._model)
            raise ModelError(f"llama.cpp could not create a context for {self.info.path}")
        self._mem = L.llama_get_memory(self._ctx)
        self._batch = L.llama_batch_init(self.config.n_batch, 0, 1)
        self._branch_batch = None  # runtime.branches' batch (a row in several sequences), made on first use
        self.n_past = 0
        self._key_prefix: KeyPrefix | None = None
        self._prompt: tuple | None = None  # the last query's prompt, and how many of its rows the
        self._intact = 0                   # cache still holds (holds(): a cut or a raw batch drops them)
        self.key_rows_reused = 0  # prompt rows key-only passes took from the previous pass (benches, tests)
        self.add_bos = bool(L.llama_vocab_get_add_bos(self._vocab))
        self.parse_special = False  # set by whoever renders prompts with a chat template
        self.bos = int(L.llama_vocab_bos(self._vocab))
        self._lm = None
        self._closed = False

    def key_sum(self) -> tuple[np.ndarray, np.ndarray]:
        """The key values collected since the last reset: ((L·H,) float32, (L,) int64), one H-block
        per key layer in ``key_layers`` order and what each block stands for (rows summed, or 1 for a
        last-row block); ``key_mean`` of the two is eq. 1's pooled key."""
        sums, _ = self.native.keys()
        return sums.reshape(-1).copy(), self.native.key_rows().copy()

    @property
    def _key_name(self) -> str:
        """The first key layer's tensor name (what the self-test and the graph probe check)."""
        return self._key_names[0]

    def set_key_layers(self, layers: Sequence[int], pooling: Sequence[str] | None = None) -> None:
        """Pool the key from these layers' outputs (``l_out-<k>``), one block each, in one prompt pass.

        The key is then the concatenation of the layers' pooled rows (``QueryState.key``, (L·H,)), in
        the order given; ``pooling`` says per layer how (``KEY_POOLINGS``; None: all "mean"). Each
        layer must be <= n_layer - 2: the last layer keeps only output rows (except in a model cut
        after a last-row key layer, ``EngineConfig.key_cut``, where that layer is the last)."""
        layers = tuple(int(k) for k in layers)
        if not layers or len(set(layers)) != len(layers):
            raise ValueError(f"key layers must be distinct and at least one, got {layers}")
        pooling = tuple(pooling) if pooling is not None else ("mean",) * len(layers)
        if len(pooling) != len(layers) or any(p not in KEY_POOLINGS for p in pooling):
            raise ValueError(f"key pooling must name one of {KEY_POOLINGS} per key layer, got {pooling}")
        top = self.n_layer - (1 if self.config.key_cut else 2)
        for k, p in zip(layers, pooling):
            if not 0 <= k <= top:
                raise ModelError(f"key layer {k} out of range 0..{top} for {self.info.path.name}")
            if k == self.n_layer - 1 and p != "last":
                raise ModelError(f"key layer {k} is the last layer of the cut model {self.info.path.name}: it "
                                 f"holds only output rows, so its key must pool the last row, not {p!r}")
        self._key_outputs = [k == self.n_layer - 1 for k in layers]
        self.key_layers = layers
        self.key_pooling = pooling
        self.key_layer = layers[0]
        self._key_names = [key_tensor_name(k) for k in layers]
        self.native.set_key_tensors(self._key_names)
        self.native.set_key_pooling([p == "last" for p in pooling])
        self.native.set_key_outputs(self._key_outputs)
        self.native.set_key_tensors([])  # sized for the new list; collected only while decoding a key
        self.native.key_reset()

    @property
    def keys_on_output_rows(self) -> bool:
        """Whether a key tensor holds only output rows (a model cut after its deepest key layer):
        key passes then mark each prompt's last selected row as an output."""
        return any(self._key_outputs)

    def missing_key_tensors(self, layers: Sequence[int]) -> list[str]:
        """The ``l_out-<k>`` of ``layers`` that this model's graph never computes (one short decode
        per layer): a key layer whose tensor is missing would leave its block of the key zero."""
        missing = []
        saved = self.key_layers, self.key_pooling
        try:
            for k in layers:
                self.set_key_layers([k])
                before = self.native.hits(0)
                self.reset()
                self.decode([self.bos if self.bos >= 0 else 0, 0], "last", key_mask=[True, True], read_logits=False)
                if self.native.hits(0) == before:
                    missing.append(key_tensor_name(k))
        finally:
            self.reset()
            self.set_key_layers(*saved)
        return missing

    def _probe_graph(self) -> tuple[bool, bool]:
        """Decode two tokens once with the key and result_norm watched: an architecture whose graph
        does not name them would otherwise give zero keys and no steering, silently."""
        st = self.native
        hk, hn = st.hits(0), st.hits(1)
        st.key_reset()
        st.set_capture(True, 1)
        try:
            self.decode([self.bos if self.bos >= 0 else 0, 0], "last", key_mask=[True, True], read_logits=False)
            seen = (st.hits(0) > hk, st.hits(1) > hn)
        finally:
            self.reset()
            st.set_capture(False, 0)
        for ok, name in zip(seen, (self._key_name, "result_norm")):
            if not ok:
                self.close()
                raise ModelError(f"unsupported model {self.info.path.name}: {missing_tensor_reason(name)}")
        return seen

    def check(self, seed: int = 0):
        """The self-test of ``miita-edge check-model`` on this engine's model (runtime/support.py):
        a list of ``CheckItem`` (head rows vs gguf-py, captured key vs a reference decode, logit shift
        vs c·W·δ). Leaves the sequence reset."""
        return self_test(self, seed=seed)

    # ------------------------------------------------------------------ life
    @staticmethod
    def _set_verbose(verbose: bool) -> None:
        install_log_filter(verbose)

    def close(self) -> None:
        if self._closed:
            return
        L = self._L
        for sib in self._siblings:  # their contexts point at this model: freed first
            sib.close()
        self._siblings = []
        for twin in self._q8_twins.values():
            if twin is not None:
                twin.close()
        self._q8_twins = {}
        for batch in (self._batch, self._branch_batch):
            if batch is not None:
                L.llama_batch_free(batch)
        L.llama_free(self._ctx)
        if self._owner is None:
            L.llama_model_free(self._model)
        else:
            self._owner._siblings = [e for e in self._owner._siblings if e is not self]
        self._closed = True
        self.native = None  # freed after the context that pointed at it

    @property
    def closed(self) -> bool:
        """Whether ``close()`` has run (on this engine, or on the engine whose model it shares)."""
        return self._closed

    @property
    def owner(self) -> "Engine | None":
        """The engine whose loaded model this one shares (a sibling context's, ``runtime.contexts``),
        or None for an engine that loaded its own model."""
        return self._owner

    @property
    def siblings(self) -> tuple["Engine", ...]:
        """The sibling contexts open on this engine's model (``runtime.contexts``), oldest first;
        ``close()`` closes them before it frees the model."""
        return tuple(self._siblings)

    def __enter__(self) -> "Engine":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def __del__(self) -> None:  # best effort; explicit close() is the contract
        try:
            self.close()
        except Exception:
            pass

    # ------------------------------------------------------------ tokens
    def tokenize(self, text: str, add_bos: bool = True) -> list[int]:
        """Token ids of ``text``; special tokens written as text (``<|im_start|>``) are parsed only
        while ``parse_special`` is on (a chat template's prompts), else they are plain text."""
        data = text.encode("utf-8")
        cap = len(data) + 8
        buf = (self._L.llama_token * cap)()
        special = self.parse_special
        n = self._L.llama_tokenize(self._vocab, data, len(data), buf, cap, add_bos and self.add_bos, special)
        if n < 0:
            cap = -n
            buf = (self._L.llama_token * cap)()
            n = self._L.llama_tokenize(self._vocab, data, len(data), buf, cap, add_bos and self.add_bos, special)
        return list(buf[:n])

    def chat_template(self) -> str | None:
        """The model's own Jinja chat template (GGUF ``tokenizer.chat_template``), or None. Read from
        the loaded model's metadata on each call (a pointer into it: no cache needed)."""
        raw = self._L.llama_model_chat_template(self._model, None)
        return raw.decode("utf-8", "replace") if raw else None

    def token_bytes(self, token: int) -> bytes:
        buf = ctypes.create_string_buffer(64)
        n = self._L.llama_token_to_piece(self._vocab, token, buf, 64, 0, False)
        if n < 0:
            buf = ctypes.create_string_buffer(-n)
            n = self._L.llama_token_to_piece(self._vocab, token, buf, -n, 0, False)
        return buf.raw[:n]

    def detokenize(self, tokens: Iterable[int]) -> str:
        return b"".join(self.token_bytes(t) for t in tokens).decode("utf-8", errors="replace")

    def is_eog(self, token: int) -> bool:
        return bool(self._L.llama_vocab_is_eog(self._vocab, token))

    # ------------------------------------------------------------ decoding
    @property
    def key_prefix(self) -> KeyPrefix | None:
        """The rows the last key-only pass left in the KV cache for the next one to continue
        (``runtime.key_pass``; what they hold is ``runtime.key_prefix.KeyPrefix``), or None: any
        other decode, a reset or a truncation clears them first."""
        return self._key_prefix

    def _forget_positions(self, zero: bool = False) -> None:
        """Clear the KV cache but keep the key sum (a key-only pass left deeper layers unwritten);
        ``zero``: also zero the buffers (``EngineConfig.clear_kv_data``)."""
        self._L.llama_memory_clear(self._mem, zero)
        self.n_past = 0
        self._key_prefix = None
        self._prompt = None

    def reset(self) -> None:
        """Forget the sequence: KV cache, key sum, captured rows, alphas, steering."""
        self._forget_positions(self.config.clear_kv_data)
        self._reset_callback()

    def _reset_callback(self) -> None:
        """The callback's per-sequence state back to empty: key sum, captured rows, alphas, steering."""
        st = self.native
        st.key_reset()
        st.capture_clear()
        st.alpha_clear()
        st.error_clear()
        st.set_steer(None, None, 0.0, 0)

    def truncate(self, n_keep: int) -> None:
        """Drop positions >= n_keep from the KV cache (to re-decode them)."""
        if not 0 <= n_keep <= self.n_past:
            raise ValueError("n_keep out of range")
        self._L.llama_memory_seq_rm(self._mem, 0, n_keep, -1)
        self.n_past = n_keep
        self._intact = min(self._intact, n_keep)
        if self._key_prefix is not None:
            self._forget_positions()

    def decode(self, tokens: Sequence[int], logits: Sequence[bool] | str = "last",
               key_mask: Sequence[bool] | None = None, read_logits: bool = True,
               key_marks: Sequence[int] | None = None) -> np.ndarray:
        """Append tokens to the sequence; return the requested logits rows (n_req, V), copied.

        logits: "last", "none", "all", or one flag per token.
        key_mask: one flag per token, which rows enter the semantic key sum
        (None: no key is collected in this call). The sum accumulates until ``reset()``.
        read_logits=False: the flagged rows are computed up to result_norm (for the callback's
        capture) but nothing is copied out; returns an empty (0, V) array.
        key_marks: rows of this call (increasing) before which the key state is kept aside
        (``native.key_marks()``); only for a call of at most n_batch tokens.
        """
        if self._key_prefix is not None:  # a key-only pass's rows, kept for the next one: not ours
            self._forget_positions()
        n = len(tokens)
        if n == 0:
            return np.zeros((0, self.n_vocab), np.float32)
        if self.n_past + n > self.config.n_ctx:
            raise ContextOverflow(f"sequence of {self.n_past + n} tokens exceeds the context of {self.config.n_ctx}")
        if isinstance(logits, str):
            flags = {"last": [False] * (n - 1) + [True], "none": [False] * n, "all": [True] * n}[logits]
        else:
            flags = [bool(x) for x in logits]
        if len(flags) != n or (key_mask is not None and len(key_mask) != n):
            raise ValueError("logits/key_mask must have one flag per token")
        if self.config.key_cut and (key_mask is None or (read_logits and any(flags))):
            raise ModelError(f"{self.info.path.name} is cut after its key layers: it computes keys only")
        L, b, nb = self._L, self._batch, self.config.n_batch
        out = np.empty((sum(flags) if read_logits else 0, self.n_vocab), np.float32)
        n_out = 0
        # Ask the callback for the key layer only while a key is being collected:
        # every watched tensor splits the graph computation once more.
        self.native.set_key_tensors(self._key_names if key_mask is not None else [])
        kept = (self._prompt, min(self._intact, self.n_past))  # appending leaves the rows before n_past
        for start in range(0, n, nb):
            chunk = range(start, min(n, start + nb))
            for i, j in enumerate(chunk):
                b.token[i] = int(tokens[j])
                b.pos[i] = self.n_past + i
                b.n_seq_id[i] = 1
                b.seq_id[i][0] = 0
                b.logits[i] = 1 if flags[j] else 0
            b.n_tokens = len(chunk)
            if key_mask is not None:
                self.native.begin_batch(np.fromiter((key_mask[j] for j in chunk), np.uint8, len(chunk)))
            if key_marks is not None:
                if n > nb or key_mask is None:
                    raise ValueError("key_marks need a key_mask and at most n_batch tokens")
                self.native.set_key_marks(np.asarray(key_marks, np.int64))
            if self.keys_on_output_rows:
                self.native.set_output_rows(np.array([i for i, j in enumerate(chunk) if flags[j]], np.int64))
            self.decode_batch()
            for i, j in enumerate(chunk):
                if flags[j] and read_logits:
                    ptr = L.llama_get_logits_ith(self._ctx, i)
                    out[n_out] = np.ctypeslib.as_array(ptr, shape=(self.n_vocab,))
                    n_out += 1
            self.n_past += len(chunk)
        self._prompt, self._intact = kept
        return out

    def decode_batch(self) -> None:
        """``llama_decode`` of the batch as filled; ModelError if llama.cpp or the callback failed."""
        self._prompt = None  # a raw batch: which positions it wrote is not known here (decode restores it)
        rc = self._L.llama_decode(self._ctx, self._batch)
        if rc != 0:
            raise ModelError(f"llama_decode failed with code {rc}")
        err = self.native.error()
        if err:
            raise ModelError(f"native callback: {err}")

    def hidden_states(self, tokens: Sequence[int], rows: Sequence[bool],
                      key_mask: Sequence[bool] | None = None) -> np.ndarray:
        """Append tokens; return the final hidden states (``result_norm``, before the LM head) at
        the flagged positions, (n_req, H), in order. The graph stops after result_norm, so
        llama.cpp does not compute these positions' logits: exact eq. 2 then reads the head once
        (``LMHeadRows.correction_from_hidden``) instead of twice. No steering may be active."""
        n_req = sum(bool(r) for r in rows)
        st = self.native
        st.set_capture(True, n_req)
        st.set_stop_after_norm(True)
        try:
            self.decode(tokens, rows, key_mask=key_mask, read_logits=False)
            out = st.captured()[:n_req].copy()
        finally:
            st.set_stop_after_norm(False)
            st.set_capture(False, 0)
        if out.shape[0] != n_req:
            raise ModelError(f"captured {out.shape[0]} result_norm rows, expected {n_req}")
        return out

    def set_steer(self, direction: np.ndarray | None, h_q: np.ndarray | None = None, eta: float = 0.0,
                  mode: str = "gated") -> None:
        """Configure the addition for the next decode calls (eq. 11); ``mode='off'`` disables it."""
        if mode not in STEER_MODES:
            raise ValueError(f"unknown steer mode {mode!r}")
        self.native.set_steer(direction, h_q, float(eta), STEER_MODES[mode])

    # ------------------------------------------------------------ high level
    def key_mask(self, tokens: Sequence[int], skip_bos: bool) -> list[bool]:
        """Which prompt rows eq. 1's key pools: all, or all but a leading BOS when ``skip_bos``
        (a prompt that is only BOS keeps it, or the key would be empty)."""
        mask = [True] * len(tokens)
        if skip_bos and len(tokens) > 1 and tokens[0] == self.bos:
            mask[0] = False
        return mask

    def query(self, prompt_tokens: Sequence[int], skip_bos_in_key: bool = True) -> QueryState:
        """Decode a prompt once and collect the retrieval signals (key, h_q, first-token logits)."""
        if not prompt_tokens:
            raise ValueError("empty prompt")
        self.reset()
        mask = self.key_mask(prompt_tokens, skip_bos_in_key)
        self.native.set_capture(True, 1)
        logits = self.decode(prompt_tokens, "last", key_mask=mask)[0]
        h_q = self.native.captured()[0].copy()
        self.native.set_capture(False, 0)
        key_sum, pooled = self.key_sum()
        self._prompt, self._intact = tuple(prompt_tokens), len(prompt_tokens)
        return QueryState(list(prompt_tokens), key_sum, int(sum(mask)), h_q, logits, pooled)

    def holds(self, prompt_tokens: Sequence[int]) -> bool:
        """Whether the KV cache holds exactly this prompt, as ``query`` left it (any decode, truncate or
        reset since then means it does not)."""
        return self._prompt == tuple(prompt_tokens) and self._intact >= len(prompt_tokens) == self.n_past

    def generate(self, state: QueryState, max_tokens: int = 32, stop: Sequence[str] = ("\n",),
                 plan: SteerPlan | None = None, eta: float = 0.0, mode: str = "gated",
                 temperature: float = 0.0, top_p: float = 1.0, seed: int = 0, on_token=None,
                 on_logits=None, hold: HoldFn | None = None) -> Generation:
        """Generate after ``query(state.tokens)``. The engine owns its KV cache: where other prompts
        were decoded since that query (a derived cache), the prompt is decoded again
        first, so no caller has to put it back.

        With a plan, step s adds eta·α·plan(s, generated) to every result_norm row
        it decodes; step 0 re-decodes the last prompt token so that the first
        answer token is steered too. The addition is gone when this returns. A plan that offers
        ``draft(generated)`` (the memory's expected tokens) has them verified in one batched decode
        (``runtime.draft``: the same tokens and alphas, fewer sequential decodes) unless
        ``EngineConfig.draft`` is off; a step the hold decodes again first ends the batch there.
        With a ``hold`` (see ``HoldFn``), a steered step whose token the hold rejects is decoded
        again with the hold's vector added on top (the addition is after every layer, so the KV
        cache is the same and only the logits change), until the memory's token leads or
        ``MAX_RAISES`` decodes; if it never leads, the step keeps its first token.
        A stop string ends the text where ``stop_position`` finds it (``EngineConfig.stop_after_text``
        says whether blank lines before any text can end it).
        """
        if self._prompt == tuple(state.tokens) and self._intact >= len(state.tokens) < self.n_past:
            self.truncate(len(state.tokens))  # what was decoded after the prompt goes; its rows stay
        if not self.holds(state.tokens):
            self.reset()
            self.decode(state.tokens, "last", read_logits=False)
        rng = np.random.default_rng(seed)
        after_text = self.config.stop_after_text
        generated: list[int] = []
        text_bytes = b""
        reason = "length"
        self.native.alpha_clear()
        raised: list[int] = []
        repeats: list[int] = []  # indices of the α entries that decoding a step again added
        draft = getattr(plan, "draft", None) if self.config.draft else None
        steps = Steps(self, state, plan, eta, mode, max_tokens, draft, self.config.max_draft)
        for step in range(max_tokens):
            logits, d = steps.logits(step, generated)
            tok = sample(logits, temperature, top_p, rng)
            if hold is not None and d is not None:
                tok, logits = self.hold_step(hold, step, generated, state, d, eta, mode, tok, logits,
                                              raised, repeats, steps)
            if self.is_eog(tok):
                reason = "eog"
                break
            generated.append(tok)
            if on_logits is not None:  # logprobs (serve): the logits this token was sampled from
                on_logits(tok, logits)
            text_bytes += self.token_bytes(tok)
            text = text_bytes.decode("utf-8", errors="ignore")
            if on_token is not None:  # streaming (serve): the text so far, after each sampled token
                on_token(text)
            if stop_position(text, stop, after_text) >= 0:
                reason = "stop"
                break
        steps.finish()
        self.set_steer(None, None, 0.0, "off")
        skip = set(repeats) | steps.dropped
        alphas = [float(a) for i, a in enumerate(self.native.alphas()) if i not in skip]
        text = text_bytes.decode("utf-8", errors="replace")
        cut = stop_position(text, stop, after_text)
        if cut >= 0:
            text = text[:cut]
        return Generation(text, generated, alphas, reason, raised)

    def hold_step(self, hold: HoldFn, step: int, generated: list[int], state: QueryState, d: np.ndarray,
                   eta: float, mode: str, tok: int, logits: np.ndarray, raised: list[int],
                   repeats: list[int], steps: Steps) -> tuple[int, np.ndarray]:
        """One steered step under a hold: the token and logits it ends with (``generate``; public so
        that the draft's bookkeeping can be checked through it on a fake engine)."""
        first = (tok, logits)
        last = state.tokens[-1] if step == 0 else generated[-1]
        direction = np.asarray(d, np.float32)
        for r in range(MAX_RAISES + 1):
            extra = hold(step, generated, logits, tok)
            if extra is None:  # the token stands (after a raise: the memory's token now leads)
                if r:
                    raised.append(step)
                return tok, logits
            if not np.any(extra):  # the memory's token already leads these logits
                if r:
                    raised.append(step)
                return int(np.argmax(logits)), logits
            if r == 0:  # the cache must end at this step's input, as one decode per step leaves it
                at = steps.settle()
                alpha = float(self.native.alphas()[at]) if mode == "gated" and at is not None else 1.0
            if alpha * eta <= 0 or r == MAX_RAISES:
                return first  # the memory's token never led: the step keeps the model's token
            # the native addition is eta·α·direction; this adds ``extra`` on top of what it added
            direction = (direction + np.asarray(extra, np.float64) / (eta * alpha)).astype(np.float32)
            repeats.append(len(self.native.alphas()))
            self.truncate(self.n_past - 1)
            self.set_steer(direction, state.h_q, eta, mode)
            logits = self.decode([last], "last")[0]
            tok = int(np.argmax(logits))
        return first

    # ------------------------------------------------------------ LM head
    @property
    def lm_head(self) -> "LMHeadRows":
        if self._lm is None:
            self._lm = LMHeadRows(self.info, self.n_threads)
        return self._lm
