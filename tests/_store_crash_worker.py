"""Subprocess helper for tests/test_store.py.

Why a separate process: the crash test must SIGKILL a writer at arbitrary instants, and the
lock test needs a writer in another process (flock ownership is per open file description,
but a pid in the message is only meaningful across processes).

Modes:
  commit PATH  -- take the writer lock, print "ready", then commit versions forever; the
                  content of version v is ``arrays_for(v)`` so the parent can check it.
  hold PATH S  -- take the writer lock, print "locked", hold it for S seconds, exit.
"""
from __future__ import annotations

import sys
import time

import numpy as np

from miita_edge.memory.store import Store


def arrays_for(v: int) -> dict[str, np.ndarray]:
    """Deterministic content of version ``v``; sizes vary so files differ between versions."""
    return {
        "keys": np.full((v % 7, 8), v, dtype=np.float32),
        "ids": np.arange(v % 5, dtype=np.int32) + v,
        "big": np.full((64 + v % 3, 64), v % 251, dtype=np.uint8),
    }


def manifest_for(v: int) -> dict:
    return {"v": v, "pad": "x" * (v % 13)}


def commit_forever(path: str) -> None:
    store = Store(path)
    with store.writer(wait=True) as writer:
        v = store.read().version if store.exists() else 0
        print("ready", flush=True)
        while True:
            v += 1
            snap = writer.commit(arrays_for(v), manifest_for(v))
            if snap.version != v:
                raise SystemExit(f"committed {snap.version}, expected {v}")


def hold(path: str, seconds: float) -> None:
    with Store(path).writer():
        print("locked", flush=True)
        time.sleep(seconds)


if __name__ == "__main__":
    if sys.argv[1] == "commit":
        commit_forever(sys.argv[2])
    elif sys.argv[1] == "hold":
        hold(sys.argv[2], float(sys.argv[3]))
    else:
        raise SystemExit(f"unknown mode {sys.argv[1]!r}")
