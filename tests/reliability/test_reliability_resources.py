"""Short version of the resources reliability campaign, plus its regressions.

tests/reliability/reliability_resources.py makes the memory's writes fail during a real ``ingest`` (a
file-size limit, a full or inode-less tmpfs, a read-only bind mount, a 0555 directory enforced
on root) and checks: one clear line, exit 2, the committed version intact, and a clean retry.
Here: the file-size-limit case always; the mount and capability cases where the machine allows
(a skip says why); the store-level regressions without the model; and the checker shown to
catch planted failures.
"""
from __future__ import annotations

import os
import resource
import signal
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

import reliability_resources as campaign  # tests/reliability/reliability_resources.py


def _store(mem: Path, examples: int = 3) -> None:
    from miita_edge.memory.store import Store

    with Store(mem).writer() as w:
        w.commit({"counts": np.arange(examples, dtype=np.int32)}, {"examples": examples, "skipped": 0})


def _child(code: str, *args: str, fsize: int | None = None, prefix: list[str] | None = None):
    def pre():
        signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
        resource.setrlimit(resource.RLIMIT_FSIZE, (fsize, fsize))

    import miita_edge  # the package under test, installed or from PYTHONPATH: its parent goes to the child

    pkg = str(Path(miita_edge.__file__).resolve().parent.parent)
    env = dict(os.environ, PYTHONPATH=pkg + os.pathsep + os.environ.get("PYTHONPATH", ""))
    return subprocess.run((prefix or []) + [sys.executable, "-c", code, *args], capture_output=True, text=True,
                          env=env, timeout=120, preexec_fn=pre if fsize is not None else None)


COMMIT = r"""
import sys, numpy as np
from miita_edge.errors import StoreError
from miita_edge.memory.store import Store
try:
    with Store(sys.argv[1]).writer() as w:
        w.commit({"counts": np.arange(50, dtype=np.int32)}, {"examples": 50, "skipped": 0})
    print("committed")
except StoreError as e:
    print("StoreError:", e)
"""


# --------------------------------------------------------------------------- regressions, no model

@pytest.mark.parametrize("limit", [0, 3, 200])
def test_regression_a_file_size_limit_is_a_store_error(tmp_path, limit):
    """Finding 5: under RLIMIT_FSIZE (or a full disk) rewriting the pid in .lock raised a bare
    OSError (EFBIG) out of Writer.__enter__: a traceback. The pid is now best effort and the
    commit's own failure is the one-line StoreError; the committed version is untouched."""
    mem = tmp_path / "mem"
    _store(mem)
    before = campaign.committed(mem)
    p = _child(COMMIT, str(mem), fsize=limit)
    assert p.returncode == 0 and "Traceback" not in p.stderr, p.stderr[-1500:]
    assert p.stdout.startswith("StoreError: memory ") and "File too large" in p.stdout, p.stdout
    assert campaign.committed(mem) == before and campaign.counts(mem) == (1, 3)
    p = _child(COMMIT, str(mem))  # the limit lifted: the next write succeeds and leaves no debris
    assert p.stdout.strip() == "committed"
    assert campaign.counts(mem) == (2, 50) and campaign.listing(mem) == [".lock", "CURRENT", "v00000002"]


def test_regression_debris_in_a_read_only_directory_is_a_store_error(tmp_path):
    """Finding 6: a 0555 memory holding the debris of a killed writer made Writer._recover raise a
    bare PermissionError (traceback); it is now a one-line StoreError, the memory untouched."""
    why = campaign.can_drop_dac()
    if why:
        pytest.skip(f"cannot make 0555 bind root here: {why}")
    mem = tmp_path / "mem"
    _store(mem)
    campaign.plant_debris(mem)
    def state():  # every file but .lock, which holds the pid of the last writer
        return {k: v for k, v in campaign.digest(mem).items() if k != ".lock"}

    before = state()
    os.chmod(mem, 0o555)
    try:
        p = _child(COMMIT, str(mem), prefix=campaign.DROP_DAC)
    finally:
        os.chmod(mem, 0o755)
    assert "Traceback" not in p.stderr, p.stderr[-1500:]
    assert p.stdout.startswith("StoreError: memory ") and "Permission denied" in p.stdout, p.stdout
    assert state() == before
    p = _child(COMMIT, str(mem))
    assert p.stdout.strip() == "committed" and campaign.listing(mem) == [".lock", "CURRENT", "v00000002"]


# --------------------------------------------------------------------------- the checker can fail

def test_the_checker_flags_a_traceback_and_a_changed_memory(tmp_path):
    mem = tmp_path / "mem"
    _store(mem)
    before_c, before_n = campaign.committed(mem), campaign.counts(mem)
    good = campaign.Child(2, "", f"miita-edge: error: memory {mem}: cannot write v00000002 (File too large)\n", 0.1)
    res = campaign.Result("planted", "none")
    campaign.check_refusal(res, good, mem, before_c, before_n)
    assert res.ok, res.problems
    for child in (campaign.Child(1, "", "Traceback (most recent call last):\n  ...\nOSError: [Errno 27] File too large\n", 0),
                  campaign.Child(2, "", "miita-edge: error: something vague\n", 0)):
        res = campaign.Result("planted", "none")
        campaign.check_refusal(res, child, mem, before_c, before_n)
        assert not res.ok
    _store(mem, examples=4)  # the "failed" ingest committed after all
    res = campaign.Result("planted", "none")
    campaign.check_refusal(res, good, mem, before_c, before_n)
    assert not res.ok and any("changed" in p for p in res.problems)
    (mem / "v00000001").mkdir()  # debris left by the retry
    res = campaign.Result("planted", "none")
    campaign.check_retry(res, campaign.Child(0, "", "", 0), mem, (1, 3), 1)
    assert not res.ok and any("debris" in p for p in res.problems)


# --------------------------------------------------------------------------- the real ingest

@pytest.fixture(scope="module")
def seed(tmp_path_factory):
    work = tmp_path_factory.mktemp("res")
    return work, campaign.make_seed(work)


@pytest.mark.model
def test_ingest_under_a_file_size_limit(seed):
    import random

    work, seed_mem = seed
    res = campaign.one_case("fsize-0", "RLIMIT_FSIZE=0", work, seed_mem, random.Random(0), fsize=0)
    assert res.outcome == "refused" and res.ok, (res.message, res.problems)
    assert "File too large" in res.message


@pytest.mark.model
def test_ingest_on_a_full_tmpfs_and_a_read_only_mount(seed):
    why = campaign.can_mount()
    if why:
        pytest.skip(f"no private mount namespace here: {why}")
    work, _ = seed
    cmd = ["unshare", "-m", "--propagation", "private", sys.executable, campaign.__file__,
           "--inside-namespace", str(work), "--quick", "--cases", "tmpfs-free-0,ro-bind-debris"]
    p = subprocess.run(cmd, capture_output=True, text=True, env=campaign._env(), timeout=300)
    assert p.returncode == 0, p.stderr[-2000:]
    import json

    results = json.loads(p.stdout.strip().splitlines()[-1])
    assert [r["case"] for r in results] == ["ro-bind-debris", "tmpfs-free-0"]
    for r in results:
        assert r["outcome"] == "refused" and r["ok"], r
    assert "Read-only file system" in results[0]["message"] and "No space left" in results[1]["message"]


def test_regression_a_full_disk_at_current_tmp_leaves_no_debris(tmp_path, monkeypatch):
    """Finding 7: on a tmpfs with 6 free pages the new version fitted but CURRENT.tmp did not
    (ENOSPC after it was created); the failed commit removed the version directory and left
    CURRENT.tmp behind (the next writer removed it). A failed commit now leaves nothing."""
    import errno

    from miita_edge.errors import StoreError
    from miita_edge.memory import store as store_mod

    mem = tmp_path / "mem"
    _store(mem)
    real = store_mod.write_file

    def full_at_current_tmp(fpath, chunks):
        if Path(fpath).name == "CURRENT.tmp":
            Path(fpath).write_bytes(b"")  # created, then out of space
            raise OSError(errno.ENOSPC, "No space left on device")
        return real(fpath, chunks)

    monkeypatch.setattr(store_mod, "write_file", full_at_current_tmp)
    with pytest.raises(StoreError, match="cannot write v00000002 \\(No space left on device\\)"):
        with store_mod.Store(mem).writer() as w:
            w.commit({"counts": np.arange(5, dtype=np.int32)}, {"examples": 5, "skipped": 0})
    assert campaign.listing(mem) == [".lock", "CURRENT", "v00000001"] and campaign.counts(mem) == (1, 3)
