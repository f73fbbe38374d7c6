"""Where a prompt's rows stop being bitwise equal when other prompts share its ``llama_decode``.

Issue 15 asks for batched key extraction equal to one-at-a-time extraction, bitwise or within a
stated tolerance. Batched keys are within ~1e-5 (cosine) but not bitwise, and the product needs
bitwise keys (the gate's exact-repeat rule, forget's array-for-array property). This script finds
*which* operation makes a row depend on its neighbours: it decodes a prompt P alone, then after a
lead-in sequence of n tokens in the same ubatch (P a separate sequence, unified KV cache), watches
every tensor of layers 0..--layers with a Python eval callback (independent of our native code)
and prints, per case, the first tensor whose P rows differ and which rows.

    python bench/batch_divergence.py [--layers 12] [--leads 0,3,4,5,6,40,44]

Watching every tensor splits the graph at each node; both decodes of a case are split alike.
"""
from __future__ import annotations

import argparse
import ctypes

import numpy as np

P_INPUT = "I lost my card"  # in the banking77 template
LEAD_TEXT = ("The quick brown fox jumps over the lazy dog while the cat sleeps on a warm windowsill in the "
             "afternoon sun and birds sing in the old oak tree by the river bank")


class _Tensor(ctypes.Structure):  # the leading fields of ggml.h's struct ggml_tensor
    _fields_ = [("type", ctypes.c_int), ("buffer", ctypes.c_void_p), ("ne", ctypes.c_int64 * 4),
                ("nb", ctypes.c_size_t * 4), ("op", ctypes.c_int), ("op_params", ctypes.c_int32 * 16),
                ("flags", ctypes.c_int32), ("src", ctypes.c_void_p * 10), ("view_src", ctypes.c_void_p),
                ("view_offs", ctypes.c_size_t), ("data", ctypes.c_void_p), ("name", ctypes.c_char * 64)]


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--layers", type=int, default=12, help="watch layers 0..N (the default preset's deepest key layer)")
    ap.add_argument("--leads", default="0,3,4,5,6,40,44", help="lead-in lengths (tokens) decoded before P")
    ap.add_argument("--pad", type=int, default=4, help="P is padded with filler tokens to a multiple of this")
    ap.add_argument("--threads", type=int, default=2)
    args = ap.parse_args(argv)

    import llama_cpp as L

    from miita_edge.method.templates import get_template
    from miita_edge.runtime.default_model import resolve_model_path
    from miita_edge.runtime.engine import cpu_has_amx

    import os

    base = ctypes.CDLL(os.path.join(os.path.dirname(L.__file__), "lib", "libggml-base.so"))
    base.ggml_op_desc.restype = base.ggml_type_name.restype = ctypes.c_char_p
    base.ggml_op_desc.argtypes = [ctypes.c_void_p]
    base.ggml_type_name.argtypes = [ctypes.c_int]

    def describe(t, tt) -> str:
        """The op, and the first operand's type when it is a weight (a matmul's quantisation)."""
        what = base.ggml_op_desc(t).decode()
        if tt.src[0]:
            src = ctypes.cast(tt.src[0], ctypes.POINTER(_Tensor)).contents
            what += f" of {src.name.decode()} ({base.ggml_type_name(src.type).decode()})"
        return f"{tt.name.decode()} = {what}"

    rec: list[tuple[str, np.ndarray | None, tuple]] = []

    @L.ggml_backend_sched_eval_callback
    def cb(t, ask, ud):
        tt = ctypes.cast(t, ctypes.POINTER(_Tensor)).contents
        name = tt.name.decode()
        layer = name.rsplit("-", 1)[1] if "-" in name else ""
        if layer.split(" ")[0].isdigit() and int(layer.split(" ")[0]) > args.layers:
            return not ask
        if ask:
            return True
        ne = tuple(tt.ne)
        arr = None
        if tt.type == 0 and tt.nb[1] == 4 * ne[0]:  # contiguous float32
            n = ne[0] * ne[1] * ne[2] * ne[3]
            arr = np.ctypeslib.as_array(ctypes.cast(tt.data, ctypes.POINTER(ctypes.c_float)), shape=(n,)).copy()
        rec.append((describe(t, tt), arr, ne))
        return True

    L.llama_backend_init()
    mp = L.llama_model_default_params()
    mp.use_extra_bufts = not cpu_has_amx()  # as the engine loads it
    model = L.llama_model_load_from_file(str(resolve_model_path()).encode(), mp)
    cp = L.llama_context_default_params()
    cp.n_ctx, cp.n_batch, cp.n_ubatch = 1024, 512, 512
    cp.n_seq_max, cp.kv_unified = 2, True
    cp.n_threads = cp.n_threads_batch = args.threads
    cp.cb_eval = cb
    ctx = L.llama_init_from_model(model, cp)
    vocab = L.llama_model_get_vocab(model)
    mem = L.llama_get_memory(ctx)
    batch = L.llama_batch_init(512, 0, 1)

    def tokenize(text: str) -> list[int]:
        buf = (L.llama_token * 512)()
        n = L.llama_tokenize(vocab, text.encode(), len(text.encode()), buf, 512, True, True)
        return list(buf[:n])

    def run(seqs: list[list[int]]) -> list:
        rec.clear()
        L.llama_memory_clear(mem, True)
        r = 0
        for s, toks in enumerate(seqs):
            for i, t in enumerate(toks):
                batch.token[r], batch.pos[r], batch.n_seq_id[r], batch.logits[r] = t, i, 1, 0
                batch.seq_id[r][0] = s
                r += 1
        batch.logits[r - 1] = 1
        batch.n_tokens = r
        if L.llama_decode(ctx, batch) != 0:
            raise SystemExit("llama_decode failed")
        return list(rec)

    def p_rows(arr, ne, n_rows, off, n):
        """P's rows of a tensor whose token axis is ne[1] or ne[2] (None if it has neither)."""
        if ne[1] == n_rows:
            return arr.reshape(n_rows, -1)[off:off + n]
        if ne[2] == n_rows and ne[3] == 1:
            return arr.reshape(n_rows, -1)[off:off + n]
        return None

    P = tokenize(get_template("banking77").render_prompt(P_INPUT))
    P = P + [P[-1]] * ((-len(P)) % max(1, args.pad))
    lead_all = tokenize(LEAD_TEXT)
    print(f"# bench/batch_divergence.py  P = {len(P)} tokens (padded to a multiple of {args.pad}), layers 0..{args.layers}")
    alone = run([P])
    for n in map(int, args.leads.split(",")):
        if n == 0:
            print(f"   lead-in  0: P alone twice -> {'bitwise equal' if _first_diff(alone, run([P]), len(P), len(P), 0, len(P), p_rows) is None else 'DIFFERS'}")
            continue
        lead = (lead_all * (n // len(lead_all) + 1))[:n]
        ubatch = n + len(P)
        got = _first_diff(alone, run([lead, P]), len(P), ubatch, n, len(P), p_rows)
        where = "bitwise equal through every watched tensor" if got is None else f"first differs at {got}"
        print(f"   lead-in {n:2d}: ubatch {ubatch:3d} rows (mod 4 = {ubatch % 4}, {'>=' if ubatch >= 64 else '< '} 64) -> {where}")
    L.llama_batch_free(batch)
    L.llama_free(ctx)
    L.llama_model_free(model)
    return 0


def _first_diff(a, b, n_a, n_b, off, n, p_rows):
    for (name, xa, na), (_, xb, nb) in zip(a, b):
        if xa is None or xb is None:
            continue
        pa, pb = p_rows(xa, na, n_a, 0, n), p_rows(xb, nb, n_b, off, n)
        if pa is None or pb is None or pa.shape != pb.shape:
            continue
        if not np.array_equal(pa, pb):
            rows = [i for i in range(n) if not np.array_equal(pa[i], pb[i])]
            return f"{name} (P rows {rows if len(rows) <= 6 else f'{rows[:3]}..{rows[-1]} ({len(rows)})'}, max |diff| {np.abs(pa - pb).max():.3g})"
    return None


if __name__ == "__main__":
    raise SystemExit(main())
