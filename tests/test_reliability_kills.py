"""Short runs of the kill campaign (bench/reliability_kills.py; full figures in docs/reliability.md)."""
from __future__ import annotations


import numpy as np
import pytest

from _bench_scripts import load_bench  # tests/_bench_scripts.py


def _bench():
    return load_bench("reliability_kills")


def test_store_survives_sigkills_during_commits(tmp_path):
    t = _bench().store_campaign(40, seed=1, work=tmp_path, progress=False)
    assert t.kills == 40 and not t.failures, t.failures
    assert t.inside_commit >= 10  # the kills did land inside commits, not only between them


@pytest.mark.model
def test_real_ingest_survives_sigkills(tmp_path):
    # three runs: one killed anywhere, one near its end, one inside its commit (aimed by the marker)
    t = _bench().ingest_campaign(3, seed=1, work=tmp_path, progress=False, commit_kill_scale=0.0)
    assert not t.failures, t.failures
    assert t.inside_commit >= 1, "the third kill is aimed inside the real commit"


def test_the_checks_catch_what_they_look_for(tmp_path):
    """Content, debris and version checks flag planted failures (a checker that cannot fail is no check)."""
    bench = _bench()
    from miita_edge.memory.store import Store
    from miita_edge.memory.store_format import version_name

    path = tmp_path / "s"
    with Store(path).writer() as w:
        for v in (1, 2):
            arrays, manifest = bench.content(7, v)
            w.commit(arrays, manifest)
    snap = Store(path).read()
    assert bench.same_content(snap, 7) and not bench.same_content(snap, 8)
    arrays, manifest = bench.content(7, 2)
    name = sorted(arrays)[0]
    assert bench.content(7, 2)[0][name].tobytes() == np.asarray(snap.arrays[name]).tobytes()
    ok, problems = bench.check_store_dir(path, {version_name(2)})
    assert not ok and not problems
    (path / "v00000007").mkdir()
    (path / "v00000008").mkdir()
    (path / "stray.txt").write_text("x")
    debris, problems = bench.check_store_dir(path, {version_name(2)})
    assert debris and any("pile up" in p for p in problems) and any("stray.txt" in p for p in problems)
