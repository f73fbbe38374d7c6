"""The engine: one llama.cpp model + context, driven through llama-cpp-python's
low-level API, with miita-edge's native eval callback installed.

Why the low-level API: the high-level ``Llama`` class has no ``cb_eval`` hook,
and we need a *native* callback (a Python ctypes callback costs ~2.5 µs per
graph node, ~1.8 ms per token on Gemma-3-270M; DESIGN.md §3).

What the callback does is configured between decode calls through
``Engine.native`` (a ``native.ext.State``); nothing Python runs per graph node.
The state object is created before the context and freed after it, so the
callback never sees a dangling pointer.
"""
from __future__ import annotations

import ctypes
import dataclasses
import os
from dataclasses import dataclass, field
from typing import Callable, Iterable, Sequence

import numpy as np

from ..errors import ContextOverflow, ModelError
from ..native import ext
from .gguf_model import ModelInfo, inspect_gguf
from .key_pooling import KEY_POOLINGS, key_mean
from .key_prefix import KeyPrefix, mark_rows, tiled

STEER_MODES = {"off": 0, "ungated": 1, "gated": 2}

_LOG_CB = None  # the ctypes log callback must stay alive while llama.cpp may call it
_LOG_VERBOSE = [False]


def install_log_filter(verbose: bool) -> None:
    """Route llama.cpp's log through a filter: everything when verbose, else errors only.

    llama-cpp-python 0.3.x maps ggml's log levels off by one (ggml.h: DEBUG=1,
    INFO=2, WARN=3, ERROR=4, CONT=5), so with verbose off it still prints WARN
    lines on every model load; a user error must stay one line on stderr.
    """
    global _LOG_CB
    _LOG_VERBOSE[0] = bool(verbose)
    if _LOG_CB is not None:
        return
    import sys

    import llama_cpp
    from llama_cpp import _logger  # noqa: F401  installs its callback on import; ours replaces it

    last = [0]

    @llama_cpp.llama_log_callback
    def cb(level, text, user_data):
        if level != 5:  # GGML_LOG_LEVEL_CONT continues the previous message
            last[0] = level
        if _LOG_VERBOSE[0] or last[0] == 4:  # GGML_LOG_LEVEL_ERROR
            print(text.decode("utf-8", errors="replace"), end="", file=sys.stderr, flush=True)

    llama_cpp.llama_log_set(cb, ctypes.c_void_p(0))
    _LOG_CB = cb


def cpu_has_amx() -> bool:
    """llama.cpp's AMX extra buffer type segfaults on the first decode (DESIGN.md §3)."""
    try:
        with open("/proc/cpuinfo") as fh:
            return any("amx_tile" in line for line in fh if line.startswith("flags"))
    except OSError:
        return False


#: The default preset's key layers as shares of the depth (method/presets.py; docs/method.md §10.1):
#: 12 and 9 on Gemma-3-270M's 18 layers. Here so that check-model can check them on any model.
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
    # Key-only passes (ingest's keys, calibration) stop the graph after the deepest key layer
    # instead of computing the layers above it (keys bitwise the same; off: the full depth).
    keys_stop_early: bool = True
    # Zero the KV buffers at every reset (llama_memory_clear's data flag), once per pass, as the
    # engine before issue 15 did (the benches' stand-in for it). Off: only the cells are marked
    # free, which is what makes them invisible to the next decode (its mask excludes them); zeroing
    # ~30 MB at n_ctx 4096 cost ~1.8 ms. The clear after a key-only pass never zeroes.
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


@dataclass
class QueryState:
    """What one prompt pass leaves behind for retrieval (eqs. 1, 6, 7, 11)."""

    tokens: list[int]
    key_sum: np.ndarray  # (L·H,) each key layer's pooled rows (summed, or its last row), one H-block per layer
    key_rows: int  # prompt rows the key mask selected
    h_q: np.ndarray  # (H,) result_norm row of the last prompt token (answer start)
    logits: np.ndarray  # (V,) logits of the first answer token, unsteered
    pooled_rows: np.ndarray  # (L,) each block's divisor: rows summed, or 1 for a last-row block

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


# A steering plan gives, before each generated token, the direction for that
# step (or None for no addition). step 0 predicts the first answer token.
SteerPlan = Callable[[int, Sequence[int]], "np.ndarray | None"]


class Engine:
    """Owns the llama.cpp model/context and the native callback state.

    Not thread-safe: one engine per thread. Call ``close()`` (or use ``with``).
    """

    def __init__(self, model: str | os.PathLike | None = None, config: EngineConfig | None = None):
        from .abi import check_abi
        from .default_model import resolve_model_path

        check_abi()
        import llama_cpp as L

        self._L = L
        self.config = config or EngineConfig()
        self.info: ModelInfo = inspect_gguf(resolve_model_path(model))
        from .support import refusal_reason

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
            raise ModelError(f"llama.cpp could not load {self.info.path}")
        from .support import refusal_after_load

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

    def sibling(self, n_threads: int, n_seq_max: int = 1) -> "Engine":
        """A second context on this engine's loaded model, with its own callback state, batch and
        KV cache: extraction on several threads without loading the weights twice (issue 15).

        It keeps this engine's configuration except the thread count and the sequences per decode,
        and this engine's key layers. llama.cpp contexts of one model may decode on different
        threads at once (the weights are read-only); each context stays single-threaded in its use.
        It never frees the model: this engine closes its siblings before freeing it."""
        if self._closed:
            raise ModelError("engine is closed")
        sib = object.__new__(Engine)
        sib.__dict__.update({k: self.__dict__[k] for k in ("_L", "info", "n_embd", "n_layer",
                                                           "_model", "_vocab", "n_vocab")})
        sib.config = dataclasses.replace(self.config, n_threads=max(1, int(n_threads)),
                                         n_seq_max=max(1, int(n_seq_max)))
        sib.n_threads = sib.config.n_threads
        sib.key_layer = self.key_layer
        sib._owner = self
        sib._siblings = []
        sib._q8_twins = {}
        sib._make_context()
        sib.graph_tensors = self.graph_tensors
        sib.set_key_layers(self.key_layers, self.key_pooling)
        self._siblings.append(sib)
        return sib

    def q8_twin(self) -> "Engine | None":
        """An engine on this model's lossless Q8_0 twin (``runtime.key_twin``: the Q5_0 weights
        re-encoded, the same numbers), for this engine's key layers; written to the cache and loaded
        on first use, closed with this engine. None when the model has no Q5_0 weights.

        When the deepest key layer pools its last row, the twin is cut after it
        (``EngineConfig.key_cut``): that layer's feed-forward half then runs on each prompt's last
        row only. For key extraction only (the opt-in fast ingest): it maps a second copy of the
        weights, and a memory's fingerprint stays the original model's."""
        owner = self._owner or self
        if owner._closed:
            raise ModelError("engine is closed")
        deepest = max(range(len(self.key_layers)), key=lambda i: self.key_layers[i])
        cut = self.key_layers[deepest] + 1 if self.key_pooling[deepest] == "last" else None
        if cut not in owner._q8_twins:
            from .key_twin import q8_twin_path

            path = q8_twin_path(owner.info.path, layers=cut)
            owner._q8_twins[cut] = None if path is None else Engine(
                path, dataclasses.replace(owner.config, key_cut=cut is not None, key_prefix_cache=False,
                                          key_layer=None))
        twin = owner._q8_twins[cut]
        if twin is not None and (twin.key_layers, twin.key_pooling) != (self.key_layers, self.key_pooling):
            twin.set_key_layers(self.key_layers, self.key_pooling)
        return twin

    def siblings(self, count: int, n_threads: int, n_seq_max: int = 1) -> list["Engine"]:
        """``count`` sibling contexts with this thread count and sequences per decode, made on first
        use and kept until this engine closes: a context costs its KV cache and compute buffers to
        make, so memories sharing one engine (the server, a sweep) share them too."""
        n_threads, n_seq_max = max(1, int(n_threads)), max(1, int(n_seq_max))
        same = [e for e in self._siblings if (e.config.n_threads, e.config.n_seq_max) == (n_threads, n_seq_max)]
        while len(same) < count:
            same.append(self.sibling(n_threads, n_seq_max))
        return same[:count]

    def _make_context(self) -> None:
        """The llama.cpp context, its callback state and its batch, on the loaded model."""
        L = self._L
        # The callback state must outlive the context: created first, freed last.
        self.native = ext.State(self.n_embd)
        self.key_layers: tuple[int, ...] = (self.key_layer,)
        self.key_pooling: tuple[str, ...] = ("mean",)
        self._key_outputs: list[bool] = [False]  # per key layer: its tensor holds only output rows
        self._key_names = [f"l_out-{self.key_layer}"]
        cparams = L.llama_context_default_params()
        cparams.n_ctx = self.config.n_ctx
        cparams.n_batch = self.config.n_batch
        cparams.n_ubatch = self.config.n_batch
        cparams.n_threads = self.n_threads
        cparams.n_threads_batch = self.n_threads
        cparams.no_perf = True
        self._n_seq_ctx = max(1, min(int(self.config.n_seq_max), int(self.config.n_batch)))
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
        self.n_past = 0
        self._key_prefix: KeyPrefix | None = None
        self.key_rows_reused = 0  # prompt rows key-only passes took from the previous pass (benches, tests)
        self.add_bos = bool(L.llama_vocab_get_add_bos(self._vocab))
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
        self._key_names = [f"l_out-{k}" for k in layers]
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
                    missing.append(f"l_out-{k}")
        finally:
            self.reset()
            self.set_key_layers(*saved)
        return missing

    def _probe_graph(self) -> tuple[bool, bool]:
        """Decode two tokens once with the key and result_norm watched: an architecture whose graph
        does not name them would otherwise give zero keys and no steering, silently."""
        from .support import missing_tensor_reason

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
        from .support import self_test

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
        L.llama_batch_free(self._batch)
        L.llama_free(self._ctx)
        if self._owner is None:
            L.llama_model_free(self._model)
        else:
            self._owner._siblings = [e for e in self._owner._siblings if e is not self]
        self._closed = True
        self.native = None  # freed after the context that pointed at it

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
        data = text.encode("utf-8")
        cap = len(data) + 8
        buf = (self._L.llama_token * cap)()
        n = self._L.llama_tokenize(self._vocab, data, len(data), buf, cap, add_bos and self.add_bos, False)
        if n < 0:
            cap = -n
            buf = (self._L.llama_token * cap)()
            n = self._L.llama_tokenize(self._vocab, data, len(data), buf, cap, add_bos and self.add_bos, False)
        return list(buf[:n])

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
    def prompt_keys(self, prompts: Sequence[Sequence[int]], masks: Sequence[Sequence[bool]]
                    ) -> list[tuple[np.ndarray, np.ndarray]]:
        """Eq. 1's key values of several prompts: ``[(pooled key-layer rows, per-layer divisors), ...]``
        as ``key_sum`` gives them for one.

        Prompts are decoded as separate sequences in shared ``llama_decode`` calls (up to
        ``n_seq_max`` prompts and ``n_batch`` tokens each), with no output rows: a 30-token prompt
        alone leaves the CPU waiting on weight reads, several at once use them ``n`` times per
        read (issue 15). The callback sums each sequence's rows separately. Each sequence attends
        only to itself (llama.cpp's mask), so a key equals the one-prompt decode up to rounding
        (which rows take the repacked matmuls' one-row path, flash attention's tiled path from 64
        rows: docs/benchmarks.md, issue 15 seventh pass); tested: cosine > 0.9999 for a mean of
        rows, > 0.999 for a last row. A prompt longer than
        ``n_batch`` is decoded alone, as ``decode`` does. Leaves the sequence reset."""
        if len(prompts) != len(masks):
            raise ValueError("one mask per prompt")
        out: list[tuple[np.ndarray, np.ndarray] | None] = [None] * len(prompts)
        nb = self.config.n_batch
        group: list[int] = []
        for i, toks in enumerate(prompts):
            if len(toks) != len(masks[i]) or not toks:
                raise ValueError("each prompt needs tokens and one mask flag per token")
            if len(toks) > nb:  # alone, in chunks
                out[i] = self.prompt_key(toks, masks[i])
                continue
            if group and (len(group) >= max(1, min(self.config.n_seq_max, self._n_seq_ctx))
                          or sum(len(prompts[j]) for j in group) + len(toks) > nb):
                self._decode_group(group, prompts, masks, out)
                group = []
            group.append(i)
        if group:
            self._decode_group(group, prompts, masks, out)
        self.reset()
        return out  # type: ignore[return-value]

    def _decode_group(self, group, prompts, masks, out) -> None:
        L, b = self._L, self._batch
        self.reset()
        ids = np.empty(sum(len(prompts[j]) for j in group), np.int32)
        r = 0
        for s, j in enumerate(group):
            for pos, (t, m) in enumerate(zip(prompts[j], masks[j])):
                b.token[r], b.pos[r], b.n_seq_id[r], b.logits[r] = int(t), pos, 1, 0
                b.seq_id[r][0] = s
                ids[r] = s if m else -1
                r += 1
        b.n_tokens = r
        if self.keys_on_output_rows:  # each prompt's last selected row is its output: the cut layer keeps it
            last = {int(g): i for i, g in enumerate(ids) if g >= 0}
            out_rows = sorted(last.values())
            for i in out_rows:
                b.logits[i] = 1
            self.native.set_output_rows(np.asarray(out_rows, np.int64))
        self.native.set_key_tensors(self._key_names)
        self.native.begin_groups(ids, len(group))
        if self.config.keys_stop_early:
            self.native.set_stop_after_keys(True)
        try:
            rc = L.llama_decode(self._ctx, b)
            if rc != 0:
                raise ModelError(f"llama_decode failed with code {rc}")
            err = self.native.error()
            if err:
                raise ModelError(f"native callback: {err}")
            sums, _ = self.native.group_keys()
            rows = self.native.group_key_rows()
        finally:
            self.native.set_stop_after_keys(False)
            self.native.end_groups()
            if self.keys_on_output_rows:
                self.native.set_output_rows(np.zeros(0, np.int64))
        for s, j in enumerate(group):
            out[j] = (sums[s].reshape(-1), rows[s].copy())

    def prompt_key(self, tokens: Sequence[int], mask: Sequence[bool]) -> tuple[np.ndarray, np.ndarray]:
        """Eq. 1's key values of one prompt, as ``key_sum`` gives them, from a
        key-only pass: no logits, and (``EngineConfig.keys_stop_early``) the graph stops after the
        deepest key layer, so the layers above it (5 of Gemma-3-270M's 18) are not computed.
        The rows summed are computed exactly as in a full pass. Leaves the sequence reset.

        With ``EngineConfig.key_prefix_cache`` the pass continues from the rows it shares with the
        previous key-only pass's prompt where ``runtime.key_prefix`` shows the key stays bitwise
        (a templated stream's instruction is decoded once, not once per example); those rows stay
        in the KV cache, invisible to callers: the next decode of any other kind clears them."""
        if self._key_prefix_usable(len(tokens)):
            return self._prompt_key_continued(list(tokens), [bool(m) for m in mask])
        return self._prompt_key_whole(tokens, mask)

    def _key_prefix_usable(self, n: int) -> bool:
        return (self.config.key_prefix_cache and self.config.keys_stop_early and not self.config.clear_kv_data
                and not self.keys_on_output_rows
                and self._n_seq_ctx == 1 and 0 < n <= self.config.n_batch
                and (self._owner or self)._key_prefix_verdict is not False)

    @property
    def key_prefix_ok(self) -> bool:
        """Whether this build's kernels keep keys bitwise when a pass continues another's rows
        (``runtime.key_prefix``'s rules), checked once per loaded model by ``_probe_key_prefix``."""
        owner = self._owner or self  # one verdict per loaded model; each context probes itself
        if owner._key_prefix_verdict is None:
            owner._key_prefix_verdict = self._probe_key_prefix()
        return owner._key_prefix_verdict

    def _probe_key_prefix(self) -> bool:
        """Decode a few prompts that share prefixes (short ones, and ones past flash attention's
        64-row tile) both whole and continued, and compare the keys bit for bit. The rules in
        ``runtime.key_prefix`` were measured on one build; a CPU or build whose kernels round
        otherwise gets whole passes instead of keys that drift from ``ask``'s."""
        text = ("The quick brown fox jumps over the lazy dog while seven wizards quietly judge "
                "boxing matches at dawn; meanwhile the harbour lights flicker and a tired sailor "
                "counts the waves, numbering each one until the morning bell rings twice. ")
        base = self.tokenize(text * 3, add_bos=True)
        alt = self.tokenize(text[::-1] * 3, add_bos=False)
        if len(base) < 120 or len(alt) < 80:
            return False
        # cuts under the rules: -, 16, 20 (a rest of >= 8 rows), - (another attention path), 68,
        # 36 (a tiled rest of >= 64 rows), - ; rules any looser put some cut where rows round otherwise
        chain = [base[:30], base[:18] + alt[:12], base[:18] + alt[:10] + alt[40:42],
                 base[:100], base[:70] + alt[:70], base[:70] + alt[:30], base[:20] + alt[:12]]
        self._key_prefix = None
        try:
            continued = [self._prompt_key_continued(list(t), self.key_mask(t, True), probing=True) for t in chain]
            self.reset()
            for toks, (s, n) in zip(chain, continued):
                ws, wn = self._prompt_key_whole(toks, self.key_mask(toks, True))
                if not (np.array_equal(ws, s) and np.array_equal(wn, n)):
                    return False
            return True
        except ModelError:
            return False
        finally:
            self.reset()

    def _prompt_key_whole(self, tokens, mask) -> tuple[np.ndarray, np.ndarray]:
        """A key-only pass over every row of the prompt."""
        self.reset()
        stop = self.config.keys_stop_early
        if stop:
            self.native.set_stop_after_keys(True)
        try:
            if self.keys_on_output_rows:  # the last selected row is the output the cut layer keeps
                sel = [i for i, m in enumerate(mask) if m]
                flags = [i == sel[-1] for i in range(len(tokens))] if sel else "none"
                self.decode(tokens, flags, key_mask=mask, read_logits=False)
            else:
                self.decode(tokens, "none", key_mask=mask)
            return self.key_sum()
        finally:
            if stop:
                self.native.set_stop_after_keys(False)
            self._forget_positions()

    def _prompt_key_continued(self, tokens: list[int], mask: list[bool],
                              probing: bool = False) -> tuple[np.ndarray, np.ndarray]:
        """``prompt_key`` from the deepest row it may share with the cached prefix (0: all rows).
        The first time a row would be shared, the build is probed (``key_prefix_ok``): a stream
        whose prompts share nothing never pays for the probe."""
        n = len(tokens)
        names = tuple(self._key_names)
        kp = self._key_prefix
        q = kp.cut_for(tokens, mask, names) if kp is not None else 0
        if q and not probing:
            probed = (self._owner or self)._key_prefix_verdict is not None
            if not self.key_prefix_ok or not probed:  # a probe leaves the KV cache empty: start anew
                q = 0
        st = self.native
        if q:
            sums, pooled, rows = kp.states[q]
            self._L.llama_memory_seq_rm(self._mem, 0, q, -1)  # the shared rows stay
            self._reset_callback()
            st.set_key_tensors(list(names))
            st.key_set(sums, pooled, rows)
            states = {r: v for r, v in kp.states.items() if r <= q}
            self.key_rows_reused += q
        else:
            self.reset()
            states = {}
        self._key_prefix = None
        self.n_past = q
        marks = mark_rows(q, n)
        st.set_stop_after_keys(True)
        try:
            self.decode(tokens[q:], "none", key_mask=mask[q:], key_marks=[r - q for r in marks])
            m_sums, m_pooled, m_rows = st.key_marks()
            out = self.key_sum()
        except BaseException:
            self._forget_positions()
            raise
        finally:
            st.set_stop_after_keys(False)
            st.set_key_marks(np.zeros(0, np.int64))
        for i, r in enumerate(marks):
            states[r] = (m_sums[i], m_pooled[i], int(m_rows[i]))  # rows of arrays made for this pass
        self._key_prefix = KeyPrefix(tokens, mask, names, tiled(n), states)
        self.n_past = 0  # logically reset: the next decode of any other kind clears these rows
        return out

    def _forget_positions(self, zero: bool = False) -> None:
        """Clear the KV cache but keep the key sum (a key-only pass left deeper layers unwritten);
        ``zero``: also zero the buffers (``EngineConfig.clear_kv_data``)."""
        self._L.llama_memory_clear(self._mem, zero)
        self.n_past = 0
        self._key_prefix = None

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
            rc = L.llama_decode(self._ctx, b)
            if rc != 0:
                raise ModelError(f"llama_decode failed with code {rc}")
            err = self.native.error()
            if err:
                raise ModelError(f"native callback: {err}")
            for i, j in enumerate(chunk):
                if flags[j] and read_logits:
                    ptr = L.llama_get_logits_ith(self._ctx, i)
                    out[n_out] = np.ctypeslib.as_array(ptr, shape=(self.n_vocab,))
                    n_out += 1
            self.n_past += len(chunk)
        return out

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
        return QueryState(list(prompt_tokens), key_sum, int(sum(mask)), h_q, logits, pooled)

    def generate(self, state: QueryState, max_tokens: int = 32, stop: Sequence[str] = ("\n",),
                 plan: SteerPlan | None = None, eta: float = 0.0, mode: str = "gated",
                 temperature: float = 0.0, top_p: float = 1.0, seed: int = 0, on_token=None) -> Generation:
        """Generate after ``query(state.tokens)``; the KV cache must still hold that prompt.

        With a plan, step s adds eta·α·plan(s, generated) to every result_norm row
        it decodes; step 0 re-decodes the last prompt token so that the first
        answer token is steered too. The addition is gone when this returns.
        """
        rng = np.random.default_rng(seed)
        generated: list[int] = []
        text_bytes = b""
        reason = "length"
        logits = state.logits
        self.native.alpha_clear()
        for step in range(max_tokens):
            d = plan(step, generated) if plan is not None else None
            if step == 0:
                if d is not None:  # re-decode the last prompt token with the addition on
                    self.truncate(len(state.tokens) - 1)
                    self.set_steer(d, state.h_q, eta, mode)
                    logits = self.decode([state.tokens[-1]], "last")[0]
            else:
                if d is None:
                    self.set_steer(None, None, 0.0, "off")
                else:
                    self.set_steer(d, state.h_q, eta, mode)
                logits = self.decode([generated[-1]], "last")[0]
            tok = sample(logits, temperature, top_p, rng)
            if self.is_eog(tok):
                reason = "eog"
                break
            generated.append(tok)
            text_bytes += self.token_bytes(tok)
            text = text_bytes.decode("utf-8", errors="ignore")
            if on_token is not None:  # streaming (serve): the text so far, after each sampled token
                on_token(text)
            if any(s and s in text for s in stop):
                reason = "stop"
                break
        self.set_steer(None, None, 0.0, "off")
        alphas = [float(a) for a in self.native.alphas()]
        text = text_bytes.decode("utf-8", errors="replace")
        cut = min([text.find(s) for s in stop if s and s in text], default=-1)
        if cut >= 0:
            text = text[:cut]
        return Generation(text, generated, alphas, reason)

    # ------------------------------------------------------------ LM head
    @property
    def lm_head(self) -> "LMHeadRows":
        if self._lm is None:
            self._lm = LMHeadRows(self.info, self.n_threads)
        return self._lm


class LMHeadRows:
    """Row kernels over the LM head mapped from the GGUF (quantized, read in place)."""

    def __init__(self, info: ModelInfo, n_threads: int = 0):
        self.info = info
        self.head = info.lm_head
        self.W = info.map_lm_head()
        self.n_threads = n_threads

    def _args(self):
        h = self.head
        return (self.W, h.ggml_type, h.n_vocab, h.n_embd, h.row_bytes)

    def rows(self, ids: Sequence[int] | np.ndarray) -> np.ndarray:
        """W[ids] as float32 (n, H)."""
        return ext.lm_gather(*self._args(), np.asarray(ids, np.int32), self.n_threads)

    def weighted_sum(self, ids, weights) -> np.ndarray:
        """Σ_i w_i W[ids_i] (eq. 7's W_Vᵀ g)."""
        return ext.lm_weighted_sum(*self._args(), np.asarray(ids, np.int32),
                                       np.asarray(weights, np.float32), self.n_threads)

    def restricted_uncertainty(self, logits: np.ndarray, K: int):
        """Eqs. 6-7 in one native call: (ids, p_hat, g, H_hat, r_q), as ``retrieval._restricted``
        computes them from ``top_k_restricted``, ``restricted_entropy_grad`` and W_Vᵀg (float64;
        tested against those). ValueError for NaN/+inf or all -inf logits."""
        z = np.ascontiguousarray(logits, np.float32)
        try:
            ids, p, g, H, r = ext.restricted_uncertainty(*self._args(), z, int(min(max(K, 1), z.shape[0])))
        except RuntimeError as e:
            raise ValueError(f"top_k_restricted: {e}") from e
        return ids.astype(np.int64), p, g, float(H), r

    def correction_from_hidden(self, hidden: np.ndarray, targets: Sequence[int],
                               per_position: bool = False) -> np.ndarray:
        """Exact eq. 2 with p_t = softmax(W h_t), from the final hidden rows, in one pass over W."""
        c = self.info.logit_mult  # logits = c W h (granite: c = 1 / logit_scale)
        if c != 1.0:
            hidden = np.asarray(hidden, np.float32) * np.float32(c)
        return ext.lm_correction_hidden(*self._args(), np.ascontiguousarray(hidden, np.float32),
                                            np.asarray(targets, np.int32), bool(per_position), self.n_threads)

    def correction(self, logits: np.ndarray, targets: Sequence[int], top_k: int = 0,
                   per_position: bool = False) -> np.ndarray:
        """R = mean_t (W[y_t] − Σ_v p_t(v) W[v]) (eq. 2), or one R_t per position."""
        return ext.lm_correction(*self._args(), np.ascontiguousarray(logits, np.float32),
                                     np.asarray(targets, np.int32), int(top_k), bool(per_position),
                                     self.n_threads)


def sample(logits: np.ndarray, temperature: float, top_p: float, rng: np.random.Generator) -> int:
    """Greedy at temperature 0 (ties: lowest id); otherwise nucleus sampling."""
    if temperature <= 0:
        return int(np.argmax(logits))
    z = logits.astype(np.float64) / temperature
    z -= z.max()
    p = np.exp(z)
    p /= p.sum()
    if top_p < 1.0:
        order = np.argsort(-p)
        keep = np.cumsum(p[order]) - p[order] < top_p
        mask = np.zeros_like(p, bool)
        mask[order[keep]] = True
        p = np.where(mask, p, 0.0)
        p /= p.sum()
    return int(rng.choice(len(p), p=p))
