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
import os
import sys

import numpy as np

P_INPUT = "I lost my card"  # in the banking77 template
LEAD_TEXT = ("The quick brown fox jumps over the lazy dog while the cat sleeps on a warm windowsill in the "
             "afternoon sun and birds sing in the old oak tree by the river bank")


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--layers", type=int, default=12, help="watch layers 0..N (the default preset's deepest key layer)")
    ap.add_argument("--leads", default="0,3,4,5,6,40,44", help="lead-in lengths (tokens) decoded before P")
    ap.add_argument("--pad", type=int, default=4, help="P is padded with filler tokens to a multiple of this")
    ap.add_argument("--threads", type=int, default=2)
    args = ap.parse_args(argv)

    import llama_cpp as L

    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    from _raw_llama import ggml_base, open_context, tensor  # bench/_raw_llama.py

    from miita_edge.method.templates import get_template

    base = ggml_base()

    def describe(t, tt) -> str:
        """The op, and the first operand's type when it is a weight (a matmul's quantisation)."""
        what = base.ggml_op_desc(t).decode()
        if tt.src[0]:
            src = tensor(tt.src[0])
            what += f" of {src.name.decode()} ({base.ggml_type_name(src.type).decode()})"
        return f"{tt.name.decode()} = {what}"

    rec: list[tuple[str, np.ndarray | None, tuple]] = []

    @L.ggml_backend_sched_eval_callback
    def cb(t, ask, ud):
        tt = tensor(t)
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

    rc = open_context(cb, n_ctx=1024, n_batch=512, n_seq_max=2, threads=args.threads)

    def run(seqs: list[list[int]]) -> list:
        rec.clear()
        L.llama_memory_clear(rc.mem, True)
        r = rc.fill(seqs)
        rc.batch.logits[r - 1] = 1
        if L.llama_decode(rc.ctx, rc.batch) != 0:
            raise SystemExit("llama_decode failed")
        return list(rec)

    def p_rows(arr, ne, n_rows, off, n):
        """P's rows of a tensor whose token axis is ne[1] or ne[2] (None if it has neither)."""
        if ne[1] == n_rows:
            return arr.reshape(n_rows, -1)[off:off + n]
        if ne[2] == n_rows and ne[3] == 1:
            return arr.reshape(n_rows, -1)[off:off + n]
        return None

    P = rc.tokenize(get_template("banking77").render_prompt(P_INPUT))
    P = P + [P[-1]] * ((-len(P)) % max(1, args.pad))
    lead_all = rc.tokenize(LEAD_TEXT)
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
    rc.close()
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
