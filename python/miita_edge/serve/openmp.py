"""The server's OpenMP wait policy: passive unless the user chose one.

This llama.cpp build runs its threads with OpenMP (libgomp), whose threads spin at every barrier
between graph nodes (by default up to 300,000 iterations) before they sleep. A server shares its
cores with its clients, its own event loop and whatever else runs on a desktop; there a spinning
thread burns the time slice its partner needs, and a 32-token answer measured 12-20x slower than
with ``OMP_WAIT_POLICY=PASSIVE`` on a busy 2-core machine (bench/omp_wait.py, docs/serving.md).
libgomp reads the policy once, when it loads -- at ``import llama_cpp``, before any command runs --
so the only way to set it from here is to start the process again with it in the environment.
"""
from __future__ import annotations

import os
import sys

VARS = ("OMP_WAIT_POLICY", "GOMP_SPINCOUNT")


def reexec_passive(argv: list[str]) -> None:
    """Run ``python argv...`` in place of this process with OMP_WAIT_POLICY=PASSIVE, unless either
    variable is already set (the user's choice, or this is the re-run); POSIX only."""
    if os.name != "posix" or any(v in os.environ for v in VARS):
        return
    os.environ["OMP_WAIT_POLICY"] = "PASSIVE"
    sys.stdout.flush()
    sys.stderr.flush()
    os.execv(sys.executable, [sys.executable, *argv])
