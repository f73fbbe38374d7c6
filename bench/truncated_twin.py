"""Would a copy of the model cut after the deepest key layer make default-preset ingest reach 2x?

A version-4 key needs layer 12's output only at the prompt's last row, but the key-only pass
(stopped after ``l_out-12`` by the callback) computes layer 12 whole for every row: llama.cpp keeps
only the output rows (``inp_out_ids``) in the *last* layer of a model, and layer 12 is not the last
of Gemma-3-270M's 18. A GGUF copy with ``block_count`` 13 and no tensors past layer 12 makes it the
last one, so its feed-forward half runs on the marked rows only. llama.cpp cannot be told this at
load time (``kv_overrides`` on ``block_count`` leaves tensors unused, which the loader refuses), so
the copy is a second file. This script writes two such copies to a temporary directory (the
original tensor types, and with the Q5_0 weights re-encoded as Q8_0 as in bench/q8_twin.py), then:

1. times ingest-shaped passes over the demo stream (``plain`` template), rounds alternating (medians):
   the pre-issue stand-in (every layer to ``result_norm``, KV zeroed at each reset), today's
   default (full model, stop after ``l_out-12``, one prompt per decode), batched keys (16 prompts
   per decode) and each copy one per decode and batched, the last row of each prompt marked as its
   output;
2. checks whether each copy's keys (the sum of ``l_out-9`` rows and ``l_out-12``'s last row, one
   prompt per decode) are bitwise the full model's.

All rows run with the same Python eval callback (watching ``l_out-9``, ``l_out-12`` and
``result_norm``), so its overhead is in every row and the ratios compare. It measures the cut on
llama.cpp directly; ``--fast-keys`` uses such a copy (``runtime/key_twin.py``, docs/benchmarks.md,
issue 15 eleventh pass).

    python bench/truncated_twin.py [--prompts 160] [--rounds 3] [--threads 2] [--check 80]
"""
from __future__ import annotations

import argparse
import ctypes
import statistics
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _raw_llama import tensor  # noqa: E402

KEY_LAST, KEY_SUM, NORM = b"l_out-12", b"l_out-9", b"result_norm"


def write_truncated(src: Path, dst: Path, keep: int, q8: bool) -> None:
    """``src`` with layers >= ``keep`` dropped and ``block_count`` = ``keep`` (``q8``: Q5_0 as Q8_0)."""
    from miita_edge.runtime.key_twin import copy_gguf

    copy_gguf(src, dst, q5_0_to_q8_0=q8, layers=keep)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--prompts", type=int, default=160, help="demo prompts per timed pass over the stream")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--seqs", type=int, default=16, help="prompts per decode in the batched rows")
    ap.add_argument("--check", type=int, default=80, help="prompts compared bit for bit (0: skip)")
    args = ap.parse_args(argv)

    import llama_cpp as L

    from miita_edge.demo.run import demo_stream
    from miita_edge.runtime.default_model import resolve_model_path
    from miita_edge.runtime.engine import cpu_has_amx

    L.llama_backend_init()
    state = {"stop_at": KEY_LAST, "got": None}

    @L.ggml_backend_sched_eval_callback
    def cb(t, ask, _ud):
        name = tensor(t).name
        if ask:
            return name in (KEY_LAST, KEY_SUM, NORM)
        if state["got"] is not None and name in (KEY_LAST, KEY_SUM):
            T = tensor(t)
            rows = np.ctypeslib.as_array(ctypes.cast(T.data, ctypes.POINTER(ctypes.c_float)), shape=(T.ne[1], T.ne[0]))
            state["got"][name] = rows.sum(0) if name == KEY_SUM else rows[-1].copy()
        return name != state["stop_at"]  # False: the scheduler leaves the rest of the graph uncomputed

    def load(path: Path, n_seq: int):
        mp = L.llama_model_default_params()
        mp.use_extra_bufts = not cpu_has_amx()  # as the engine loads it
        model = L.llama_model_load_from_file(str(path).encode(), mp)
        cp = L.llama_context_default_params()
        cp.n_ctx, cp.n_batch, cp.n_ubatch, cp.n_seq_max = 4096, 512, 512, n_seq
        cp.kv_unified = True  # as the engine makes it: one KV pool (per-sequence pools split the batch)
        cp.n_threads = cp.n_threads_batch = args.threads
        cp.cb_eval = cb
        return model, L.llama_init_from_model(model, cp)

    src = resolve_model_path()
    tmp = tempfile.TemporaryDirectory(prefix="miita-truncated-")
    t0 = time.perf_counter()
    paths = {"full": src, "cut": Path(tmp.name) / "cut.gguf", "cut Q8_0": Path(tmp.name) / "cut_q8.gguf"}
    write_truncated(src, paths["cut"], 13, q8=False)
    write_truncated(src, paths["cut Q8_0"], 13, q8=True)
    print(f"# bench/truncated_twin.py  copies cut after layer 12 ({paths['cut'].stat().st_size / 2**20:.0f} MiB; "
          f"Q8_0: {paths['cut Q8_0'].stat().st_size / 2**20:.0f} MiB; original {src.stat().st_size / 2**20:.0f} MiB), "
          f"written in {time.perf_counter() - t0:.1f} s; threads={args.threads}")
    ctxs = {(k, n): load(p, n) for k, p in paths.items() for n in (1, args.seqs)}
    vocab = L.llama_model_get_vocab(ctxs[("full", 1)][0])
    train, _ = demo_stream()

    def tok(text: str) -> list[int]:
        b = text.encode()
        buf = (L.llama_token * 512)()
        return list(buf[:L.llama_tokenize(vocab, b, len(b), buf, 512, True, True)])

    prompts = [tok(e.input + "\nAnswer:") for e in train]
    prompts = (prompts * (args.prompts // len(prompts) + 1))[:args.prompts]
    batch = L.llama_batch_init(512, 0, 1)

    def decode(ctx, group, mark_last: bool, zero: bool) -> None:
        L.llama_memory_clear(L.llama_get_memory(ctx), zero)
        r = 0
        for s, toks in enumerate(group):
            for i, t in enumerate(toks):
                batch.token[r], batch.pos[r], batch.n_seq_id[r] = t, i, 1
                batch.logits[r] = int(mark_last and i == len(toks) - 1)
                batch.seq_id[r][0] = s
                r += 1
        batch.n_tokens = r
        L.llama_decode(ctx, batch)

    # (label, model, prompts per decode, stop after, mark each prompt's last row, zero KV at reset)
    rows = [("pre-issue stand-in (every layer, KV zeroed)", "full", 1, NORM, True, True),
            ("default (full model, stop after l_out-12)", "full", 1, KEY_LAST, False, False),
            (f"batched keys, {args.seqs} per decode", "full", args.seqs, KEY_LAST, False, False),
            ("cut copy, one per decode", "cut", 1, KEY_LAST, True, False),
            (f"cut copy, {args.seqs} per decode", "cut", args.seqs, KEY_LAST, True, False),
            ("cut Q8_0 copy, one per decode", "cut Q8_0", 1, KEY_LAST, True, False),
            (f"cut Q8_0 copy, {args.seqs} per decode", "cut Q8_0", args.seqs, KEY_LAST, True, False)]

    def rate(label, model, n, stop, mark, zero) -> float:
        ctx = ctxs[(model, n)][1]
        state["stop_at"] = stop
        t = time.perf_counter()
        for g in range(0, len(prompts), n):
            decode(ctx, prompts[g:g + n], mark, zero)
        return len(prompts) / (time.perf_counter() - t)

    for row in rows:  # warm-up
        rate(*row)
    got: dict[str, list[float]] = {row[0]: [] for row in rows}
    for _ in range(args.rounds):
        for row in rows:
            got[row[0]].append(rate(*row))
    base = statistics.median(got[rows[0][0]])
    print(f"1. {len(prompts)} demo prompts (template plain, mean {np.mean([len(p) for p in prompts]):.1f} tokens), "
          f"medians of {args.rounds} rounds")
    for label, xs in got.items():
        m = statistics.median(xs)
        print(f"   {label:46s} {m:6.1f} prompts/s  {m / base:5.2f}x the stand-in")

    if args.check:
        state["stop_at"] = KEY_LAST
        equal = {"cut": 0, "cut Q8_0": 0}
        differ: dict[str, list[int]] = {"cut": [], "cut Q8_0": []}
        for p in prompts[:args.check]:
            keys = {}
            for k in ("full", "cut", "cut Q8_0"):
                state["got"] = {}
                decode(ctxs[(k, 1)][1], [p], k != "full", False)
                keys[k] = state["got"]
            state["got"] = None
            for k in equal:
                same = all(np.array_equal(keys[k][n], keys["full"][n]) for n in (KEY_LAST, KEY_SUM))
                equal[k] += same
                if not same:
                    differ[k].append(len(p) % 4)
        print(f"2. keys bitwise the full model's, one prompt per decode: "
              + ", ".join(f"{k} {v}/{args.check}" for k, v in equal.items()))
        for k, mods in differ.items():
            print(f"   {k}: the prompts that differ, by length mod 4: "
                  + ", ".join(f"{r}: {mods.count(r)}" for r in range(4)))
    L.llama_batch_free(batch)
    for model, ctx in ctxs.values():
        L.llama_free(ctx)
        L.llama_model_free(model)
    tmp.cleanup()
    return 0


if __name__ == "__main__":
    sys.exit(main())
