"""Engine overhead and LM-head kernel cost, measured in one run on one model.

Prints prompt and decode tokens/s of plain llama-cpp-python (low-level API, no
callback) and of the miita-edge engine with key capture and gated addition on,
their ratios, and ms per target token of the correction vector R in exact and
top-k modes. Runs alternate A/B rounds and report medians, because the
machines this runs on are noisy: only the ratios are meant to be compared.

    python bench/engine.py [--model GGUF] [--threads 2] [--rounds 5] [--target NAME=LIMIT]
    python bench/engine.py --rounds 1 --gen 8        # quickest run
"""
from __future__ import annotations

import argparse
import statistics
import sys
import time

import numpy as np

from _report import Target, Targets, add_target_argument, print_header

PROMPT = ("Classify the banking customer query into an intent. " * 6 +
          "\nQuery: I was charged twice for the same coffee and want my money back\nIntent:")


class PlainLlama:
    """llama-cpp-python's low-level API with the same parameters, and no callback."""

    def __init__(self, path, n_threads, n_ctx=2048, n_batch=512, use_extra_bufts=False):
        import llama_cpp as L

        self.L = L
        mp = L.llama_model_default_params()
        mp.use_extra_bufts = use_extra_bufts
        self.model = L.llama_model_load_from_file(str(path).encode(), mp)
        cp = L.llama_context_default_params()
        cp.n_ctx, cp.n_batch, cp.n_ubatch = n_ctx, n_batch, n_batch
        cp.n_threads = cp.n_threads_batch = n_threads
        cp.no_perf = True
        self.ctx = L.llama_init_from_model(self.model, cp)
        self.mem = L.llama_get_memory(self.ctx)
        self.batch = L.llama_batch_init(n_batch, 0, 1)
        self.n_vocab = L.llama_vocab_n_tokens(L.llama_model_get_vocab(self.model))
        self.n_past = 0

    def reset(self):
        self.L.llama_memory_clear(self.mem, True)
        self.n_past = 0

    def decode(self, tokens, last_logits=True):
        b = self.batch
        for i, t in enumerate(tokens):
            b.token[i], b.pos[i], b.n_seq_id[i], b.logits[i] = t, self.n_past + i, 1, 0
            b.seq_id[i][0] = 0
        b.logits[len(tokens) - 1] = 1 if last_logits else 0
        b.n_tokens = len(tokens)
        assert self.L.llama_decode(self.ctx, b) == 0
        self.n_past += len(tokens)
        ptr = self.L.llama_get_logits_ith(self.ctx, len(tokens) - 1)
        return np.ctypeslib.as_array(ptr, shape=(self.n_vocab,))

    def close(self):
        self.L.llama_batch_free(self.batch)
        self.L.llama_free(self.ctx)
        self.L.llama_model_free(self.model)


def time_plain(pl: PlainLlama, toks, n_gen):
    pl.reset()
    t0 = time.perf_counter()
    logits = pl.decode(toks)
    t1 = time.perf_counter()
    tok = int(np.argmax(logits))
    for _ in range(n_gen):
        tok = int(np.argmax(pl.decode([tok])))
    t2 = time.perf_counter()
    return len(toks) / (t1 - t0), n_gen / (t2 - t1)


def time_engine(eng, toks, n_gen, d):
    """Key capture on the prompt; gated addition on every generated step."""
    eng.reset()
    t0 = time.perf_counter()
    st = eng.query(toks)
    t1 = time.perf_counter()
    eng.set_steer(d, st.h_q, 1.0, "gated")
    tok = int(np.argmax(st.logits))
    for _ in range(n_gen):
        tok = int(np.argmax(eng.decode([tok], "last")[0]))
    t2 = time.perf_counter()
    eng.set_steer(None, None, 0.0, "off")
    return len(toks) / (t1 - t0), n_gen / (t2 - t1)


def targets() -> list[Target]:
    return [Target("prompt", ">=", 0.98, "", "prompt tok/s, engine / plain"),
            Target("decode", ">=", 0.98, "", "decode tok/s, engine / plain"),
            Target("exact_r", "<=", 60.0, " ms", "exact R per target token, 1-token answer"),
            Target("topk_r", "<=", 2.0, " ms", "top-k R per target token, 1-token answer")]


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default=None, help="GGUF path (default: the embedded Gemma-3-270M)")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--gen", type=int, default=48, help="generated tokens per round")
    add_target_argument(ap, targets())
    args = ap.parse_args(argv)
    goals = Targets.from_args(targets(), args.target, ap)
    print_header(argv)

    from miita_edge.errors import MiitaError
    from miita_edge.runtime.engine import Engine, EngineConfig, cpu_has_amx

    try:  # any GGUF that `miita-edge check-model` calls supported; a refused one gets its one-line reason
        eng = Engine(args.model, EngineConfig(n_ctx=2048, n_batch=512, n_threads=args.threads))
    except MiitaError as exc:
        print(f"bench/engine.py: error: {exc}", file=sys.stderr)
        return 2
    pl = PlainLlama(eng.info.path, args.threads, use_extra_bufts=eng.config.use_extra_bufts
                    if eng.config.use_extra_bufts is not None else not cpu_has_amx())
    toks = eng.tokenize(PROMPT)
    d = np.random.default_rng(0).standard_normal(eng.n_embd).astype(np.float32)
    d /= np.linalg.norm(d)
    # warm-up both
    time_plain(pl, toks, 4)
    time_engine(eng, toks, 4, d)
    rows = {"plain": [], "engine": []}
    for _ in range(args.rounds):
        rows["plain"].append(time_plain(pl, toks, args.gen))
        rows["engine"].append(time_engine(eng, toks, args.gen, d))
    med = {k: (statistics.median(r[0] for r in v), statistics.median(r[1] for r in v)) for k, v in rows.items()}
    # per-round ratios (paired), then the median: robust to drifting machine load
    pr = statistics.median(e[0] / p[0] for p, e in zip(rows["plain"], rows["engine"]))
    dr = statistics.median(e[1] / p[1] for p, e in zip(rows["plain"], rows["engine"]))

    print(f"# model={eng.info.path.name}  threads={args.threads}  rounds={args.rounds}")
    print(f"prompt tokens={len(toks)}  generated tokens={args.gen}")
    print(f"{'':22s}{'prompt tok/s':>14s}{'decode tok/s':>14s}")
    print(f"{'plain llama-cpp-python':22s}{med['plain'][0]:14.1f}{med['plain'][1]:14.1f}")
    print(f"{'engine (key+gated add)':22s}{med['engine'][0]:14.1f}{med['engine'][1]:14.1f}")
    print(f"ratio engine/plain: prompt {pr:.3f} ({goals.check('prompt', pr)})  "
          f"decode {dr:.3f} ({goals.check('decode', dr)})")

    # R cost per target token: logits of a real 8-token answer
    target = eng.tokenize(" card payment fee charged twice today\n", add_bos=False)[:8]
    eng.reset()
    flags = [False] * (len(toks) - 1) + [True] * len(target) + [False]
    logits = eng.decode(toks + target, flags)[: len(target)]
    lm = eng.lm_head
    for name, k, T in (("exact, 1 token", 0, 1), (f"exact, {len(target)} tokens", 0, len(target)),
                       ("top-k 1024, 1 token", 1024, 1), (f"top-k 1024, {len(target)} tokens", 1024, len(target))):
        ts = []
        for _ in range(args.rounds):
            t0 = time.perf_counter()
            lm.correction(logits[:T], target[:T], top_k=k, per_position=True)
            ts.append(time.perf_counter() - t0)
        ms = statistics.median(ts) / T * 1e3
        goal = {"exact, 1 token": "exact_r", "top-k 1024, 1 token": "topk_r"}.get(name)
        print(f"R {name:24s} {ms:8.2f} ms per target token" + (f"  ({goals.check(goal, ms)})" if goal else ""))
    print(goals.summary())
    pl.close()
    eng.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
