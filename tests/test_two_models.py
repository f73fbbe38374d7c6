"""The method on two real models: the bundled Gemma-3-270M and SmolLM2-135M-Instruct (a head whose
rows are far from isotropic, a GPT-2-style BPE vocabulary and a chat template). What a user sees: the
demo stream learned, taught inputs coming back verbatim, and questions the memory has nothing to say
about answered exactly as the frozen model answers them, with a memory of a benchmark's first stage.

Each check runs in a child process: the suite imports usearch (the optional ANN index), whose
bundled C++ runtime makes llama.cpp fail to load BPE vocabularies in the same process
(docs/models.md), and a user's process holds one model anyway.
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from second_model import smollm2_path

pytestmark = pytest.mark.model

SHARED_DATA = Path(__file__).resolve().parents[2] / "shared" / "data"
OFFTOPIC_FILE = Path(__file__).parent / "data" / "offtopic.txt"
OFFTOPIC = [ln.strip() for ln in OFFTOPIC_FILE.read_text("utf-8").splitlines() if ln.strip()]


@pytest.fixture(scope="module", params=["gemma-3-270m", "smollm2-135m"])
def real_model(request):
    """(name, path): None is the bundled default."""
    return request.param, (None if request.param == "gemma-3-270m" else str(smollm2_path()))


def child(code: str, *args) -> dict:
    """Run ``code`` in a fresh interpreter with ``args`` as sys.argv[1:]; its last stdout line is JSON."""
    proc = subprocess.run([sys.executable, "-c", code, *[json.dumps(a) for a in args]], capture_output=True,
                          text=True, timeout=1800, env=dict(os.environ))
    assert proc.returncode == 0, proc.stderr[-3000:]
    return json.loads(proc.stdout.strip().splitlines()[-1])


DEMO = """
import json, sys
from miita_edge.demo.run import run_demo
res = run_demo(model=json.loads(sys.argv[1]), quiet=True)
print(json.dumps({k: res[k] for k in ("frozen_accuracy", "adapted_accuracy", "frozen_blank", "queries")}))
"""

CHECK = """
import json, sys
from miita_edge.steering_check import steering_check
c = steering_check(json.loads(sys.argv[1]), preset="default")
print(json.dumps(c.to_json()))
"""

OFF = """
import json, sys
from pathlib import Path
from miita_edge import Example, Miita
model, data, off, mem = (json.loads(a) for a in sys.argv[1:])
meta = json.loads(Path(data, "meta.json").read_text())
first = meta["stage_order"][0]
rows = [json.loads(ln) for ln in Path(data, "train.jsonl").read_text("utf-8").splitlines() if ln]
rows = [r for r in rows if r["task"] == first][:200]
qs = [ln.strip() for ln in Path(off).read_text("utf-8").splitlines() if ln.strip()]
with Miita(model, mem, template="banking77") as m:
    m.ingest([Example(r["input"], r["output"], r["task"], i) for i, r in enumerate(rows, 1)], budget="none")
    same = sum(m.ask(q, max_tokens=8, adapt=False).text == m.ask(q, max_tokens=8).text for q in qs)
print(json.dumps({"same": same, "n": len(qs)}))
"""


def test_offtopic_set_is_large_and_distinct():
    assert len(OFFTOPIC) >= 200 and len(set(OFFTOPIC)) == len(OFFTOPIC)


def test_demo_stream(real_model):
    """The demo stream (4 tasks whose labels the frozen model cannot guess) with memory."""
    name, path = real_model
    res = child(DEMO, path)
    assert res["frozen_accuracy"] <= 5.0
    # measured 86.2 (Gemma, docs/RESULTS.md) and 75.0 (SmolLM2 through its chat template; docs/method.md,
    # "Push: a logit margin measured on the model")
    assert res["adapted_accuracy"] >= {"gemma-3-270m": 82.5, "smollm2-135m": 65.0}[name], res
    # The frozen column shows what the model says: under the archived stop rule Gemma's answer
    # was "" on 69 of the 80 queries, because it opens them with a newline.
    assert res["frozen_blank"] <= res["queries"] // 10, res


def test_taught_answers_come_back_and_the_rest_is_untouched(real_model):
    """check-model's functional test, both rates at its bar, on the default preset."""
    from miita_edge.steering_check import BAR

    _, path = real_model
    c = child(CHECK, path)
    assert c["recall"] >= BAR and c["untouched"] >= BAR, c


def test_a_banking_memory_leaves_offtopic_questions_alone(real_model, tmp_path):
    """With a memory of Banking77's first stage (its first 200 training rows as stored), general
    questions and small talk get the frozen model's answer on most of the 202 prompts of
    tests/data/offtopic.txt (measured 97.0% on Gemma, 96.5% on SmolLM2 here under the default v9,
    95.0% and 94.6% under v8; bench/offtopic.py measures all four benchmarks outside the dev rows,
    97.5-100% on both under v9: docs/RESULTS.md)."""
    if not (SHARED_DATA / "banking77").is_dir():
        pytest.fail(f"benchmark data not found at {SHARED_DATA} (the tests read ../shared/data)")
    _, path = real_model
    res = child(OFF, path, str(SHARED_DATA / "banking77"), str(OFFTOPIC_FILE), str(tmp_path / "mem"))
    assert res["n"] == len(OFFTOPIC) and res["same"] / res["n"] >= 0.90, res
