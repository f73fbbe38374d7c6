"""A plain llama.cpp context with a Python eval callback, for the bench scripts that watch ggml's
nodes themselves (bench/batch_divergence.py, bench/decode_profile.py): independent of our native
callback, so what they see is llama.cpp's own computation."""
from __future__ import annotations

import ctypes
import os
from dataclasses import dataclass
from typing import Any


class Tensor(ctypes.Structure):  # the leading fields of ggml.h's struct ggml_tensor
    _fields_ = [("type", ctypes.c_int), ("buffer", ctypes.c_void_p), ("ne", ctypes.c_int64 * 4),
                ("nb", ctypes.c_size_t * 4), ("op", ctypes.c_int), ("op_params", ctypes.c_int32 * 16),
                ("flags", ctypes.c_int32), ("src", ctypes.c_void_p * 10), ("view_src", ctypes.c_void_p),
                ("view_offs", ctypes.c_size_t), ("data", ctypes.c_void_p), ("name", ctypes.c_char * 64)]


def tensor(t) -> Tensor:
    return ctypes.cast(t, ctypes.POINTER(Tensor)).contents


def ggml_base():
    """libggml-base of the installed llama-cpp-python, with the two name lookups typed."""
    import llama_cpp as L

    base = ctypes.CDLL(os.path.join(os.path.dirname(L.__file__), "lib", "libggml-base.so"))
    base.ggml_op_desc.restype = base.ggml_type_name.restype = ctypes.c_char_p
    base.ggml_op_desc.argtypes = [ctypes.c_void_p]
    base.ggml_type_name.argtypes = [ctypes.c_int]
    return base


@dataclass
class RawContext:
    L: Any
    model: Any
    ctx: Any
    vocab: Any
    mem: Any
    batch: Any

    def tokenize(self, text: str) -> list[int]:
        buf = (self.L.llama_token * 512)()
        n = self.L.llama_tokenize(self.vocab, text.encode(), len(text.encode()), buf, 512, True, True)
        return list(buf[:n])

    def fill(self, seqs: list[list[int]]) -> int:
        """One sequence per token list, positions from 0, no output rows; returns the row count."""
        b, r = self.batch, 0
        for s, toks in enumerate(seqs):
            for i, t in enumerate(toks):
                b.token[r], b.pos[r], b.n_seq_id[r], b.logits[r] = t, i, 1, 0
                b.seq_id[r][0] = s
                r += 1
        b.n_tokens = r
        return r

    def close(self) -> None:
        self.L.llama_batch_free(self.batch)
        self.L.llama_free(self.ctx)
        self.L.llama_model_free(self.model)


def open_context(cb, *, n_ctx: int, n_batch: int, n_seq_max: int, threads: int, kv_unified: bool = True,
                 flash: int | None = None) -> RawContext:
    """The embedded model loaded as the engine loads it, and a context calling ``cb`` (a
    ``llama_cpp.ggml_backend_sched_eval_callback``; keep a reference to it) at every node."""
    import llama_cpp as L

    from miita_edge.runtime.default_model import resolve_model_path
    from miita_edge.runtime.engine import cpu_has_amx

    L.llama_backend_init()
    mp = L.llama_model_default_params()
    mp.use_extra_bufts = not cpu_has_amx()  # as the engine loads it
    model = L.llama_model_load_from_file(str(resolve_model_path()).encode(), mp)
    cp = L.llama_context_default_params()
    cp.n_ctx, cp.n_batch, cp.n_ubatch = n_ctx, n_batch, n_batch
    if n_seq_max > 1:
        cp.n_seq_max, cp.kv_unified = n_seq_max, kv_unified
    cp.n_threads = cp.n_threads_batch = threads
    if flash is not None:
        cp.flash_attn_type = flash
    cp.cb_eval = cb
    ctx = L.llama_init_from_model(model, cp)
    return RawContext(L, model, ctx, L.llama_model_get_vocab(model), L.llama_get_memory(ctx),
                      L.llama_batch_init(n_batch, 0, 1))
