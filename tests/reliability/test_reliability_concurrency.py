"""Short runs of the concurrency campaign (tests/reliability/reliability_concurrency.py; figures in docs/reliability.md)."""
from __future__ import annotations

import subprocess
import sys

import numpy as np
import pytest

import reliability_concurrency as campaign  # tests/reliability/reliability_concurrency.py


def test_store_readers_never_see_a_torn_version(tmp_path):
    r = campaign.store_readers(30, 2, tmp_path)
    assert r["writer_rc"] == 0 and not r["reader_errors"], r
    assert r["reads"] > 30 and r["versions"] >= 2, r  # the readers really ran during the commits
    assert r["torn"] == 0 and r["errors"] == 0, r


def test_the_reader_flags_a_mixed_version(tmp_path):
    """The reader's check is not vacuous: a version whose arrays hold another version's numbers is torn."""
    from miita_edge.memory.store import Store

    path = tmp_path / "s"
    with Store(path).writer() as w:
        w.commit({"a": np.full((64, 32), 0, np.int64), "b": np.full(2, 1, np.float64)}, {"v": 1})
    import time

    # the reader reads until told to stop; on a loaded machine its start alone can take seconds, so a
    # run that stopped before its first read is repeated with a longer window instead of failing
    for attempt, window in enumerate((2.0, 10.0, 40.0)):
        stop = tmp_path / f"stop{attempt}"
        p = subprocess.Popen([sys.executable, "-c", campaign.STORE_READER, str(path), str(stop)],
                             stdout=subprocess.PIPE, text=True)
        time.sleep(window)
        stop.touch()
        out, _ = p.communicate(timeout=120)
        got = __import__("json").loads(out.strip().splitlines()[-1])
        if got["reads"] > 0:
            break
    assert got["reads"] > 0 and got["torn"] == got["reads"]


def test_the_fingerprint_check_flags_a_read_of_another_version():
    """A read whose (version, fingerprint) is not what the writer committed as that version is torn."""
    rec = campaign.committed_records("committed 1 1 aaaaaaaa\ncommitted 2 2 bbbbbbbb\n", "noise\ncommitted 3 3 cccccccc")
    assert rec == {1: "aaaaaaaa", 2: "bbbbbbbb", 3: "cccccccc"}
    assert campaign.torn_against(rec, [[1, "aaaaaaaa"], [3, "cccccccc"]]) == 0
    # version 2 with version 3's content, and a version nobody committed
    assert campaign.torn_against(rec, [[2, "cccccccc"], [4, "aaaaaaaa"], [1, "aaaaaaaa"]]) == 2


def test_a_refused_writer_says_nothing_was_written(tmp_path):
    """Regression (concurrency campaign): the lock refusal said only "locked by another writer (pid N)";
    it now says that nothing was written and what to do, in one line."""
    from miita_edge.errors import StoreError
    from miita_edge.memory.store import Store

    path = tmp_path / "s"
    with Store(path).writer() as w:
        w.commit({"a": np.zeros(3, np.int64)}, {"v": 1})
        with pytest.raises(StoreError) as info:
            with Store(path).writer():
                pass
    msg = str(info.value)
    assert "locked by another writer" in msg and "nothing was written" in msg and "\n" not in msg
    assert Store(path).read().manifest == {"v": 1}


@pytest.mark.model
def test_a_writer_that_opened_before_another_commit_refuses_clearly(tmp_path):
    """Regression (concurrency campaign): "changed since it was opened; reopen and retry" did not say
    that nothing was written or which versions; the refused writer must not lose the other's examples."""
    from miita_edge import Example, Miita
    from miita_edge.errors import StoreError
    from miita_edge.runtime.engine import Engine, EngineConfig

    eng = Engine(None, EngineConfig(n_threads=1))
    mem = tmp_path / "mem"
    a = Miita(memory=mem, engine=eng, template="plain")
    b = Miita(memory=mem, engine=eng, template="plain")
    a.ingest([Example("my card was declined", "card declined", line=1)], budget="none", progress=False)
    with pytest.raises(StoreError) as info:
        b.ingest([Example("close my account", "close account", line=1)], budget="none", progress=False)
    msg = str(info.value)
    assert "changed since it was opened (version 0 -> 1" in msg and "nothing was written" in msg
    assert "\n" not in msg and b.examples == 0
    again = Miita(memory=mem, engine=eng)
    assert again.version == 1 and again.examples == 1
    again.ingest([Example("close my account", "close account", line=1)], budget="none", progress=False)
    assert Miita(memory=mem, engine=eng).examples == 2
    eng.close()


@pytest.mark.model
def test_ask_readers_during_ingest_commits(tmp_path):
    r = campaign.ask_readers(10, 1, tmp_path)
    assert r["writer_rc"] == 0, r["writer_err"]
    assert r["commits"] == 10 and r["reads"] >= 1 and len(r["seen"]) == r["reads"], r
    assert r["torn"] == 0 and r["torn_digest"] == 0 and r["errors"] == 0 and not r["reader_errors"], r


@pytest.mark.model
def test_two_writers_one_memory_nothing_lost(tmp_path):
    r = campaign.two_writers(2, tmp_path, rows=2)  # one CLI round, one API round
    assert not r["failures"], r["failures"]
    assert r["both_ok"] + r["one_refused"] == 2 and r["locked"] + r["changed"] == r["one_refused"], r
