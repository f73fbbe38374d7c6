"""``miita-edge``: ingest supervised examples into a budgeted direction memory, then ask.

Every user error is one line on stderr and exit code 2; the memory on disk is
only ever replaced by a complete new version.
"""
from __future__ import annotations

import argparse
import json
import os
import shlex
import sys
from pathlib import Path

from .demo.run import run_demo
from .errors import BudgetError, ContextOverflow, InputError, MiitaError, ModelError
from .evaluation import BENCHMARKS, METHODS, ledger, run_benchmark
from .evaluation.report import _json_default
from .evaluation.splits import add_protocol_arguments, protocol_kwargs, resolve_split
from .memory import store as store_mod
from .memory.budget import parse_budget
from .method import ann_index
from .method.extract import prompt_tokens
from .method.key_extractors import RAY_WORKERS, KeyOptions
from .method.presets import preset_names
from .method.templates import AUTO, CHAT, get_template
from .miita import Miita, default_memory_dir, memory_fields
from .runtime.engine import Engine, EngineConfig
from .runtime.model_check import check_model_isolated
from .serve.settings import TEACH_WAIT_ROWS
from .steering_check import steering_check
from .streams import read_examples

EPILOG = """environment:
  MIITA_EDGE_MODEL   GGUF used when --model is not given (default: the embedded Gemma-3-270M)
  MIITA_EDGE_MEMORY  memory directory used when --memory is not given"""


def _add_common(p: argparse.ArgumentParser, memory: bool = True, model: bool = True) -> None:
    if memory:
        p.add_argument("--memory", metavar="DIR", help="memory directory (default: $MIITA_EDGE_MEMORY or the "
                       "platform's user data directory, e.g. ~/.local/share/miita-edge/memory)")
    if model:
        p.add_argument("--model", metavar="GGUF", help="GGUF model file (default: $MIITA_EDGE_MODEL or the embedded "
                       "Gemma-3-270M Q4_K_M)")
        p.add_argument("--threads", type=int, default=0, help="CPU threads for llama.cpp (default: all cores)")
    p.add_argument("--json", action="store_true", help="print one JSON object instead of text")


def build_parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(
        prog="miita-edge",
        description="Memory-Induced Inference-Time Adaptation on llama.cpp: a small model learns from "
                    "supervised examples through a byte-budgeted memory applied to its final hidden state, "
                    "without changing its weights.",
        epilog=EPILOG, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = ap.add_subparsers(dest="command", metavar="COMMAND")

    _add_ingest(sub)
    _add_ask_and_forget(sub)
    _add_serve_info_demo(sub)
    _add_bench(sub)
    _add_check_model(sub)
    return ap


def _add_ingest(sub) -> None:
    p = sub.add_parser("ingest", help="learn supervised examples from a JSONL file",
                       description="Turn each {\"input\", \"output\"} row into a key and a correction and write it "
                                   "into the memory, repairing the memory to stay within its byte budget. The new "
                                   "memory version is committed atomically at the end (all or nothing).",
                       epilog=EPILOG, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("data", metavar="DATA.jsonl", help="one JSON object per line with string fields input and output "
                   "(extra fields such as task are allowed)")
    p.add_argument("--budget", help="memory budget: bytes with a unit (64KiB, 1.5MB, 4096), a percentage of the UTF-8 "
                   "bytes of all inputs and outputs ingested into this memory, this file included (1%%), or none "
                   "(default: 64KiB for a new memory, else the memory's own)")
    p.add_argument("--template", help="prompt template for a new memory: plain, banking77, dsc, qa, superni, chat "
                   "(the model's own chat template) or auto (chat where the model has one, else plain; the "
                   "default); an existing memory keeps its own")
    p.add_argument("--preset", choices=preset_names(), metavar="PRESET",
                   help="method preset for a new memory: default, or paper (the method exactly as published); "
                   "an existing memory keeps the preset and version it was built with")
    p.add_argument("--progress", action=argparse.BooleanOptionalAction, default=None,
                   help="progress bar (default: when stderr is a terminal)")
    p.add_argument("--ray", nargs="?", const=True, default=None, metavar="ADDRESS",
                   help="extract on a Ray cluster: the cluster at ADDRESS, or a local one when no address is "
                        "given, on --contexts workers, each loading the model once; the memory is the one a "
                        "local ingest makes (needs: pip install \"miita-edge[ray]\")")
    p.add_argument("--contexts", type=int, default=None, metavar="N",
                   help="extraction workers side by side. Without --ray: llama.cpp contexts extracting keys "
                        "(default preset), sharing the loaded model, each with its share of --threads and 32 "
                        "prompts per decode; keys within rounding of one-by-one extraction, so a stored input is "
                        "no longer an exact repeat of the same query (default: 1, one prompt per decode, "
                        f"bitwise; rates in docs/benchmarks.md). With --ray: Ray workers (default: {RAY_WORKERS})")
    p.add_argument("--fast-keys", action="store_true",
                   help="key-only presets: extract keys from a twin of the model cut after its key layers, its Q5_0 "
                        "weights re-encoded losslessly as Q8_0 (written once per model to the user cache, ~250 MB "
                        "for the bundled model), on --contexts contexts (at least 2); keys within rounding of "
                        "one-by-one extraction, as with --contexts (rates in docs/benchmarks.md)")
    _add_common(p)


def _add_ask_and_forget(sub) -> None:
    p = sub.add_parser("ask", help="answer a query with the memory applied",
                       description="Answer TEXT (or standard input). Where the memory holds answers relevant to "
                                   "the query, they are added to the model's final hidden state at each decoding "
                                   "step and discarded afterwards; elsewhere the frozen model answers. The answer "
                                   "ends at its first newline after some text (blank lines before it are skipped), "
                                   "or after --max-tokens.",
                       epilog=EPILOG, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("text", nargs="?", help="the query (default: read standard input)")
    p.add_argument("--no-adapt", action="store_true", help="answer with the frozen model alone")
    p.add_argument("--trace", action="store_true",
                   help="print, for each answer position, the token produced, the gate's alpha, and each "
                        "retrieved answer's weight and stored token, kept or dropped by the prefix rule "
                        "(where a taught reply drifts)")
    p.add_argument("--max-tokens", type=int, default=32, help="maximum new tokens (default: 32)")
    _add_common(p)

    p = sub.add_parser("forget", help="remove everything in a memory that teaches one answer",
                       description="Remove every prototype whose stored answer is OUTPUT (and the anchors it owns); "
                                   "committed atomically. Refused for the paper preset, whose prototypes keep no "
                                   "answer (docs/serving.md).")
    p.add_argument("--output", required=True, metavar="TEXT", help="the answer to forget, as it was ingested")
    _add_common(p)


def _add_serve_info_demo(sub) -> None:
    p = sub.add_parser("serve", help="serve memories over an OpenAI-compatible HTTP API (pip install \".[server]\")",
                       description="OpenAI-compatible server (chat/completions, models) whose memories can be taught "
                                   "and can forget while it serves; a page at /. docs/serving.md.")
    p.add_argument("--model", metavar="GGUF", help="GGUF model file (default: $MIITA_EDGE_MODEL or the embedded "
                   "Gemma-3-270M Q4_K_M)")
    p.add_argument("--memory", action="append", default=[], metavar="[NAME=]DIR", help="a memory to serve, as model "
                   "MODEL:NAME (NAME defaults to the directory's name); repeatable")
    p.add_argument("--memory-root", metavar="DIR", help="where POST /v1/memories creates memories (default: none)")
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--port", type=int, default=8080)
    p.add_argument("--api-key", metavar="KEY", help="require Authorization: Bearer KEY")
    p.add_argument("--threads", type=int, default=0, help="CPU threads for llama.cpp (default: all cores)")
    p.add_argument("--ctx", type=int, default=4096, help="context size in tokens (default: 4096)")
    p.add_argument("--max-body", default="1MiB", help="largest request body (default: 1MiB)")
    p.add_argument("--allow-origin", action="append", default=[], metavar="ORIGIN", help="a web page origin "
                   "(e.g. http://localhost:3000) that may call the API besides the server's own; repeatable "
                   "(default: none, every other Origin is refused)")
    p.add_argument("--allow-host", action="append", default=[], metavar="NAME", help="a Host header name to "
                   "answer besides 127.0.0.1, localhost, [::1] and --host; repeatable (default: none)")
    p.add_argument("--max-memories", type=int, default=64, metavar="N", help="most memories POST /v1/memories "
                   "keeps under --memory-root, counted on disk (default: 64)")
    p.add_argument("--allow-unlimited-budget", action="store_true", help="let clients set a memory's budget to "
                   "'none' (create, teach); off: 403")
    p.add_argument("--max-teach-rows", type=int, default=10000, metavar="N", help="most examples one teach request "
                   f"may carry (413 beyond; default: 10000); a teach of at most {TEACH_WAIT_ROWS} answers its "
                   "report, a larger one 202 and a job to poll")

    p = sub.add_parser("info", help="show a memory: counts, bytes against the budget, model, hyper-parameters",
                       description="Show a memory without loading the model.")
    _add_common(p, model=False)

    p = sub.add_parser("demo", help="learn the bundled demo stream, then compare answers with and without memory",
                       description="Ingest the small supervised stream shipped in the package (4 tasks with "
                                   "arbitrary labels the frozen model cannot guess) into a fresh memory, then "
                                   "answer its held-out queries with and without adaptation.")
    p.add_argument("--budget", default="16KiB", help="memory budget (default: 16KiB)")
    p.add_argument("--memory", metavar="DIR", help="where to keep the demo memory (default: a temporary directory)")
    p.add_argument("--preset", choices=preset_names(), metavar="PRESET", default="default",
                   help="default or paper")
    p.add_argument("--model", metavar="GGUF", help="GGUF model file (default: the embedded Gemma-3-270M)")
    p.add_argument("--threads", type=int, default=0, help="CPU threads for llama.cpp (default: all cores)")
    p.add_argument("--json", action="store_true", help="print one JSON object instead of text")


def _add_check_model(sub) -> None:
    p = sub.add_parser("check-model", help="can miita-edge steer this GGUF? facts, a self-test, a verdict",
                       description="Print the model's architecture, sizes, key layer, LM-head tensor and type, and "
                                   "whether its llama.cpp graph names the tensors the callback needs (l_out-<k>, "
                                   "result_norm); then test on the real file that the native head rows equal gguf-py's "
                                   "dequantisation, that the captured key equals a reference decode, and that the "
                                   "logits move by exactly c·W·δ under a known addition. Then (unless --quick) a functional test: "
                                   "a fresh memory is taught 48 synthetic examples (24 two-word answers, each in two "
                                   "phrasings); each taught input asked verbatim must return its answer, and 32 "
                                   "unrelated questions must get the frozen model's answer. Ends with 'supported' "
                                   "(exit 0: both rates >= 95% with the default preset), 'limited: REASON' (exit 3) "
                                   "or 'refused: REASON' (exit 2).",
                       epilog=EPILOG, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("model_path", nargs="?", metavar="GGUF", help="the GGUF to check (default: --model, "
                   "$MIITA_EDGE_MODEL or the embedded Gemma-3-270M)")
    p.add_argument("--quick", action="store_true",
                   help="skip the functional test (teach and ask a synthetic memory; ~1 min on 2 cores): the "
                        "header, graph and self-test only, a few seconds; the verdict then says whether the "
                        "mechanics hold, not whether taught answers come back")
    _add_common(p, memory=False)


def _bench_epilog() -> str:
    lines = ["benchmarks (data directory under shared/data; metric; max new tokens; prompt cut):"]
    for b in BENCHMARKS.values():
        cut = "none" if b.max_prompt_tokens is None else f"{b.max_prompt_tokens} tokens"
        lines.append(f"  {b.name:10s} {b.data_name}/; {b.metric}; {b.max_tokens}; {cut}")
    lines.append("methods:")
    for m in METHODS.values():
        lines.append(f"  {m.name:24s} {m.description}")
    lines.append(f"  {'miita-default@N':24s} the default preset as it was at version N (also miita-paper@N), to run "
                 "an archived cell again")
    lines += ["outputs (under --out): result.json, result.md, heatmap.png; cells/ (one JSON per finished cell),",
              "state/ (the memory after each stage), baseline/ (frozen per-stage scores). Rerunning the same",
              "command resumes: finished cells are loaded, learning restarts from the last saved stage.",
              "docs/evaluation.md describes the protocol."]
    return "\n".join(lines) + "\n\n" + EPILOG


def _add_bench(sub) -> None:
    p = sub.add_parser("bench", help="continual-learning benchmark: learn stages in order, score every stage after each",
                       description="Learn the stages of a benchmark in the order of its meta.json; after each stage "
                                   "score every stage's evaluated rows, filling A[t, tau]; report OP, BWT, FWT "
                                   "(against the frozen model), per-stage scores, wall time and memory bytes against "
                                   "the budget. It scores dev rows unless --split test, which needs --purpose and "
                                   "--why and appends what it read to the ledger (docs/evaluation.md, \"The ledger "
                                   "of reads\").",
                       epilog=_bench_epilog(), formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--benchmark", required=True, metavar="NAME", help=f"{', '.join(BENCHMARKS)} (listed below)")
    p.add_argument("--data", required=True, metavar="DIR", help="the benchmark's directory (meta.json, train.jsonl, "
                   "test.jsonl), e.g. ../shared/data/banking77")
    p.add_argument("--method", required=True, metavar="M", help="method name (listed below)")
    p.add_argument("--budget", default="1%", help="memory budget for every storing method: bytes with a unit (64KiB, "
                   "1.5MB, 4096), a percentage of the UTF-8 bytes of all inputs and outputs this run learns (after "
                   "--stages and the limits), resolved once to bytes before stage 1, or none (default: 1%%)")
    p.add_argument("--stages", metavar="LIST", help="stages to run, 1-based in meta.json order: 1,2 or 2-4 or stage "
                   "names (default: all); always learned in meta.json order")
    p.add_argument("--limit-per-stage", type=int, metavar="N", help="at most N evaluated rows per stage (the first N), "
                   "and N training rows unless --limit-train-per-stage is given (default: all)")
    p.add_argument("--limit-train-per-stage", type=int, metavar="N", help="at most N training rows per stage (the "
                   "first N; 0 = all; default: --limit-per-stage, else all)")
    p.add_argument("--out", metavar="DIR", help="output directory (default: bench-results/BENCHMARK/METHOD-BUDGET); "
                   "a rerun with the same options resumes there")
    p.add_argument("--baseline-cache", metavar="DIR", help="where the frozen model's per-stage scores (FWT baseline) "
                   "are cached; share one DIR between methods to compute them once (default: OUT/baseline)")
    p.add_argument("--no-baseline", action="store_true", help="skip the frozen baseline (no FWT)")
    p.add_argument("--extract-cache", metavar="DIR", help="cache the frozen model's decode pass per training "
                   "example in DIR and reuse it across budgets and methods (results are unchanged; default: none)")
    p.add_argument("--cells", choices=["all", "summary", "final"], default="all", help="all: fill the whole matrix "
                   "A (default); summary: only the cells OP, BWT and FWT read (final row, diagonal, first "
                   "super-diagonal: 3T-2 of T*T), the others left empty; final: the final row alone (OP); for "
                   "sweeps and ablations on small machines")
    p.add_argument("--progress", action=argparse.BooleanOptionalAction, default=None,
                   help="progress on stderr (default: when stderr is a terminal)")
    p.add_argument("--model", metavar="GGUF", help="GGUF model file (default: $MIITA_EDGE_MODEL or the embedded "
                   "Gemma-3-270M Q4_K_M)")
    p.add_argument("--threads", type=int, default=0, help="CPU threads for llama.cpp (default: all cores)")
    p.add_argument("--json", action="store_true", help="print the result as one JSON object instead of a summary")
    add_protocol_arguments(p)
    ledger.add_ledger_arguments(p)




def _engine_config(args):
    # A stop string ends an answer only after its first non-blank character: a model that opens its
    # reply with a blank line would otherwise answer "" (EngineConfig.stop_after_text). check-model
    # asks through this engine too, so it judges the answers users get from ask.
    return EngineConfig(n_threads=getattr(args, "threads", 0) or 0, stop_after_text=True)


def _model_error_line(m, examples, exc) -> str:
    """``N:`` for the first row whose prompt (plus answer, when the preset decodes it) cannot fit
    the model's context -- what "sequence of N tokens exceeds the context" during ingest means --
    else "" (the error is not about one row). Runs only after a failure, so a file that ingests
    fine is not tokenised twice."""
    if not isinstance(exc, ContextOverflow):
        return ""

    n_ctx = m.engine.config.n_ctx
    decodes_answer = m.preset.bank.payload != "tokens"
    for ex in examples:
        n = len(prompt_tokens(m.engine, m.template, ex.input, m.max_prompt_tokens))
        if decodes_answer:
            n += len(m.engine.tokenize(m.template.render_target(ex.output), add_bos=False))
        if n > n_ctx:
            field = "input" if not decodes_answer else "input + output"
            return f"{ex.line}: {field} too long for the model:"
    return ""


def cmd_ingest(args) -> int:
    keys = KeyOptions.side_by_side(args.contexts, fast=args.fast_keys, ray=args.ray)
    examples = read_examples(args.data)  # validates the whole file first
    budget = None if args.budget is None else parse_budget(args.budget)
    if args.template is not None and args.template.strip().lower() not in (AUTO, CHAT):
        get_template(args.template)
    with Miita(args.model, args.memory, preset=args.preset, template=args.template,
               engine_config=_engine_config(args), keys=keys) as m:
        keys.check_preset(m.preset)
        if keys.fast:
            m.fast_key_engine()  # the twin written or found before the stream: its errors are not a row's
        try:
            rep = m.ingest(examples, budget=budget, progress=args.progress)
        except BudgetError as exc:  # it names the line; name the file too
            raise BudgetError(f"{args.data}: {exc}") from None
        except ModelError as exc:  # e.g. a row longer than the context: name the file and the row
            raise ModelError(f"{args.data}:{_model_error_line(m, examples, exc)} {exc}") from None
        out = rep.to_json()
        out.update(memory=str(m.memory_dir), version=m.version)
    if args.json:
        print(json.dumps(out))
    else:
        budget = "unlimited" if out["budget_bytes"] is None else f"{out['budget_bytes']} bytes"
        print(f"ingested {out['examples']} examples ({out['skipped']} skipped) into {out['memory']}: "
              f"{out['prototypes']} prototypes, {out['anchors']} anchors, {out['bytes']} bytes of {budget}")
    return 0


def cmd_ask(args) -> int:
    text = args.text
    if text is None:
        if sys.stdin is None or sys.stdin.isatty():
            raise InputError("no query: pass TEXT or pipe it on standard input")
        text = sys.stdin.read().strip()
    if not text:
        raise InputError("empty query")
    if args.max_tokens < 1:
        raise InputError("--max-tokens must be >= 1")
    with Miita(args.model, args.memory, engine_config=_engine_config(args)) as m:
        if not args.no_adapt and not m.store.exists():
            raise InputError(f"no memory at {m.memory_dir}: run 'miita-edge ingest' first, or pass --no-adapt")
        if args.trace:
            ans, steps = m.trace(text, max_tokens=args.max_tokens)
            print(format_trace(m.engine, ans, steps))
            return 0
        ans = m.ask(text, max_tokens=args.max_tokens, adapt=not args.no_adapt)
    if args.json:
        print(json.dumps(ans.to_json()))
    else:
        print(ans.text.strip())
    return 0


def format_trace(engine, ans, steps) -> str:
    """The ``ask --trace`` table: one line per answer position."""
    def tok(t):
        return "-" if t is None else repr(engine.token_bytes(t).decode("utf-8", "replace"))

    lines = [f"answer {ans.text!r} (adapted: {ans.adapted}{'; ' + ans.reason if ans.reason else ''})"]
    for s in steps:
        kept = ", ".join(f"#{j} w={w:.2f} {tok(t)}" for j, w, t in s.kept) or "none"
        lines.append(f"step {s.step:3d} produced {tok(s.produced):14s} alpha "
                     f"{'-' if s.alpha is None else f'{s.alpha:.2f}'} {'steered' if s.steered else 'free   '}"
                     f" kept: {kept}; dropped {len(s.dropped)}"
                     f"{'; push raised (hold)' if s.step in ans.raised else ''}")
    return "\n".join(lines)


def _graph_rows(preset, meta) -> int:
    """The rows an ANN graph of this memory would index (what ``ann_index.min_rows`` counts): the
    default preset's vote reads the anchors and then each answer's centroid; the paper preset's two
    channels read the anchors and the directions (one per prototype), the larger decides."""
    anchors, protos = int(meta["anchors"]), int(meta["prototypes"])
    if preset.aggregation == "paper":
        return max(anchors, protos)
    return anchors + protos if preset.centroid_vote and preset.bank.key_precision == "bit" else anchors


def cmd_info(args) -> int:
    path = Path(args.memory).expanduser() if args.memory else default_memory_dir()
    st = store_mod.Store(path)
    if not st.exists():
        raise InputError(f"no memory at {path}")
    snap = st.read()
    meta, preset = memory_fields(path, snap)
    b = parse_budget(meta["budget"])
    budget_bytes = None if b.unlimited else b.resolve(int(meta["stream_bytes"]))
    out = {"memory": str(path), "version": snap.version, "bytes": snap.bytes_on_disk, "budget": meta["budget"],
           "budget_bytes": budget_bytes, **{k: meta[k] for k in ("examples", "skipped", "prototypes", "anchors",
                                                                  "stream_bytes", "template", "fingerprint")},
           "preset": preset.name, "hyperparameters": preset.describe(),
           "arrays": {k: list(v.shape) + [str(v.dtype)] for k, v in snap.arrays.items()},
           "recall": ann_index.status(_graph_rows(preset, meta), "f16" if preset.aggregation == "paper" else "bits"),
           "store_format": snap.format_version,
           "keys_whitened": preset.key_whitening == "paraphrase" or bool(meta.get("key_whitened", False))}
    if args.json:
        print(json.dumps(out))
    else:
        fp = out["fingerprint"]
        print(f"memory      {out['memory']} (version {out['version']})")
        print(f"preset      {out['preset']} (version {out['hyperparameters']['version']})   template {out['template']}")
        layers = fp.get('key_layers') or [fp['key_layer']]
        pooling = preset.key_pooling or ("mean",) * len(layers)
        pooled = "/".join(pooling) if len(pooling) == len(layers) else "mean"
        white = ", whitened against paraphrase noise" if out["keys_whitened"] else ""
        print(f"model       {fp['arch']} n_embd={fp['n_embd']} key layers {layers} ({pooled}{white}) "
              f"sha256 {fp['sha256'][:16]}…")
        print(f"content     {out['examples']} examples ({out['skipped']} skipped) -> {out['prototypes']} prototypes, "
              f"{out['anchors']} anchors")
        lim = "unlimited" if budget_bytes is None else f"{budget_bytes} bytes ({out['budget']})"
        print(f"bytes       {out['bytes']} of {lim}")
        if snap.format_version != store_mod.FORMAT_VERSION:
            print(f"format      {snap.format_version} (the next ingest or forget rewrites it as format "
                  f"{store_mod.FORMAT_VERSION})")
        hp = out["hyperparameters"]
        print(f"payload     {hp['bank']['payload']}, directions {hp['bank']['dir_precision']}, keys "
              f"{hp['bank']['key_precision']}; tau_d={hp['bank']['tau_d']} tau_k={hp['bank']['tau_k']}; anchors fold "
              f"{'by Ward distortion' if hp['bank'].get('anchor_fold') == 'ward' else 'closest pair first'}")
        print(f"adaptation  {adaptation_text(hp)}")
        print(f"recall      {out['recall']}")
    return 0


def adaptation_text(hp: dict) -> str:
    """How a memory steers, from its preset's fields (``Preset.describe``), for ``info``: what eta
    multiplies (``Miita.ask_tokens``: the model's measured logit push, or the query's hidden-state
    norm), the per-step gate (alpha = 1, or the paper's max(0, cos(h_t, h_q))), the relevance gate."""
    unit = "the model's measured logit push" if hp.get("eta_unit") == "push" else "||h_q||"
    gates = {"ungated": "ungated (alpha = 1)", "gated": "gated (alpha = max(0, cos(h_t, h_q)))"}
    gate = gates.get(hp["gate"], hp["gate"])
    relevance = "; steers only queries near what it was taught" if hp.get("relevance_gate") else ""
    return f"{hp['aggregation']} aggregation, eta={hp['eta']} x {unit}, {gate}{relevance}"


def cmd_forget(args) -> int:
    if not args.output.strip():
        raise InputError("--output must be a non-empty answer")
    with Miita(args.model, args.memory, engine_config=_engine_config(args)) as m:
        if not m.store.exists():
            raise InputError(f"no memory at {m.memory_dir}")
        out = m.forget(args.output)
    if args.json:
        print(json.dumps(out))
    else:
        print(f"forgot {out['removed_prototypes']} prototypes ({out['removed_anchors']} anchors, "
              f"{out['removed_examples']} examples) teaching {args.output!r}; memory version {out['version']}")
    return 0


def cmd_serve(args) -> int:
    try:  # the server stack is an optional extra: imported only when serving
        import fastapi  # noqa: F401
        import sse_starlette  # noqa: F401
        import uvicorn  # noqa: F401
    except ImportError as exc:
        raise InputError(f"serve needs the server extra ({exc.name} is missing): pip install \"miita-edge[server]\"")
    from .serve.app import create_app  # needs the server extra (checked above)
    from .serve.run import run_server
    from .serve.settings import Settings, check_origin_arg, parse_memory_arg

    if args.threads < 0 or not 0 < args.port < 65536 or args.ctx < 64 or args.max_memories < 0:
        raise InputError("--threads must be >= 0, --port in 1..65535, --ctx >= 64, --max-memories >= 0")
    if args.max_teach_rows < 1:
        raise InputError("--max-teach-rows must be >= 1")
    mems = {}
    for spec in args.memory:
        name, path = parse_memory_arg(spec)
        if name in mems:
            raise InputError(f"--memory: two memories named {name!r}; use NAME=DIR")
        mems[name] = path
    limit = parse_budget(args.max_body)
    if limit.unlimited:
        raise InputError("--max-body must be a size")
    st = Settings(model=args.model, memories=mems, host=args.host, port=args.port, api_key=args.api_key,
                  threads=args.threads, n_ctx=args.ctx, max_body_bytes=limit.resolve(0),
                  memory_root=Path(args.memory_root).expanduser() if args.memory_root else None,
                  allow_origins=tuple(check_origin_arg(o) for o in args.allow_origin),
                  allow_hosts=tuple(args.allow_host), max_memories=args.max_memories,
                  max_teach_rows=args.max_teach_rows,
                  allow_unlimited_budget=args.allow_unlimited_budget)
    from .serve.memories import Registry
    from .serve.openmp import reexec_passive

    # the arguments are good: run again with OMP_WAIT_POLICY=PASSIVE unless set (main(argv): its argv)
    reexec_passive(["-m", "miita_edge.cli", *(sys.argv[1:] if args.argv is None else args.argv)])
    registry = Registry(st)  # load the model here: a bad model is a one-line error, not a startup traceback
    run_server(create_app(st, registry), registry, args.host, args.port)
    return 0


def cmd_demo(args) -> int:

    res = run_demo(model=args.model, memory=args.memory, budget=args.budget, preset=args.preset,
                   threads=args.threads, quiet=args.json)
    if args.json:
        print(json.dumps(res))
    return 0


def cmd_bench(args) -> int:
    args.split = resolve_split(args)
    ledger.check_purpose(args.split, args.purpose, args.why)  # before anything is read or loaded
    ledger_path = ledger.ledger_for(args.split, args.ledger)
    out = args.out
    if out is None:
        tag = "".join(ch if ch.isalnum() or ch in "._-" else "_" for ch in args.budget.replace("%", "pct"))
        out = os.path.join("bench-results", args.benchmark, f"{args.method}-{tag}")
    for flag in ("limit_per_stage", "limit_train_per_stage"):
        v = getattr(args, flag)
        if v is not None and v < (0 if flag == "limit_train_per_stage" else 1):
            raise InputError(f"--{flag.replace('_', '-')} must be >= 1, got {v}")
    if args.threads < 0:
        raise InputError(f"--threads must be >= 0, got {args.threads}")
    progress = sys.stderr.isatty() if args.progress is None else args.progress
    res = run_benchmark(args.benchmark, args.data, args.method, out, budget=args.budget, stages=args.stages,
                        limit_per_stage=args.limit_per_stage, limit_train_per_stage=args.limit_train_per_stage,
                        progress=progress,
                        baseline=None if args.no_baseline else "frozen", baseline_dir=args.baseline_cache,
                        model=args.model, threads=args.threads, cells=args.cells,
                        extract_cache_dir=args.extract_cache, **protocol_kwargs(args),
                        command="miita-edge " + shlex.join(sys.argv[1:] if args.argv is None else args.argv))
    note, warnings = ledger.record_read(res, args.purpose, args.why, ledger_path) if ledger_path else ("", [])
    for w in warnings:
        print(f"miita-edge: warning: {one_line(w)}", file=sys.stderr)
    if args.json:
        print(json.dumps(res, default=_json_default, allow_nan=False))
        if note:
            print(note, file=sys.stderr)
        return 0
    A = res["matrix"].A
    names = res["stage_names"]
    print(f"{res['benchmark']} / {res['method']}: {len(names)} stages, metric {res['metric']} (0..100)")
    for t, row in enumerate(A):
        print(f"  after {t + 1} {names[t][:28]:28s} " + " ".join(f"{v:6.2f}" for v in row))
    if res["baseline"] is not None:
        print(f"  frozen baseline {'':22s}" + " ".join(f"{v:6.2f}" for v in res["baseline"]))
    fmt = (lambda v: "n/a" if v is None else f"{v:.2f}")
    print(f"OP {fmt(res['op'])}  BWT {fmt(res['bwt'])}  FWT {fmt(res['fwt'])}")
    if "oracle_alignment" in res:
        print(f"Oracle Alignment {res['oracle_alignment']['final']:.4f}")
    budget = "unlimited" if res["budget_bytes"] is None else f"{res['budget_bytes']} bytes"
    stored = f"{res['memory_bytes']} bytes" if res["stores_memory"] else "nothing stored"
    from .evaluation.run_setup import budget_stream

    base = res.get("budget_base_bytes") or res["stream_bytes"]
    of = budget_stream(base, res["stream_bytes"])
    of += "" if base == res["stream_bytes"] else f"; {res['stream_bytes']} B learned"
    print(f"memory {stored} of {budget} (--budget {res['budget_spec']} of a {base}-byte {of})")
    print(f"time {res['wall_time_s']:.1f} s (learn {res['seconds']['learn']:.1f}, eval {res['seconds']['eval']:.1f}; "
          f"baseline {res['seconds']['baseline']:.1f}; this session {res['seconds']['this_session']:.1f})")
    print(f"wrote {res['files']['json']}, {res['files']['markdown']}, {res['files']['heatmap']}")
    if note:
        print(note)
    return 0


def cmd_check_model(args) -> int:
    if args.threads < 0:
        raise InputError(f"--threads must be >= 0, got {args.threads}")
    # in a child process: llama.cpp aborts on some malformed models, and the verdict must still print
    path = args.model_path or args.model
    rep = check_model_isolated(path, threads=args.threads)
    checks = []
    if rep.supported and not args.quick:
        with Engine(path, _engine_config(args)) as eng:
            checks = [steering_check(preset=p, engine=eng) for p in ("default", "paper")]
    verdict, code = ("supported", 0) if rep.supported else (f"refused: {rep.reason}", 2)
    if checks and checks[0].verdict != "supported":
        verdict, code = f"{checks[0].verdict}: {checks[0].reason()}", 2 if checks[0].verdict == "refused" else 3
    if args.json:
        js = rep.to_json()
        js["steering"] = [c.to_json() for c in checks]
        js["verdict"] = verdict.partition(":")[0]
        js["supported"] = code == 0
        print(json.dumps(js))
        return code
    lines = rep.lines()[:-1]
    for c in checks:
        lines.append(f"steering     {c.preset:8s} taught answers back {100 * c.recall:5.1f}% of {c.n_taught}, "
                     f"unrelated untouched {100 * c.untouched:5.1f}% of {c.n_unrelated}: {c.verdict}")
        for q, want, got in c.failures[:2]:
            lines.append(f"               e.g. {q!r}: expected {want!r}, got {got!r}")
    print("\n".join(lines + [verdict]))
    return code


def one_line(text: str) -> str:
    """``text`` with control characters escaped (``\\n``, ``\\x1b``...), so an error that quotes a
    file name or a value stays one line on the terminal and cannot inject escape sequences."""
    return "".join(ch if ch.isprintable() or ch == " " else ascii(ch)[1:-1] for ch in text)


def main(argv=None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    args.argv = None if argv is None else list(argv)
    if not args.command:
        parser.print_help()
        return 2
    try:
        return {"ingest": cmd_ingest, "ask": cmd_ask, "info": cmd_info, "demo": cmd_demo,
                "bench": cmd_bench, "check-model": cmd_check_model, "forget": cmd_forget,
                "serve": cmd_serve}[args.command](args)
    except MiitaError as exc:
        print(f"miita-edge: error: {one_line(str(exc))}", file=sys.stderr)
        return exc.exit_code
    except KeyboardInterrupt:
        print("miita-edge: interrupted; the memory keeps its last committed version"
              + ("; rerun the same bench command to resume" if args.command == "bench" else ""), file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())
