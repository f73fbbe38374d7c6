"""Can miita-edge steer this GGUF? The reasons it refuses one, and the self-test on the real file.

What the adapter relies on, per model (DESIGN.md §3):
  - the graph names each layer's output ``l_out-<k>`` (the semantic key) and the final hidden state
    ``result_norm`` (captured, and where the correction is added);
  - after ``result_norm`` the graph computes logits = c · W h, with W the LM-head tensor in the file
    and c a constant (1, or the logit scale): then adding δ to h moves the logits by exactly c · W δ;
  - the LM head can be read in place, one row at a time, in its stored type.

``refusal_reason`` (header) and ``refusal_after_load`` (llama.cpp's own flags) name what cannot
work; ``Engine`` raises with the same text. ``self_test`` (``Engine.check()``, and
``model_check.check_model`` for a path) compares the head rows the native kernels read with gguf-py's
dequantisation, the key the native callback sums with a reference decode (a second context with a
Python callback that copies the tensors), and the logits and their shift under a known addition
with c · W h and c · W δ computed in numpy. Each check comes back as an item, ok or not.
"""
from __future__ import annotations

import ctypes
from dataclasses import dataclass, field

import llama_cpp
import numpy as np
from gguf.constants import GGMLQuantizationType
from gguf.quants import dequantize

from ..errors import MiitaError
from .abi import ggml_library
from .gguf_model import ModelInfo
from .key_pooling import key_mean

# Architectures whose llama.cpp graph cannot be steered this way, by name (the header is read
# before llama.cpp loads anything; llama.cpp's own flags are checked after loading as well).
ENCODER_ONLY = frozenset({"bert", "nomic-bert", "nomic-bert-moe", "jina-bert-v2", "jina-bert-v3", "modern-bert",
                          "neo-bert", "eurobert", "t5encoder", "gemma-embedding", "llama-embed"})
ENCODER_DECODER = frozenset({"t5"})
RECURRENT = frozenset({"mamba", "mamba2", "rwkv6", "rwkv6qwen2", "rwkv7", "arwkv7", "jamba", "falcon-h1",
                       "granitehybrid", "plamo2", "nemotron_h", "nemotron_h_moe", "lfm2", "lfm2moe", "qwen3next",
                       "kimi-linear", "qwen35", "qwen35moe"})
DIFFUSION = frozenset({"llada", "llada-moe", "dream", "rnd1"})
NOT_TEXT = frozenset({"clip", "wavtokenizer-dec"})

# ggml type ids (ggml.h) and the type llama.cpp's CPU backend converts the activations to before the
# dot products with a head of that type (ggml-cpu type_traits_cpu[].vec_dot_type).
GGML_TYPE_NAMES = {0: "F32", 1: "F16", 2: "Q4_0", 3: "Q4_1", 6: "Q5_0", 7: "Q5_1", 8: "Q8_0", 9: "Q8_1",
                   10: "Q2_K", 11: "Q3_K", 12: "Q4_K", 13: "Q5_K", 14: "Q6_K", 15: "Q8_K", 16: "IQ2_XXS",
                   17: "IQ2_XS", 18: "IQ3_XXS", 19: "IQ1_S", 20: "IQ4_NL", 21: "IQ3_S", 22: "IQ2_S", 23: "IQ4_XS",
                   29: "IQ1_M", 30: "BF16", 34: "TQ1_0", 35: "TQ2_0", 39: "MXFP4"}
_VEC_DOT = {0: "F32", 1: "F16", 30: "BF16", 2: "Q8_0", 6: "Q8_0", 8: "Q8_0", 20: "Q8_0", 3: "Q8_1", 7: "Q8_1",
            10: "Q8_K", 11: "Q8_K", 12: "Q8_K", 13: "Q8_K", 14: "Q8_K", 16: "Q8_K", 17: "Q8_K", 18: "Q8_K",
            19: "Q8_K", 21: "Q8_K", 22: "Q8_K", 23: "Q8_K", 29: "Q8_K"}

PROBE_TEXT = "Where is my new card? The courier lost my parcel and I was charged twice."

# Tolerances of the self-test (relative to the largest value compared). Measured on the generated
# models of tests/test_model_support.py (7 architectures x 6 head types, tied and untied) and on
# Gemma-3-270M: head rows agree exactly; keys to <= 1e-7; logits and their shift, against the
# reference that rounds the activations as llama.cpp does (F16, BF16, Q8_0 or Q8_K), to <= 1e-6
# (float sums in another order). Against plain W·δ the shift differs by 1e-2 (that rounding).
TOL_ROWS = 1e-5
TOL_KEY = 1e-5
TOL_SHIFT = 1e-4


def type_name(ggml_type: int) -> str:
    return GGML_TYPE_NAMES.get(ggml_type, f"type {ggml_type}")


def refusal_reason(info: ModelInfo) -> str | None:
    """Why this GGUF cannot be steered, from its header alone; None when nothing rules it out."""
    a = info.arch
    if info.logit_softcap:
        return (f"{a} soft-caps its logits (final_logit_softcapping={info.logit_softcap:g}): an addition to the "
                "hidden state then no longer moves the logits by W·δ")
    if a in ENCODER_ONLY:
        return f"{a} is an encoder-only (embedding) model: it has no causal LM head to steer"
    if a in ENCODER_DECODER:
        return f"{a} is an encoder-decoder model: its decoder needs llama_encode first, which miita-edge does not drive"
    if a in RECURRENT:
        return (f"{a} is a recurrent or hybrid model: its state cannot be rewound by one token, which the steered "
                "first answer step needs")
    if a in DIFFUSION:
        return f"{a} is a diffusion model: it does not decode left to right"
    if a in NOT_TEXT:
        return f"{a} is not a text model"
    if "output.bias" in info.tensor_names:
        return "the LM head has a bias (output.bias), which the row kernels do not apply"
    if info.n_layer < 2:
        return f"{info.n_layer} layer(s): the key layer must be below the last layer"
    return None


def refusal_after_load(L, model) -> str | None:
    """What llama.cpp itself says about the loaded model (arch names it knows and we do not)."""
    if L.llama_model_has_encoder(model):
        return "the model has an encoder (llama_model_has_encoder): miita-edge drives decoder-only models"
    if not L.llama_model_has_decoder(model):
        return "the model has no decoder (llama_model_has_decoder is false): nothing to steer"
    if L.llama_model_is_recurrent(model) or L.llama_model_is_hybrid(model):
        return ("the model is recurrent or hybrid (llama_model_is_recurrent/is_hybrid): its state cannot be rewound "
                "by one token, which the steered first answer step needs")
    if L.llama_model_is_diffusion(model):
        return "the model is diffusion-based (llama_model_is_diffusion): it does not decode left to right"
    return None


def missing_tensor_reason(name: str) -> str:
    return (f"the llama.cpp graph of this architecture has no tensor named {name!r}, which the callback needs "
            "(DESIGN.md §3)")


# ---------------------------------------------------------------------------------------------
# numpy references
# ---------------------------------------------------------------------------------------------
def dequantize_rows(info: ModelInfo, W: np.ndarray, ids) -> np.ndarray:
    """Rows of the LM head as float32, by gguf-py's dequantisation (independent of ggml's)."""
    h = info.lm_head
    rb = h.row_bytes
    ids = np.asarray(ids, np.int64)
    raw = np.stack([np.asarray(W[i * rb:(i + 1) * rb]) for i in ids]) if len(ids) else np.zeros((0, rb), np.uint8)
    return np.asarray(dequantize(raw, GGMLQuantizationType(h.ggml_type)), np.float32).reshape(len(ids), h.n_embd)


def _f32_to_bf16_to_f32(x: np.ndarray) -> np.ndarray:
    u = np.ascontiguousarray(x, np.float32).view(np.uint32).astype(np.uint64)
    r = ((u + 0x7FFF + ((u >> 16) & 1)) >> 16) << 16  # round to nearest even, as ggml_compute_fp32_to_bf16
    return r.astype(np.uint32).view(np.float32)


def round_activations(x: np.ndarray, ggml_type: int) -> np.ndarray | None:
    """x as the CPU backend rounds it before the dot products with a head of this type; None when
    there is no reference for that type (the shift is then compared without rounding)."""
    x = np.asarray(x, np.float32)
    vt = _VEC_DOT.get(ggml_type)
    if vt == "F32":
        return x.copy()
    if vt == "F16":
        return x.astype(np.float16).astype(np.float32)
    if vt == "BF16":
        return _f32_to_bf16_to_f32(x)
    if vt == "Q8_0" and x.size % 32 == 0:  # float32: d = amax / 127 (stored as fp16), q = round(x * (127 / amax))
        b = x.reshape(-1, 32)
        amax = np.abs(b).max(axis=1, keepdims=True)
        d = (amax / np.float32(127.0)).astype(np.float16).astype(np.float32)
        iscale = np.where(amax > 0, np.float32(127.0) / np.where(amax > 0, amax, 1), 0).astype(np.float32)
        q = np.round(b * iscale)
        return (q * d).astype(np.float32).reshape(x.shape)
    if vt == "Q8_K" and x.size % 256 == 0:  # d = -max/127 (max: the value of largest magnitude), float32
        b = x.reshape(-1, 256)
        i = np.abs(b).argmax(axis=1)
        mx = b[np.arange(b.shape[0]), i][:, None]
        iscale = np.where(mx != 0, np.float32(-127.0) / np.where(mx != 0, mx, 1), 0).astype(np.float32)
        q = np.minimum(127, np.round(iscale * b))
        d = np.where(iscale != 0, np.float32(1.0) / np.where(iscale != 0, iscale, 1), 0).astype(np.float32)
        return (q * d).astype(np.float32).reshape(x.shape)
    return None


class _ReferenceDecoder:
    """A second llama.cpp context on the engine's model with a Python eval callback that copies the
    rows of the watched tensors out (slow, ~2.5 µs per graph node: for checks only)."""

    def __init__(self, engine, names):
        self.L = L = llama_cpp
        lib = ggml_library()
        lib.ggml_get_name.restype = ctypes.c_char_p
        lib.ggml_get_name.argtypes = [ctypes.c_void_p]
        lib.ggml_nelements.restype = ctypes.c_int64
        lib.ggml_nelements.argtypes = [ctypes.c_void_p]
        lib.ggml_nrows.restype = ctypes.c_int64
        lib.ggml_nrows.argtypes = [ctypes.c_void_p]
        lib.ggml_get_data_f32.restype = ctypes.POINTER(ctypes.c_float)
        lib.ggml_get_data_f32.argtypes = [ctypes.c_void_p]
        lib.ggml_is_contiguous.restype = ctypes.c_bool
        lib.ggml_is_contiguous.argtypes = [ctypes.c_void_p]
        self.names = set(names)
        self.rows: dict[str, list[np.ndarray]] = {n: [] for n in names}

        @L.ggml_backend_sched_eval_callback
        def cb(t, ask, user_data):
            name = lib.ggml_get_name(t).decode(errors="replace")
            if ask:
                return name in self.names
            if name in self.names and lib.ggml_is_contiguous(t) and lib.ggml_nrows(t) > 0:
                n, r = lib.ggml_nelements(t), lib.ggml_nrows(t)
                data = np.ctypeslib.as_array(lib.ggml_get_data_f32(t), shape=(n,))
                self.rows[name].append(data.reshape(r, n // r).copy())
            return True

        self._cb = cb  # must outlive the context
        cp = L.llama_context_default_params()
        cp.n_ctx = engine.config.n_ctx
        cp.n_batch = cp.n_ubatch = engine.config.n_batch
        cp.n_threads = cp.n_threads_batch = engine.n_threads
        cp.no_perf = True
        cp.cb_eval = cb
        cp.cb_eval_user_data = ctypes.c_void_p(0)
        self.ctx = L.llama_init_from_model(engine._model, cp)
        if not self.ctx:
            raise MiitaError("llama.cpp could not create the reference context")
        self.batch = L.llama_batch_init(engine.config.n_batch, 0, 1)
        self.n_vocab = engine.n_vocab

    def decode(self, tokens, split: int) -> np.ndarray:
        """Decode tokens from position 0 in two calls, [0, split) and [split, n), with logits for the
        last one (the batch shapes the engine uses, so the numbers are the same bit for bit)."""
        L, b = self.L, self.batch
        self.rows = {n: [] for n in self.names}
        L.llama_memory_clear(L.llama_get_memory(self.ctx), True)
        for lo, hi in ((0, split), (split, len(tokens))):
            for i, pos in enumerate(range(lo, hi)):
                b.token[i], b.pos[i], b.n_seq_id[i], b.logits[i] = int(tokens[pos]), pos, 1, 0
                b.seq_id[i][0] = 0
            b.logits[hi - lo - 1] = 1 if hi == len(tokens) else 0
            b.n_tokens = hi - lo
            rc = L.llama_decode(self.ctx, b)
            if rc != 0:
                raise MiitaError(f"reference llama_decode failed with code {rc}")
        return np.ctypeslib.as_array(L.llama_get_logits_ith(self.ctx, len(tokens) - 1 - split),
                                     shape=(self.n_vocab,)).copy()

    def close(self) -> None:
        self.L.llama_batch_free(self.batch)
        self.L.llama_free(self.ctx)


# ---------------------------------------------------------------------------------------------
# the report
# ---------------------------------------------------------------------------------------------
@dataclass
class CheckItem:
    name: str
    ok: bool
    detail: str


@dataclass
class CheckReport:
    path: str
    arch: str | None = None
    n_embd: int | None = None
    n_layer: int | None = None
    n_vocab: int | None = None
    key_layer: int | None = None
    key_layers: list[int] = field(default_factory=list)  # the default preset's key layers on this model
    head_tensor: str | None = None
    head_type: str | None = None
    logit_mult: float = 1.0
    has_key_tensor: bool | None = None
    has_result_norm: bool | None = None
    items: list[CheckItem] = field(default_factory=list)
    reason: str | None = None
    seconds: float = 0.0

    @property
    def supported(self) -> bool:
        return self.reason is None and self.arch is not None

    def verdict(self) -> str:
        return "supported" if self.supported else f"refused: {self.reason}"

    def lines(self) -> list[str]:
        def yn(v):
            return "not checked" if v is None else ("yes" if v else "NO")

        out = [f"model        {self.path}"]
        if self.arch is not None:
            out += [f"architecture {self.arch}",
                    f"n_embd       {self.n_embd}",
                    f"n_layer      {self.n_layer}",
                    f"n_vocab      {self.n_vocab}",
                    f"key layer    {self.key_layer}" + ("" if self.key_layer is None else f" (l_out-{self.key_layer})"),
                    f"LM head      {self.head_tensor} ({self.head_type})",
                    f"logit scale  logits = {self.logit_mult:g} · W h",
                    f"graph        {', '.join(f'l_out-{k}' for k in (self.key_layers or [self.key_layer]))}: "
                    f"{yn(self.has_key_tensor)}, result_norm: {yn(self.has_result_norm)}"]
            if self.key_layers:
                out.insert(6, f"key layers   {self.key_layers} (the default preset's: 2/3 and 1/2 of the depth)")
        for it in self.items:
            out.append(f"self-test    {'ok  ' if it.ok else 'FAIL'} {it.name}: {it.detail}")
        out.append(self.verdict())
        return out

    def to_json(self) -> dict:
        return {"path": self.path, "arch": self.arch, "n_embd": self.n_embd, "n_layer": self.n_layer,
                "n_vocab": self.n_vocab, "key_layer": self.key_layer, "key_layers": self.key_layers,
                "head_tensor": self.head_tensor,
                "head_type": self.head_type, "logit_mult": self.logit_mult, "has_key_tensor": self.has_key_tensor,
                "has_result_norm": self.has_result_norm, "supported": self.supported, "reason": self.reason,
                "self_test": [{"name": i.name, "ok": i.ok, "detail": i.detail} for i in self.items],
                "seconds": round(self.seconds, 3)}


def _rel(a: np.ndarray, b: np.ndarray) -> float:
    """max |a - b| / max |b| (0 when both are 0)."""
    scale = float(np.max(np.abs(b))) if b.size else 0.0
    err = float(np.max(np.abs(a - b))) if a.size else 0.0
    return err / scale if scale > 0 else err


def _sample_ids(V: int, rng: np.random.Generator, logits: np.ndarray | None, n: int = 256) -> np.ndarray:
    ids = {0, V - 1, V // 2}
    ids.update(int(i) for i in rng.choice(V, size=min(n, V), replace=False))
    if logits is not None:  # the rows that matter most: the largest logits
        ids.update(int(i) for i in np.argsort(-logits)[:32])
    return np.array(sorted(ids), np.int64)


def self_test(engine, seed: int = 0) -> list[CheckItem]:
    """The checks of ``check_model`` on an open engine: each comes back as an item, ok or not."""
    items: list[CheckItem] = []
    info, lm = engine.info, engine.lm_head
    rng = np.random.default_rng(seed)
    V, H = engine.n_vocab, engine.n_embd
    c = info.logit_mult

    # 1. head rows: native kernel vs gguf-py
    ids = _sample_ids(V, rng, None)
    nat = lm.rows(ids)
    ref = dequantize_rows(info, lm.W, ids)
    e = _rel(nat, ref)
    items.append(CheckItem("head rows", bool(np.isfinite(nat).all() and e <= TOL_ROWS),
                           f"{len(ids)} rows of {info.lm_head.name} ({type_name(info.lm_head.ggml_type)}) vs gguf-py "
                           f"dequantisation: max rel err {e:.1e} (tol {TOL_ROWS:.0e})"))

    # 2. key and h_q: native callback vs a reference decode with a Python callback
    toks = engine.tokenize(PROBE_TEXT)
    if len(toks) < 4:
        toks = (toks * 4)[:8]
    m = len(toks) // 2
    ref_dec = _ReferenceDecoder(engine, [engine._key_name, "result_norm"])
    try:
        ref_logits = ref_dec.decode(toks, m)
        key_rows = ref_dec.rows[engine._key_name]
        norm_rows = ref_dec.rows["result_norm"]
    finally:
        ref_dec.close()
    skip_bos = toks[0] == engine.bos and len(toks) > 1
    if not key_rows or not norm_rows:
        items.append(CheckItem("captured key", False, "the reference decode saw no "
                               + ("l_out" if not key_rows else "result_norm") + " tensor"))
        return items
    allk = np.concatenate(key_rows)[: len(toks)]
    last = engine.key_pooling[0] == "last"
    ref_key = (allk[-1:] if last else allk[1 if skip_bos else 0:]).astype(np.float64).mean(axis=0)
    # the engine in two decode calls (the sum must carry across calls and ubatches)
    engine.reset()
    mask = [True] * len(toks)
    if skip_bos:
        mask[0] = False
    engine.decode(toks[:m], "none", key_mask=mask[:m])
    engine.native.set_capture(True, 1)
    logits0 = engine.decode(toks[m:], "last", key_mask=mask[m:])[0]
    h_q = engine.native.captured()[0].copy()
    engine.native.set_capture(False, 0)
    ksum, krows = engine.native.key()
    key = key_mean(ksum, engine.native.key_rows()[0])
    ek = _rel(key.astype(np.float64), ref_key)
    eh = _rel(h_q, norm_rows[-1][-1])
    el = _rel(logits0, ref_logits)
    ok = int(krows) == sum(mask) and ek <= TOL_KEY and eh <= TOL_KEY and el <= TOL_KEY
    items.append(CheckItem("captured key", bool(ok),
                           f"{'last' if last else 'mean'} of {int(krows)} rows of l_out-{engine.key_layer} over 2 decode calls vs a reference "
                           f"decode: max rel err {ek:.1e}; result_norm row {eh:.1e}; logits {el:.1e} (tol {TOL_KEY:.0e})"))

    # 3. logits = c W h, and the shift under a known addition = c W δ
    ids = _sample_ids(V, rng, logits0)
    Wr = dequantize_rows(info, lm.W, ids).astype(np.float64)
    rho = (lambda x: round_activations(x, info.lm_head.ggml_type))
    hq_r = rho(h_q)
    base_ref = c * (Wr @ (hq_r if hq_r is not None else h_q).astype(np.float64))
    eb = _rel(logits0[ids].astype(np.float64), base_ref)
    d = rng.standard_normal(H).astype(np.float32)
    d /= np.linalg.norm(d)
    eta = 0.5 * float(np.linalg.norm(h_q))
    # The last prompt token decoded again alone, without and then with the addition: the same batch
    # shape both times, so the pre-addition h (captured before the add) is the same bit for bit.
    st = engine.native
    pair = []
    for steer in (False, True):
        engine.truncate(len(toks) - 1)
        st.set_capture(True, 1)
        if steer:
            engine.set_steer(d, None, eta, "ungated")
        try:
            pair.append((engine.decode([toks[-1]], "last")[0], st.captured()[0].copy()))
        finally:
            engine.set_steer(None, None, 0.0, "off")
            st.set_capture(False, 0)
    (logits0, h_q), (logits1, h_pre) = pair
    hq_r = rho(h_q)
    if not np.array_equal(h_q, h_pre):
        items.append(CheckItem("logit shift = c·W·δ", False, "the same decode gave two different hidden states"))
        return items
    shift = (logits1 - logits0)[ids].astype(np.float64)
    plain = c * (Wr @ (eta * d.astype(np.float64)))
    if hq_r is not None:
        # h + δ as the callback forms it in float32: with or without a fused multiply-add (the
        # compiler's choice), whichever the logits agree with
        eta32 = np.float32(eta)
        h1s = (h_q + eta32 * d, (h_q.astype(np.float64) + np.float64(eta32) * d.astype(np.float64)).astype(np.float32))
        es = min(_rel(shift, c * (Wr @ (rho(h1).astype(np.float64) - hq_r.astype(np.float64)))) for h1 in h1s)
        how = f"c·W·(ρ(h+δ) − ρ(h)), ρ = llama.cpp's rounding of activations to {_VEC_DOT[info.lm_head.ggml_type]}"
    else:
        es = _rel(shift, plain)
        how = "c·W·δ (no rounding reference for this head type)"
    ep = _rel(shift, plain)
    cos = float(shift @ plain / (np.linalg.norm(shift) * np.linalg.norm(plain) + 1e-30))
    tol = TOL_SHIFT if hq_r is not None else 0.05
    items.append(CheckItem("logits = c·W·h", bool(eb <= tol), f"{len(ids)} logits vs c·W·ρ(h) in numpy, c = {c:g}: "
                           f"max rel err {eb:.1e} (tol {tol:.0e})"))
    items.append(CheckItem("logit shift = c·W·δ", bool(es <= tol and cos > 0.99),
                           f"|δ| = 0.5·|h|: shift vs {how}: max rel err {es:.1e} (tol {tol:.0e}); vs plain c·W·δ "
                           f"{ep:.1e}, cosine {cos:.6f}"))
    engine.reset()
    return items


__all__ = ["CheckItem", "CheckReport", "self_test", "refusal_reason", "refusal_after_load", "missing_tensor_reason",
           "dequantize_rows", "round_activations", "type_name"]

