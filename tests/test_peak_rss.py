"""bench/peak_rss.py measures each child's own peak, not its parent's.

``ru_maxrss`` survives ``exec``: a child spawned from a process that holds a model reports that
process's peak. The bench reads each child's ``VmHWM`` instead and spawns children from a bare
launcher. These tests put a child that allocates nothing next to a parent that holds a lot.
"""
from __future__ import annotations

import resource
import sys
from pathlib import Path

import numpy as np
import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "bench"))
import peak_rss  # noqa: E402  (bench/peak_rss.py, a benchmark script, not a package module)

pytestmark = pytest.mark.skipif(not Path("/proc/self/status").exists(), reason="needs Linux /proc")


def test_an_idle_child_reports_far_less_than_a_big_parent():
    bench = peak_rss
    launcher = bench.Launcher()  # started while this process is still small
    try:
        big = np.ones(300 * 2**20 // 8)  # 300 MiB, every page touched
        parent = bench.own_vmhwm_kib()
        via_launcher = bench.measure(launcher, "idle")
        direct = bench.measure(None, "idle")  # spawned from the big parent itself
        allocating = bench.measure(launcher, "alloc", prompt="200")
    finally:
        launcher.close()
    assert big.nbytes == 300 * 2**20 and parent > 300 * 1024
    for idle in (via_launcher, direct):
        assert idle["vmhwm_kib"] < 80 * 1024, idle  # a bare interpreter: tens of MiB
        assert idle["vmhwm_kib"] < parent / 4
    # the measurement is not stuck at one value: a child that allocates 200 MiB reports it
    assert allocating["vmhwm_kib"] > via_launcher["vmhwm_kib"] + 190 * 1024
    assert [s[0] for s in allocating["stages"]] == ["start", "allocated"]


def test_ru_maxrss_is_the_artifact_the_bench_avoids():
    """What the old measurement read: the children's ru_maxrss includes the parent's peak."""
    bench = peak_rss
    big = np.ones(256 * 2**20 // 8)
    bench.measure(None, "idle")
    children_maxrss = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss
    assert big.nbytes and children_maxrss > 250 * 1024, (
        "ru_maxrss of a child of a 256 MiB parent no longer carries the parent's peak on this kernel; "
        f"got {children_maxrss} KiB (python {sys.version.split()[0]})")
