"""Where a key pass's time goes, operation by operation (issue 15: what limits batched ingest).

Decodes demo prompts the way key-only ingest does (no output rows, the graph stopped after layer
``--stop-layer``), one prompt per decode or ``--seqs`` prompts as separate sequences, through a
plain llama.cpp context whose Python eval callback watches every node: the scheduler then runs
the graph node by node and the time between two callbacks is the node's. Totals per operation
(matmuls by weight type and tensor), per token, and the share of the decode's wall time. Watching
every node adds a split per node, so absolute figures are pessimistic; compare shares and runs.

    python bench/decode_profile.py [--seqs 1] [--flash auto|on|off] [--per-sequence-kv] [--sort]
"""
from __future__ import annotations

import argparse
import collections
import os
import sys
import time


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--seqs", type=int, default=1, help="prompts per decode (separate sequences)")
    ap.add_argument("--prompts", type=int, default=64, help="demo prompts decoded per round")
    ap.add_argument("--rounds", type=int, default=3, help="timed rounds (after one warm-up round)")
    ap.add_argument("--flash", choices=["auto", "on", "off"], default="auto", help="flash attention")
    ap.add_argument("--per-sequence-kv", action="store_true", help="one KV stream per sequence (kv_unified off)")
    ap.add_argument("--sort", action="store_true", help="group prompts of similar length")
    ap.add_argument("--stop-layer", type=int, default=12, help="stop after this layer (the default preset's deepest key layer)")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--top", type=int, default=14)
    args = ap.parse_args(argv)

    import llama_cpp as L

    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    from _raw_llama import ggml_base, open_context, tensor  # bench/_raw_llama.py

    from miita_edge.demo.run import demo_stream
    from miita_edge.method.templates import get_template

    base = ggml_base()
    stop_name = f"l_out-{args.stop_layer}".encode()
    rec: list[tuple[str, float]] = []
    last = [0.0]

    @L.ggml_backend_sched_eval_callback
    def cb(t, ask, ud):
        if ask:
            return True
        now = time.perf_counter()
        tt = tensor(t)
        what = base.ggml_op_desc(t).decode()
        if what == "MUL_MAT" and tt.src[0]:
            src = tensor(tt.src[0])
            parts = src.name.decode().split(".")
            what += f" {base.ggml_type_name(src.type).decode()} {parts[-2] if len(parts) > 2 else parts[0]}"
        rec.append((what, now - last[0]))
        last[0] = time.perf_counter()
        return tt.name != stop_name  # False ends the graph here, as the engine's early stop does

    rc = open_context(cb, n_ctx=4096, n_batch=1024, n_seq_max=args.seqs, threads=args.threads,
                      kv_unified=not args.per_sequence_kv, flash={"auto": -1, "off": 0, "on": 1}[args.flash])

    train, _ = demo_stream()
    tpl = get_template("plain")
    prompts = [rc.tokenize(tpl.render_prompt(e.input)) for e in (train * 4)[:args.prompts]]
    if args.sort:
        prompts.sort(key=len)
    per_op: collections.Counter = collections.Counter()
    wall, tokens = 0.0, 0
    for rnd in range(args.rounds + 1):
        for g in range(0, len(prompts), args.seqs):
            L.llama_memory_clear(rc.mem, False)
            r = rc.fill(prompts[g:g + args.seqs])
            rec.clear()
            last[0] = t0 = time.perf_counter()
            L.llama_decode(rc.ctx, rc.batch)  # stopped by the callback: not an error here
            if rnd:
                wall += time.perf_counter() - t0
                tokens += r
                for w, d in rec:
                    per_op[w] += d
    print(f"# bench/decode_profile.py  {args.seqs} per decode, flash {args.flash}, "
          f"{'per-sequence' if args.per_sequence_kv else 'unified'} KV{', sorted' if args.sort else ''}, "
          f"stop after layer {args.stop_layer}, threads {args.threads}")
    print(f"   {tokens / wall:7.0f} tokens/s; nodes account for {sum(per_op.values()) / wall:.2f} of the wall time")
    for w, d in per_op.most_common(args.top):
        print(f"   {w:34s} {1e6 * d / tokens:7.1f} us/token  {100 * d / wall:5.1f}%")
    kinds: collections.Counter = collections.Counter()
    for w, d in per_op.items():
        kinds[" ".join(w.split()[:2]) if w.startswith("MUL_MAT") else w] += d
    print("   by kind: " + ", ".join(f"{w} {100 * d / wall:.1f}%" for w, d in kinds.most_common(6)))
    rc.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
