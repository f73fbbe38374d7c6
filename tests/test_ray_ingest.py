"""Ray ingest's tests (tests/_ray_cases.py), run in a pytest process of their own.

Why a separate process: Ray starts its cluster from inside the calling process, and when its
C++ client cannot reach the cluster's control store in time it aborts the process (SIGABRT, no
Python exception). In a CI run that happened late in the suite, under pytest's fd capture, and it
took the whole test run down with it. Run apart, a failure inside Ray is one failed test whose
output (Ray's own message included) is shown, and the rest of the suite still runs and reports.
"""
from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("ray", reason='Ray is an optional extra: pip install ".[ray]"')

pytestmark = pytest.mark.model

CASES = Path(__file__).with_name("_ray_cases.py")


def test_ray_cases_pass_in_their_own_process():
    proc = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-rs", str(CASES)],
                          cwd=CASES.parent.parent, capture_output=True, text=True, timeout=1200,
                          stdin=subprocess.DEVNULL)
    tail = (proc.stdout[-6000:] + "\n" + proc.stderr[-3000:]).strip()
    assert proc.returncode == 0, f"tests/_ray_cases.py exited {proc.returncode}:\n{tail}"
    assert " passed" in proc.stdout and " skipped" not in proc.stdout, tail  # all three ran
