"""``miita-edge check-model``: inspect a GGUF, load it, run the self-test (``support.self_test``), and
end with "supported" or a one-line reason. ``check_model`` never raises: every failure, a bad path
included, becomes the report's reason. The refusal rules and the self-test live in ``support`` (which
``engine`` imports); this module sits above the engine.
"""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time

from ..errors import MiitaError
from .default_model import resolve_model_path
from .engine import DEFAULT_KEY_DEPTHS, Engine, EngineConfig, layers_at_depths
from .gguf_model import inspect_gguf
from .support import (CheckItem, CheckReport, dequantize_rows, missing_tensor_reason, refusal_after_load,
                      refusal_reason, round_activations, self_test, type_name)

__all__ = ["CheckItem", "CheckReport", "check_model", "check_model_isolated", "format_report", "self_test", "refusal_reason",
           "refusal_after_load", "missing_tensor_reason", "dequantize_rows", "round_activations", "type_name"]


def check_model(path=None, threads: int = 0, key_layer: int | None = None, run_self_test: bool = True,
                seed: int = 0) -> CheckReport:
    """Inspect a GGUF, load it, run the self-test; never raises (the reason says what failed)."""
    t0 = time.perf_counter()
    rep = CheckReport(path=str(path) if path else "(default model)")
    try:
        p = resolve_model_path(path)
        rep.path = str(p)
        info = inspect_gguf(p)
        rep.arch, rep.n_embd, rep.n_layer, rep.n_vocab = info.arch, info.n_embd, info.n_layer, info.n_vocab
        rep.head_tensor, rep.head_type = info.lm_head.name, type_name(info.lm_head.ggml_type)
        rep.logit_mult = info.logit_mult
        k = key_layer if key_layer is not None else info.n_layer // 2
        rep.key_layer = k
        reason = refusal_reason(info)
        if reason:
            rep.reason = reason
            return rep

        eng = Engine(p, EngineConfig(n_ctx=512, n_batch=512, n_threads=threads, key_layer=key_layer))
        try:
            rep.key_layer = eng.key_layer
            rep.has_key_tensor, rep.has_result_norm = eng.graph_tensors[0], eng.graph_tensors[1]
            rep.key_layers = layers_at_depths(DEFAULT_KEY_DEPTHS, info.n_layer)
            missing = eng.missing_key_tensors(rep.key_layers)
            if missing:
                rep.has_key_tensor = False
                rep.reason = missing_tensor_reason(missing[0])
                return rep
            if run_self_test:
                rep.items = self_test(eng, seed=seed)
                bad = [i for i in rep.items if not i.ok]
                if bad:
                    rep.reason = f"self-test failed: {bad[0].name}: {bad[0].detail}"
        finally:
            eng.close()
    except MiitaError as exc:
        msg = str(exc)
        rep.reason = msg.split(": ", 1)[1] if msg.startswith("unsupported model ") and ": " in msg else msg
        if "l_out" in msg and "no tensor named" in msg:
            rep.has_key_tensor = False
        if "'result_norm'" in msg:
            rep.has_result_norm = False
    except KeyboardInterrupt:
        raise
    except Exception as exc:  # never a traceback: the one line names what broke
        rep.reason = f"internal error during the check: {type(exc).__name__}: {exc}".splitlines()[0]
    finally:
        rep.seconds = time.perf_counter() - t0
    return rep


def format_report(rep: CheckReport) -> str:
    return "\n".join(rep.lines())


def _report_from_json(js: dict) -> CheckReport:
    rep = CheckReport(path=js["path"])
    for k in ("arch", "n_embd", "n_layer", "n_vocab", "key_layer", "key_layers", "head_tensor", "head_type", "logit_mult",
              "has_key_tensor", "has_result_norm", "reason", "seconds"):
        setattr(rep, k, js.get(k, getattr(rep, k)))
    rep.items = [CheckItem(i["name"], bool(i["ok"]), i["detail"]) for i in js.get("self_test", [])]
    return rep


def _child_pythonpath() -> str:
    """The child imports this very package: the directory it was loaded from comes first. The parent's
    ``sys.path`` follows (for the package's own dependencies), but it may also hold a source tree
    without the compiled extension (a script that put a checkout's ``python/`` on it), which must not
    win over the installed package."""
    here = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    rest = [p for p in sys.path if p and os.path.abspath(p) != here]
    return os.pathsep.join([here] + rest)


def check_model_isolated(path=None, threads: int = 0, key_layer: int | None = None, run_self_test: bool = True,
                         seed: int = 0, timeout: float = 1800.0) -> CheckReport:
    """``check_model`` in a child process: llama.cpp aborts the process on some malformed models
    (a GGML_ASSERT while loading or building the graph), which no exception handler can catch. The
    child's report comes back as JSON; a child that dies becomes a one-line reason."""
    args = {"path": None if path is None else str(path), "threads": threads, "key_layer": key_layer,
            "run_self_test": run_self_test, "seed": seed}
    env = dict(os.environ)
    env["PYTHONPATH"] = _child_pythonpath()
    code = "from miita_edge.runtime.model_check import _child_main; _child_main()"
    t0 = time.perf_counter()
    try:
        proc = subprocess.run([sys.executable, "-c", code, json.dumps(args)], capture_output=True, text=True,
                              timeout=timeout, env=env)
    except subprocess.TimeoutExpired:
        return CheckReport(path=str(path), reason=f"the check did not finish within {timeout:g} s",
                           seconds=time.perf_counter() - t0)
    if proc.stderr and proc.returncode >= 0:
        sys.stderr.write(proc.stderr)  # llama.cpp's own error lines (e.g. a tensor it did not find)
    lines = [ln for ln in proc.stdout.splitlines() if ln.startswith("{")]
    if proc.returncode == 0 and lines:
        try:
            return _report_from_json(json.loads(lines[-1]))
        except (ValueError, KeyError, TypeError):
            pass
    if proc.returncode < 0:
        try:
            sig = signal.Signals(-proc.returncode).name
        except ValueError:
            sig = f"signal {-proc.returncode}"
        why = f"llama.cpp crashed while loading or running this model ({sig})"
    else:
        why = f"the check process failed (exit {proc.returncode})"
    last = [ln for ln in proc.stderr.splitlines() if ln.strip()]
    if last:
        why += f": {last[-1].strip()[:200]}"
    return CheckReport(path=str(path) if path else "(default model)", reason=why, seconds=time.perf_counter() - t0)


def _child_main() -> None:
    args = json.loads(sys.argv[1])
    if os.environ.get("MIITA_CHECK_MODEL_TEST_ABORT"):  # tests: a child that dies as llama.cpp's asserts do
        os.abort()
    rep = check_model(**args)
    print(json.dumps(rep.to_json()), flush=True)
