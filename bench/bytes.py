"""Where a memory's bytes go under a byte budget: for each budget, a fresh default-preset memory
learns a benchmark's stream and this prints what its committed bytes are spent on, which answers it
still holds, and how often retrieval alone and the steered answer are right on the dev rows.

Why: at 1% the default preset does much worse on Banking77 than at 5%; before the repair mechanism
is changed, this says which part of the budget (keys, answers, framing) the bytes go to and whether
the loss is in what the memory keeps or in how it is read.

The stream is the benchmark's runner stream: every selected stage's training rows (dev rows left
out), taught stage by stage in order with the budget resolved once, as absolute bytes, against the
whole learned stream (``evaluation/runner.py``'s rule). The questions are the same stages' dev rows.
Per budget:

* bytes used / allowed, and per distinct answer of the stream: keys (anchor bits; ``centroid`` the
  share of them in anchors that repair folded), answer tokens, payload vectors, framing (file
  header, the manifest, padding, the per-record counts): ``memory.accounting``, whose parts add
  up to the store's count (checked here against the committed file as well);
* answers in the stream, answers that keep a prototype, prototypes and anchors per kept answer;
* the key width after repair (bits);
* on the dev rows: the share whose gold answer the memory still holds, the vote's accuracy
  (``Miita.plan`` then ``steering.vote``, as the ``label-vote`` method: no generation; a query the
  relevance gate declines votes for nothing), how many the gate declined, and with ``--steered``
  the accuracy of ``Miita.ask`` (greedy, the benchmark's new-token limit).

Keys are extracted once (``--cache``, an ``evaluation.extract_cache`` directory) and reused by
every budget. A budget too small for one prototype is reported as such.

    python bench/bytes.py [--model GGUF] [--threads 1] [--benchmark banking77] [--stages 1-7]
        [--budgets 0.1%,0.25%,0.5%,1%,2%,5%] [--limit-train N] [--limit N] [--steered] [--cache DIR]
        [--min-key-bits N] [--nearest-z Z] [--set FIELD=VALUE] [--unstored FIELD,...]
"""
from __future__ import annotations

import argparse
import dataclasses
import sys
import tempfile
import time
from contextlib import closing
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _report import ROOT, print_header  # noqa: E402

DATA = ROOT.parent / "shared" / "data"
BUDGETS = "0.1%,0.25%,0.5%,1%,2%,5%"
#: The test suite's off-topic prompts (general questions and small talk no benchmark answer fits).
OFFTOPIC = [t.strip() for t in (ROOT / "tests" / "data" / "offtopic.txt").read_text("utf-8").splitlines() if t.strip()]


def account_memory(m, stream_answers: list[str]) -> dict:
    """The committed memory's byte account and answer coverage (``memory.accounting``), its total
    checked against the committed file and the facade's own count."""
    from miita_edge.memory.accounting import account, answer_coverage

    snap = m.store.read()
    acc = account(snap.arrays, snap.manifest, snap.format_version)
    if not acc.total == snap.bytes_on_disk == m.nbytes():
        raise AssertionError(f"account {acc.total} B, file {snap.bytes_on_disk} B, memory {m.nbytes()} B")
    bank = m.bank
    labels = answer_texts(m)
    per = np.bincount(np.asarray(bank.anchor_owner(), np.int64), minlength=bank.n_prototypes)
    cov = answer_coverage(labels, per.tolist(), stream_answers)
    return {"account": acc, "coverage": cov, "labels": labels, "key_bits": bank.key_dim,
            "full_bits": bank.n_embd * bank.key_parts, "prototypes": bank.n_prototypes, "anchors": bank.n_anchors}


def answer_texts(m) -> list[str]:
    """Each prototype's stored answer as text (the vote's candidates, as ``LabelVote.labels``)."""
    eng = m.keyed_engine()
    return [eng.detokenize(t).strip() for t in m.bank.answer_tokens()]


def ask_dev(m, items, labels: list[str], max_tokens: int, steered: bool, offtopic: list[str] = ()) -> dict:
    """The vote's answer for each dev row (its prompt pass, ``Miita.plan``, ``steering.vote``), the
    vote's without the relevance gate (the preset with ``relevance_gate`` off, through its own
    ``Pipeline``) and, with ``steered``, ``Miita.ask``'s; each scored by the benchmark's label match.
    ``offtopic``: prompts no answer fits, counted where the gate lets some answer steer."""
    from miita_edge.evaluation.metrics import label_match, normalize_label
    from miita_edge.method.pipeline import Pipeline
    from miita_edge.method.steering import vote

    held = {normalize_label(t) for t in labels}
    out = {"n": len(items), "held": 0, "vote": 0, "declined": 0, "ungated": 0, "steered": 0, "agree": 0,
           "reasons": {}}  # declined queries by the test that closed the gate
    # agree: steered answers equal to the vote's, among the queries the vote answered (on a declined
    # query the frozen model answers, which no vote can agree with)
    # the same memory read by the same preset without the relevance gate: is a loss the vote's or the gate's?
    open_pipe = Pipeline(dataclasses.replace(m.preset, relevance_gate=False, null_gate=False), m.engine, m.template,
                         m.fingerprint())
    for it in items:
        x = it.example.input
        out["held"] += any(normalize_label(g) in held for g in it.golds)
        state = m.pipeline.query_state(m.prompt_tokens(x), m.key_tokens(x))  # the key from the key prompt; no text: gate and vote
        qp = m.plan(state)
        if qp.gate is not None and not qp.gate.adapted:
            out["declined"] += 1
            why = qp.gate.reason or ""
            key = ("general questions" if "general questions" in why else "radius" if "radius" in why
                   else "taught once" if "one example" in why or "paraphrase" in why else why[:40])
            out["reasons"][key] = out["reasons"].get(key, 0) + 1
        picked = vote(qp.ids, qp.weights, labels) or ""
        out["vote"] += label_match(picked, it.golds)
        qo = open_pipe.plan(m.bank, None, state)
        out["ungated"] += label_match(vote(qo.ids, qo.weights, labels) or "", it.golds)
        if steered:
            text = m.ask(x, max_tokens=max_tokens).text
            out["steered"] += label_match(text, it.golds)
            out["agree"] += bool(picked) and label_match(text, [picked])
    # what the memory has nothing to say about: the gate should leave it to the frozen model
    out["offtopic"] = len(offtopic)
    out["offtopic_kept"] = 0
    for x in offtopic:
        state = m.pipeline.query_state(m.prompt_tokens(x), m.key_tokens(x))  # the key from the key prompt; no text: gate and vote
        qp = m.plan(state)
        out["offtopic_kept"] += qp.gate is None or qp.gate.adapted
    return out


def preset_with(settings: list[str]):
    """The default preset with ``FIELD=VALUE`` settings (``bank.tau_k=0.7``, ``k_anchors=8``,
    ``key_pooling=mean,mean``): a probe's variant, typed as the field it replaces."""
    from miita_edge.method.presets import default_preset

    preset = default_preset()
    for kv in settings:
        name, _, value = kv.partition("=")
        obj = preset
        *path, last = name.split(".")
        try:
            for part in path:
                obj = getattr(obj, part)
            old = getattr(obj, last)
        except AttributeError:
            raise SystemExit(f"--set {kv}: the default preset has no field {name}") from None
        if isinstance(old, tuple):  # comma-separated, each item typed as the field's first
            item = type(old[0]) if old else str
            setattr(obj, last, tuple(item(v) for v in value.split(",")))
        else:
            setattr(obj, last, type(old)(value))
    return preset


def one_budget(engine, cache, spec, stages, items, spec_text: str, limit: int | None, args) -> dict:
    """A fresh memory learns every stage under ``limit`` bytes (None: unlimited); its account and
    its dev answers."""
    from miita_edge import Miita
    from miita_edge.errors import BudgetError

    answers = [ex.output.strip() for s in stages for ex in s.train]
    with tempfile.TemporaryDirectory() as tmp:
        m = Miita(memory=Path(tmp) / "mem", preset=preset_with(args.set), template=spec.template, engine=engine,
                  extract_cache=cache, max_prompt_tokens=spec.max_prompt_tokens)
        try:
            t0 = time.perf_counter()
            for s in stages:
                m.ingest(s.train, budget="none" if limit is None else str(limit), progress=False)
            learn_s = time.perf_counter() - t0
            r = account_memory(m, answers)
            t0 = time.perf_counter()
            r["dev"] = ask_dev(m, items, r["labels"], spec.max_tokens, args.steered, OFFTOPIC)
            r["ask_s"] = time.perf_counter() - t0
        except BudgetError as exc:
            return {"budget": spec_text, "limit": limit, "error": str(exc)}
        finally:
            m.close()
    r.update(budget=spec_text, limit=limit, learn_s=learn_s)
    return r


def allowed(r: dict) -> str:
    return "unlimited" if r["limit"] is None else f"{r['limit']:,}"


def print_rows(rows: list[dict], steered: bool) -> None:
    """The table: bytes, bytes per distinct answer by part, coverage, key width, accuracies."""
    def pct(a, n):
        return f"{100.0 * a / n:.1f}" if n else "-"

    print("\n| budget | used / allowed B | per answer: keys (centroid) | answers | vectors | framing (head+manifest, "
          "records) | answers kept / stream | protos / kept (max) | anchors / kept (max) | key bits | gold held % | "
          "vote % | gate declined | vote without gate % | steered % | off-topic steerable |")
    print("|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|")
    for r in rows:
        if "error" in r:
            print(f"| {r['budget']} | - / {allowed(r)} | does not fit: {r['error'].split(' (line')[0]} "
                  f"| | | | | | | | | | | | | |")
            continue
        a, c, d = r["account"], r["coverage"], r["dev"]
        n = c.answers
        fr = a.framing
        head = fr["header"] + fr["manifest"] + fr["padding"]
        rec = a.parts["framing"] - head
        print(f"| {r['budget']} | {a.total:,} / {allowed(r)} | {a.parts['keys'] / n:.1f} ({a.centroid_keys / n:.1f}) "
              f"| {a.parts['answers'] / n:.1f} | {a.parts['vectors'] / n:.1f} | {a.parts['framing'] / n:.1f} "
              f"({head / n:.1f}, {rec / n:.1f}) | {c.kept} / {n} | {c.protos_mean:.2f} ({c.protos_max}) "
              f"| {c.anchors_mean:.2f} ({c.anchors_max}) | {r['key_bits']} of {r['full_bits']} "
              f"| {pct(d['held'], d['n'])} | {pct(d['vote'], d['n'])} | {d['declined']} / {d['n']} "
              f"| {pct(d['ungated'], d['n'])} | {pct(d['steered'], d['n']) if steered else 'not run'} "
              f"| {d['offtopic_kept']} / {d['offtopic']} |")


def print_detail(r: dict, steered: bool) -> None:
    """One budget's totals in bytes, as a line (the table divides them by the answers)."""
    if "error" in r:
        print(f"{r['budget']:>6} ({allowed(r)}): does not fit: {r['error']}", flush=True)
        return
    a, c, d = r["account"], r["coverage"], r["dev"]
    records = ", ".join(f"{k} {v}" for k, v in a.framing.items() if k not in ("header", "manifest", "padding"))
    line = (f"{r['budget']:>6} ({allowed(r)}): {a.total:,} B = keys {a.parts['keys']:,} (centroids "
            f"{a.centroid_keys:,}) + answers {a.parts['answers']:,} + vectors {a.parts['vectors']:,} + framing "
            f"{a.parts['framing']:,} (header {a.framing['header']}, manifest {a.framing['manifest']}, padding "
            f"{a.framing['padding']}, {records}); {r['prototypes']} prototypes, {r['anchors']} anchors, "
            f"{c.kept}/{c.answers} answers kept ({c.foreign} foreign), keys {r['key_bits']} bits; dev "
            f"{d['n']}: vote {d['vote']}, declined {d['declined']} ({d['reasons']}), vote without the gate {d['ungated']}; "
            f"off-topic prompts some answer may steer: {d['offtopic_kept']} of {d['offtopic']}")
    if steered:
        line += f", steered {d['steered']} (the vote's answer on {d['agree']} of the {d['n'] - d['declined']} it answered)"
    print(line + f"; learn {r['learn_s']:.0f} s, ask {r['ask_s']:.0f} s", flush=True)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", help="GGUF path (default: the embedded Gemma-3-270M)")
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--benchmark", default="banking77")
    ap.add_argument("--data", type=Path, default=None, help="the benchmark's data directory "
                    "(default: ../shared/data/<its data name>)")
    ap.add_argument("--stages", default=None, help="stages taught, e.g. 1-3 (default: all)")
    ap.add_argument("--budgets", default=BUDGETS, help="comma-separated (default " + BUDGETS.replace("%", "%%") + ")")
    ap.add_argument("--limit-train", type=int, default=None, help="training rows taught per stage (default: all)")
    ap.add_argument("--limit", type=int, default=None, help="dev rows asked per stage (default: all)")
    ap.add_argument("--steered", action="store_true", help="also generate each steered answer (slower)")
    ap.add_argument("--cache", type=Path, default=ROOT / "bench-results" / "extract-cache",
                    help="extraction cache directory, shared by the budgets and by reruns")
    ap.add_argument("--set", action="append", default=[], metavar="FIELD=VALUE",
                    help="a probe: a default-preset field set to VALUE (bank.tau_k=0.7); repeatable")
    ap.add_argument("--min-key-bits", type=int, default=None,
                    help="a probe: the narrowing floor (BankConfig.min_key_bits) set to N (as --set bank.min_key_bits=N)")
    ap.add_argument("--nearest-z", type=float, default=None,
                    help="a probe: the gate's null tail (method.relevance.NEAREST_Z) set to Z in this process")
    ap.add_argument("--unstored", default="", metavar="FIELD[,FIELD]",
                    help="a probe: these --set fields are left out of the stored manifest, so the variant's memory "
                         "has the default's bytes and key width (a candidate that becomes the default stores none)")
    args = ap.parse_args(argv)
    print_header(argv)
    sys.path.insert(0, str(ROOT / "python"))
    if args.unstored:  # Preset.to_json is what the manifest stores; the variant is still what answers
        from miita_edge.method import presets as presets_mod
        unstored, stored_json = [f for f in args.unstored.split(",") if f], presets_mod.Preset.to_json

        def to_json(self):
            return {k: v for k, v in stored_json(self).items() if k not in unstored}

        presets_mod.Preset.to_json = to_json
        print(f"# probe: {', '.join(unstored)} left out of the stored manifest", flush=True)
    if args.min_key_bits is not None:  # the preset's bank field (BankConfig.min_key_bits)
        from miita_edge.memory.bank import BankConfig
        from miita_edge.method.presets import default_preset
        try:  # the bank's own rule for a floor, checked before any model loads
            BankConfig(min_key_bits=args.min_key_bits).validate()
        except ValueError as exc:
            ap.error(f"--min-key-bits {args.min_key_bits}: {exc}")
        args.set = [*(args.set or []), f"bank.min_key_bits={args.min_key_bits}"]
        print(f"# probe: min_key_bits = {args.min_key_bits} (shipped: {default_preset().bank.min_key_bits})",
              flush=True)
    if args.nearest_z is not None:  # the pipeline imported the tail by name, so both modules' globals
        import miita_edge.method.pipeline as pipeline_mod
        import miita_edge.method.relevance as relevance_mod
        if not args.nearest_z > 0:
            ap.error(f"--nearest-z {args.nearest_z}: a positive number of standard deviations")
        shipped = relevance_mod.NEAREST_Z
        relevance_mod.NEAREST_Z = pipeline_mod.NEAREST_Z = args.nearest_z
        print(f"# probe: NEAREST_Z = {args.nearest_z} (shipped: {shipped})", flush=True)
    from miita_edge.evaluation.benchmarks import get_benchmark, load_benchmark
    from miita_edge.evaluation.extract_cache import ExtractCache
    from miita_edge.memory.budget import parse_budget
    from miita_edge.runtime.engine import Engine, EngineConfig
    from miita_edge.runtime.fingerprint import model_sha256
    from miita_edge.streams import stream_bytes

    spec = get_benchmark(args.benchmark)
    if not spec.classification:
        ap.error(f"--benchmark {args.benchmark}: the vote's accuracy is a label's; use a classification benchmark")
    data = args.data or DATA / spec.data_name
    _, stages = load_benchmark(spec, data, stages=args.stages, limit_test=args.limit, limit_train=args.limit_train,
                               split="dev")
    items = [it for s in stages for it in s.test]
    stream = stream_bytes(ex for s in stages for ex in s.train)
    budgets = [(b.strip(), parse_budget(b.strip())) for b in args.budgets.split(",") if b.strip()]
    print(f"# {spec.name}: {len(stages)} stages, {sum(len(s.train) for s in stages)} training rows "
          f"({stream:,} B of stream, {len({ex.output.strip() for s in stages for ex in s.train})} distinct answers), "
          f"{len(items)} dev rows", flush=True)
    rows = []
    with closing(Engine(args.model, EngineConfig(n_threads=args.threads, stop_after_text=True))) as engine:
        cache = ExtractCache(args.cache, model_sha256(engine.info.path))
        for text, b in budgets:
            r = one_budget(engine, cache, spec, stages, items, text, None if b.unlimited else b.resolve(stream), args)
            print_detail(r, args.steered)
            rows.append(r)
    print_rows(rows, args.steered)
    return 0


if __name__ == "__main__":
    sys.exit(main())
