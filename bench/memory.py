"""Ingest throughput, ask latency split and peak RSS, each against a plain baseline.

1. ingest examples/s of each preset vs a plain forward pass (llama-cpp-python
   low-level API, no callback) over the same prompt+answer texts (target >= 0.8x), medians of
   --ingest-rounds rounds that alternate the rows; and the default preset's ways of extracting keys
   against the engine run as it was before keys stopped early ("full depth": every layer, KV
   buffers zeroed at each reset; target >= 2x);
2. ask latency split into prompt decode, retrieval (with the uncertainty
   direction for the paper preset) and generation, vs plain generation, with a
   synthetic memory of --prototypes prototypes (target: retrieval and
   uncertainty together <= 3% of the prompt decode at 10,000 prototypes);
3. peak RSS of a process running `ask` vs plain llama-cpp-python (low-level, same n_ctx; and
   the high-level `Llama`) on the same model and prompt, each child's own VmHWM, spawned from a
   bare launcher (bench/peak_rss.py says why; target <= 1.10x against the low-level baseline).

    python bench/memory.py [--examples 60] [--prototypes 10000] [--threads 2] [--ingest-rounds 3]
    python bench/memory.py --examples 8 --prototypes 1000 --reps 1 --ingest-rounds 1 --paper-top-k 0   # quickest
"""
from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
from engine import PlainLlama  # noqa: E402  (bench/engine.py)
import peak_rss  # noqa: E402  (bench/peak_rss.py)
from _report import Target, Targets, add_target_argument, print_header  # noqa: E402  (bench/_report.py)


def targets() -> list[Target]:
    return [Target("ingest", ">=", 0.8, "x", "ingest examples/s / plain forward pass, each preset"),
            Target("keys", ">=", 2.0, "x", "default-preset ingest / full depth, each way of extracting keys"),
            Target("retrieval", "<=", 3.0, "%", "retrieval / prompt pass at --prototypes, each preset"),
            Target("peak_rss", "<=", 1.10, "x", "peak RSS of ask / plain low-level llama-cpp-python")]


def plain_forward_rate(pl: PlainLlama, texts: list[list[int]]) -> float:
    t0 = time.perf_counter()
    for toks in texts:
        pl.reset()
        pl.decode(toks)
    return len(texts) / (time.perf_counter() - t0)


def synthetic_bank(m, n_protos: int, rng) -> None:
    """Fill m.bank with n_protos random prototypes of the preset's form (for timing only)."""
    from miita_edge.memory.bank import Prototype
    from miita_edge.memory import codecs
    H = m.engine.n_embd
    bank = m.bank
    K = H * bank.key_parts  # the stored key's width: the preset's key layers side by side
    if bank.key_mean is None and m.preset.center_keys:
        bank.key_mean = np.zeros(K, np.float32)
    for j in range(n_protos):
        k = codecs.roundtrip(rng.standard_normal((1, K)).astype(np.float32), bank.config.key_precision)
        if bank.config.payload == "mean":
            d = rng.standard_normal((1, H)).astype(np.float32)
            d /= np.linalg.norm(d)
            bank.protos.append(Prototype(d, np.zeros(0, np.int32), k, 1))
        else:
            toks = rng.integers(1000, 200000, 3).astype(np.int32)
            bank.protos.append(Prototype(np.zeros((0, H), np.float32), toks, k, 1))


def ask_split(m, text: str, max_tokens: int, reps: int) -> dict:
    eng = m.keyed_engine()  # the engine pools this memory's key layers (presets differ; the engine is shared)
    rows = []
    for _ in range(reps):
        toks, key_toks = m.prompt_tokens(text), m.key_tokens(text)
        t0 = time.perf_counter()
        st = m.pipeline.query_state(toks, key_toks)  # the prompt pass, and the key prompt's pass where it has one
        t1 = time.perf_counter()
        ids, scores, weights, plan = m.plan(st)[:4]
        t2 = time.perf_counter()
        eta = m.preset.eta * float(np.linalg.norm(st.h_q))
        g = eng.generate(st, max_tokens=max_tokens, stop=(), plan=plan, eta=eta, mode=m.preset.gate)
        t3 = time.perf_counter()
        rows.append((t1 - t0, t2 - t1, t3 - t2, len(g.tokens)))
    med = [statistics.median(r[i] for r in rows) for i in range(3)]
    return {"prompt_ms": med[0] * 1e3, "retrieval_ms": med[1] * 1e3, "generate_ms": med[2] * 1e3,
            "tokens": rows[0][3]}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--examples", type=int, default=60)
    ap.add_argument("--prototypes", type=int, default=10000)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--ingest-rounds", type=int, default=3,
                    help="section 1: rounds of one ingest per row, alternating (medians)")
    ap.add_argument("--paper-top-k", type=int, default=1024,
                    help="also time the paper preset with top-k R (Preset.correction_top_k; 0 = skip): not eq. 2 "
                         "exactly, the fast alternative when the exact LM-head pass is too slow")
    add_target_argument(ap, targets())
    args = ap.parse_args(argv)
    goals = Targets.from_args(targets(), args.target, ap)
    print_header(argv)
    launcher = peak_rss.Launcher()  # before the model is loaded: its children must not inherit our peak

    from miita_edge.demo.run import demo_stream
    from miita_edge.runtime.engine import Engine, EngineConfig
    from miita_edge.miita import KeyOptions, Miita

    train, test = demo_stream()
    train = train[: args.examples]
    eng = Engine(None, EngineConfig(n_threads=args.threads))
    pl = PlainLlama(eng.info.path, args.threads)
    print(f"# model={eng.info.path.name}  threads={args.threads}")

    # 1. ingest rate vs plain forward pass over the same texts
    m0 = Miita(engine=eng, memory=tempfile.mkdtemp(), template="plain")
    texts = [eng.tokenize(m0.template.render_prompt(e.input) + m0.template.render_target(e.output)) for e in train]
    plain_forward_rate(pl, texts[:5])  # warm-up
    print(f"\n1. ingest of {len(train)} demo examples (budget none), examples/s, medians of {args.ingest_rounds} rounds")
    import dataclasses
    from miita_edge.miita import paper_preset

    # "full depth": key-only passes compute every layer and each reset zeroes the KV buffers, as
    # ingest did before keys stopped early (the baseline of the >= 2x target); "default": as shipped, the
    # graph stops after the deepest key layer and a reset only frees the cells, one prompt per
    # decode (bitwise keys); "batched keys": 8 prompts per decode in one context; "2 contexts":
    # --contexts 2, two one-thread contexts side by side, 32 prompts per decode
    # (method.thread_ingest); "fast keys": --fast-keys, the same two contexts on the model's
    # lossless Q8_0 twin cut after the deepest key layer (runtime.key_twin). Every row times a
    # steady state: the engine's own context exists before its row, and the rows on sibling
    # contexts make theirs (and load the twin, written to the cache once per model) in an untimed
    # 4-example ingest first, whose time is printed. "full depth" ran at the rate of the code it stands
    # for, built and timed beside it (git show f98d7e6:docs/method.md, §11, "Retired experiments").
    variants = [("default, full depth", "default"), ("default", "default"), ("default, batched keys", "default"),
                ("default, 2 contexts", "default"), ("default, fast keys", "default"), ("paper", "paper")]
    if args.paper_top_k > 0:
        variants.append((f"paper, top-{args.paper_top_k} R",
                         dataclasses.replace(paper_preset(), correction_top_k=args.paper_top_k)))
    eng8 = Engine(None, EngineConfig(n_threads=args.threads, n_seq_max=8))  # 8 sequences: batched keys

    def setup(label, preset) -> Miita:
        batched = "batched keys" in label  # several prompts per llama_decode (off by default)
        keys = KeyOptions(batch=batched, contexts=2 if "2 contexts" in label else 1, fast="fast keys" in label)
        m = Miita(engine=eng8 if batched else eng, memory=tempfile.mkdtemp(), preset=preset, template="plain",
                  keys=keys)
        before = "full depth" in label  # the engine as it was: every layer, KV buffers zeroed per reset
        m.engine.config.keys_stop_early, m.engine.config.clear_kv_data = not before, before
        return m

    for label, preset in variants:  # first use: sibling contexts (and the twin's) made, untimed
        if "2 contexts" in label or "fast keys" in label:
            w = setup(label, preset)
            t0 = time.perf_counter()
            w.ingest(train[:4], budget="none", progress=False)
            w.engine.config.keys_stop_early, w.engine.config.clear_kv_data = True, False
            twin = w.fast_key_engine() if w.keys.fast else None
            print(f"   ({label}: first use, its contexts made{', the twin found or written and loaded' if twin else ''}, "
                  f"{time.perf_counter() - t0:.2f} s{f'; twin {twin.info.path.name}, {twin.n_layer} layers' if twin else ''})")
    got: dict[str, list[float]] = {label: [] for label, _ in variants}
    plain: dict[str, list[float]] = {label: [] for label, _ in variants}
    for _ in range(args.ingest_rounds):  # rounds alternate the rows, so drifts hit every row alike
        for label, preset in variants:
            base = plain_forward_rate(pl, texts)
            m = setup(label, preset)
            t0 = time.perf_counter()
            m.ingest(train, budget="none", progress=False)
            got[label].append(len(train) / (time.perf_counter() - t0))
            m.engine.config.keys_stop_early, m.engine.config.clear_kv_data = True, False
            plain[label].append((base + plain_forward_rate(pl, texts)) / 2)
    rates = {label: statistics.median(v) for label, v in got.items()}
    for label, _ in variants:
        rate, b = rates[label], statistics.median(plain[label])
        print(f"   {label:8s} ingest {rate:7.2f}/s   plain forward {b:7.2f}/s   ratio {rate / b:.2f}  "
              f"({goals.check('ingest', rate / b)})")
    eng8.close()
    base = rates["default, full depth"]
    for label in ("default", "default, batched keys", "default, 2 contexts", "default, fast keys"):
        per_round = ", ".join(f"{a / b_:.2f}" for a, b_ in zip(got[label], got["default, full depth"]))
        print(f"   default preset, {label} vs full depth: {rates[label] / base:.2f}x  "
              f"({goals.check('keys', rates[label] / base)}; rounds: {per_round})")

    # 2. ask latency split at N prototypes
    print(f"\n2. ask latency at {args.prototypes} synthetic prototypes (median of {args.reps}), ms")
    q = test[0].input
    for preset in ("default", "paper"):
        m = Miita(engine=eng, memory=tempfile.mkdtemp(), preset=preset, template="plain")
        synthetic_bank(m, args.prototypes, np.random.default_rng(0))
        # Steady state: a memory above ann_index's threshold builds its graph on a background
        # thread at first use (bench/ann.py times that); wait for it so it does not share the
        # cores with the passes timed here.
        index = m.retrieval_index()
        for front in (index.ann if isinstance(index.ann, tuple) else (index.ann,)) + \
                (getattr(index.scan, "ann", None) or (None,)):
            if front is not None:
                front.wait()
        r = ask_split(m, q, 16, args.reps)
        plain = []
        for _ in range(args.reps):
            toks = eng.tokenize(m.template.render_prompt(q))
            t0 = time.perf_counter()
            st = eng.query(toks)
            eng.generate(st, max_tokens=16, stop=())
            plain.append(time.perf_counter() - t0)
        share = r["retrieval_ms"] / r["prompt_ms"] * 100
        print(f"   {preset:8s} prompt {r['prompt_ms']:6.1f}  retrieval {r['retrieval_ms']:6.2f} ({share:.1f}% of prompt; "
              f"{goals.check('retrieval', share)})  generate {r['generate_ms']:6.1f} ({r['tokens']} tok)  "
              f"total {r['prompt_ms'] + r['retrieval_ms'] + r['generate_ms']:6.1f}  plain {statistics.median(plain) * 1e3:6.1f}")

    # 3. peak RSS: ask on a real (demo) memory vs plain llama-cpp-python, each child's own VmHWM
    mem = tempfile.mkdtemp()
    m = Miita(engine=eng, memory=mem, template="plain")
    m.ingest(train, budget="64KiB", progress=False)
    model = str(m.engine.info.path)
    n_ctx = eng.config.n_ctx
    pl.close()
    eng.close()
    peak = {mode: peak_rss.measure(launcher, mode, model, mem, q if mode == "ask" else m.template.render_prompt(q),
                                   n_ctx)["vmhwm_kib"] for mode in ("plain", "llama", "ask")}
    launcher.close()
    print(f"\n3. peak RSS (VmHWM, n_ctx {n_ctx}): plain low-level {peak['plain'] / 1024:.0f} MiB, Llama "
          f"{peak['llama'] / 1024:.0f} MiB, miita-edge ask {peak['ask'] / 1024:.0f} MiB; ratio to low-level "
          f"{peak['ask'] / peak['plain']:.3f} ({goals.check('peak_rss', peak['ask'] / peak['plain'])}), "
          f"to Llama {peak['ask'] / peak['llama']:.3f}")
    print(goals.summary())
    return 0


if __name__ == "__main__":
    sys.exit(main())
