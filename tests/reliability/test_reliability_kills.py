"""Short runs of the kill campaign (tests/reliability/reliability_kills.py; full figures in docs/reliability.md)."""
from __future__ import annotations


import numpy as np
import pytest

import reliability_kills as campaign  # tests/reliability/reliability_kills.py


def test_store_survives_sigkills_during_commits(tmp_path):
    t = campaign.store_campaign(40, seed=1, work=tmp_path, progress=False)
    assert t.kills == 40 and not t.failures, t.failures
    assert t.inside_commit >= 10  # the kills did land inside commits, not only between them


@pytest.mark.model
def test_real_ingest_survives_sigkills(tmp_path):
    # three runs: one killed anywhere, one near its end, one inside its commit (aimed by the marker)
    t = campaign.ingest_campaign(3, seed=1, work=tmp_path, progress=False, commit_kill_scale=0.0)
    assert not t.failures, t.failures
    assert t.inside_commit >= 1, "the third kill is aimed inside the real commit"


def test_the_checks_catch_what_they_look_for(tmp_path):
    """Content, debris and version checks flag planted failures (a checker that cannot fail is no check)."""
    from miita_edge.memory.store import Store
    from miita_edge.memory.store_format import version_name

    path = tmp_path / "s"
    with Store(path).writer() as w:
        for v in (1, 2):
            arrays, manifest = campaign.content(7, v)
            w.commit(arrays, manifest)
    snap = Store(path).read()
    assert campaign.same_content(snap, 7) and not campaign.same_content(snap, 8)
    arrays, manifest = campaign.content(7, 2)
    name = sorted(arrays)[0]
    assert campaign.content(7, 2)[0][name].tobytes() == np.asarray(snap.arrays[name]).tobytes()
    ok, problems = campaign.check_store_dir(path, {version_name(2)})
    assert not ok and not problems
    (path / "v00000007").mkdir()
    (path / "v00000008").mkdir()
    (path / "stray.txt").write_text("x")
    debris, problems = campaign.check_store_dir(path, {version_name(2)})
    assert debris and any("pile up" in p for p in problems) and any("stray.txt" in p for p in problems)
