"""Short runs of the concurrency campaign (bench/reliability_concurrency.py; figures in docs/reliability.md)."""
from __future__ import annotations

import importlib.util
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest


def _bench():
    path = Path(__file__).resolve().parent.parent / "bench" / "reliability_concurrency.py"
    spec = importlib.util.spec_from_file_location("reliability_concurrency", path)
    mod = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = mod
    spec.loader.exec_module(mod)
    return mod


def test_store_readers_never_see_a_torn_version(tmp_path):
    r = _bench().store_readers(30, 2, tmp_path)
    assert r["writer_rc"] == 0 and not r["reader_errors"], r
    assert r["reads"] > 30 and r["versions"] >= 2, r  # the readers really ran during the commits
    assert r["torn"] == 0 and r["errors"] == 0, r


def test_the_reader_flags_a_mixed_version(tmp_path):
    """The reader's check is not vacuous: a version whose arrays hold another version's numbers is torn."""
    bench = _bench()
    from miita_edge.memory.store import Store

    path = tmp_path / "s"
    with Store(path).writer() as w:
        w.commit({"a": np.full((64, 32), 0, np.int64), "b": np.full(2, 1, np.float64)}, {"v": 1})
    stop = tmp_path / "stop"
    p = subprocess.Popen([sys.executable, "-c", bench.STORE_READER, str(path), str(stop)], stdout=subprocess.PIPE,
                         text=True)
    import time

    time.sleep(2.0)
    stop.touch()
    out, _ = p.communicate(timeout=60)
    got = __import__("json").loads(out.strip().splitlines()[-1])
    assert got["reads"] > 0 and got["torn"] == got["reads"]


@pytest.mark.model
def test_ask_readers_during_ingest_commits(tmp_path):
    r = _bench().ask_readers(4, 1, tmp_path)
    assert r["writer_rc"] == 0, r["writer_err"]
    assert r["reads"] >= 1 and r["torn"] == 0 and r["errors"] == 0 and not r["reader_errors"], r


@pytest.mark.model
def test_two_writers_one_memory_nothing_lost(tmp_path):
    r = _bench().two_writers(2, tmp_path, rows=2)
    assert not r["failures"], r["failures"]
