"""Forgetting (``MemoryBank.forget_answer``, ``Miita.forget``, ``miita-edge forget``).

The exact property (docs/serving.md, "Forgetting"): for payloads that keep answers ('tokens', the
default preset, and 'sequence'), when no budget repair ran, the bank after forgetting answer y is
the bank built from the same stream without the rows whose output is y -- array for array. A
prototype only ever merges with one of the same answer, so the other answers' prototypes never
depended on y's rows. ('mean' prototypes, the paper preset, may merge answers: refused.)"""
from __future__ import annotations

import json
import subprocess
import sys

import numpy as np
import pytest

from miita_edge.memory.bank import BankConfig, MemoryBank

H = 32


def _stream(seed: int, n: int = 60):
    rng = np.random.default_rng(seed)
    answers = [rng.integers(0, 50, size=rng.integers(1, 4)).astype(np.int32) for _ in range(5)]
    rows = []
    for _ in range(n):
        a = int(rng.integers(0, len(answers)))
        base = rng.normal(size=H).astype(np.float32) + 3 * np.eye(H, dtype=np.float32)[a]
        rows.append((a, answers[a], rng.normal(size=(len(answers[a]), H)).astype(np.float32), base))
    return answers, rows


def _bank(cfg, rows):
    b = MemoryBank(cfg, H, np.zeros(H, np.float32))
    for _, toks, dirs, key in rows:
        b.write(dirs, toks, key)
    return b


def _same(a: MemoryBank, b: MemoryBank):
    x, y = a.to_arrays(), b.to_arrays()
    assert x.keys() == y.keys()
    for k in x:
        np.testing.assert_array_equal(x[k], y[k], err_msg=k)


@pytest.mark.parametrize("payload,key_precision", [("tokens", "bit"), ("tokens", "float32"), ("sequence", "int8")])
@pytest.mark.parametrize("seed", range(6))
def test_forget_equals_rebuild_without_those_rows(payload, key_precision, seed):
    cfg = BankConfig(payload=payload, key_precision=key_precision, tau_k=0.3)
    answers, rows = _stream(seed)
    for a, toks in enumerate(answers):
        bank = _bank(cfg, rows)
        n_rows = sum(r[0] == a or np.array_equal(r[1], toks) for r in rows)
        removed, _, n = bank.forget_answer(toks)
        assert n == n_rows and (removed >= 1) == (n_rows > 0)
        _same(bank, _bank(cfg, [r for r in rows if not np.array_equal(r[1], toks)]))


def test_forget_detects_a_wrong_removal():
    """The comparison above catches a bank that kept one row too many (it can fail)."""
    cfg = BankConfig(payload="tokens", key_precision="bit", tau_k=0.3)
    answers, rows = _stream(0)
    bank = _bank(cfg, rows)
    bank.forget_answer(answers[0])
    wrong = _bank(cfg, [r for r in rows if not np.array_equal(r[1], answers[0])] + [rows[0]])
    with pytest.raises(AssertionError):
        _same(bank, wrong)


def test_forget_unknown_answer_changes_nothing_and_mean_is_refused():
    cfg = BankConfig(payload="tokens", key_precision="bit")
    _, rows = _stream(1)
    bank = _bank(cfg, rows)
    assert bank.forget_answer(np.array([999], np.int32)) == (0, 0, 0)
    _same(bank, _bank(cfg, rows))
    with pytest.raises(ValueError, match="cannot forget"):
        _bank(BankConfig(payload="mean"), [(a, t, d[:1], k) for a, t, d, k in rows]).forget_answer(rows[0][1])


@pytest.mark.model
def test_miita_forget_matches_serial_ingest_without_rows(tmp_path):
    from miita_edge import Example, Miita
    from miita_edge.memory.store import Store
    from miita_edge.runtime.engine import EngineConfig
    from _serve_server import demo_rows

    rows = demo_rows()[:30]
    target = rows[0]["output"]
    cfg = EngineConfig(n_threads=2, n_ctx=1024)
    with Miita(memory=tmp_path / "a", engine_config=cfg) as m:
        m.ingest([Example(r["input"], r["output"]) for r in rows], budget="none")
        v = m.version
        out = m.forget(target)
        assert out["removed_examples"] == sum(r["output"] == target for r in rows) and out["version"] == v + 1
        assert m.forget(target)["removed_prototypes"] == 0 and m.version == v + 1  # nothing left: no commit
        rest = [Example(r["input"], r["output"]) for r in rows if r["output"] != target]
        with Miita(memory=tmp_path / "b", engine=m.engine) as m2:
            m2.ingest(rest, budget="none")
    a, b = Store(tmp_path / "a").read(), Store(tmp_path / "b").read()
    assert a.arrays.keys() == b.arrays.keys()
    for k in a.arrays:
        np.testing.assert_array_equal(a.arrays[k], b.arrays[k], err_msg=k)
    from miita_edge.memory.meta import expand

    a_f, b_f = expand(a.manifest, a.arrays), expand(b.manifest, b.arrays)  # the long form of the fields
    for k in ("examples", "prototypes", "anchors"):
        assert a_f[k] == b_f[k], k
    # the CLI: one line, exit 0; a memory that does not exist is a one-line error
    import miita_edge
    from pathlib import Path

    env = {"PYTHONPATH": str(Path(miita_edge.__file__).resolve().parent.parent)}
    import os

    env = {**os.environ, **env}
    p = subprocess.run([sys.executable, "-m", "miita_edge.cli", "forget", "--output", rows[1]["output"], "--memory",
                        str(tmp_path / "a"), "--threads", "2", "--json"], capture_output=True, text=True, env=env)
    assert p.returncode == 0, p.stderr
    assert json.loads(p.stdout)["removed_prototypes"] >= 1
    p = subprocess.run([sys.executable, "-m", "miita_edge.cli", "forget", "--output", "x", "--memory",
                        str(tmp_path / "none")], capture_output=True, text=True, env=env)
    assert p.returncode == 2 and p.stderr.startswith("miita-edge: error: no memory at") and "Traceback" not in p.stderr
