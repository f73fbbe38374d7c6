"""runtime.fingerprint.write_cached: the one writer of the derived files in the user cache directory
(head geometry, key-layer choice, calibration keys, model digests)."""
from __future__ import annotations

import json
import os

import numpy as np

from miita_edge.runtime.fingerprint import write_cached


def test_numpy_savers_keep_the_name(tmp_path):
    a = np.arange(6.0).reshape(2, 3)
    write_cached(tmp_path / "sub" / "keys.npy", lambda tmp: np.save(tmp, a))
    write_cached(tmp_path / "sub" / "head.npz", lambda tmp: np.savez(tmp, mean=a))
    assert sorted(p.name for p in (tmp_path / "sub").iterdir()) == ["head.npz", "keys.npy"]
    assert np.array_equal(np.load(tmp_path / "sub" / "keys.npy"), a)
    with np.load(tmp_path / "sub" / "head.npz") as f:
        assert np.array_equal(f["mean"], a)


def test_replaces_whole_and_leaves_no_temporary_file(tmp_path):
    path = tmp_path / "choice.json"
    path.write_text(json.dumps({"old": 1}))
    seen = []

    def write(tmp):
        seen.append(json.loads(path.read_text()))  # the old file stays readable while the new one is written
        tmp.write_text(json.dumps({"new": 2}))

    write_cached(path, write)
    assert seen == [{"old": 1}] and json.loads(path.read_text()) == {"new": 2}
    assert os.listdir(tmp_path) == ["choice.json"]


def test_a_failed_write_keeps_the_old_file_and_raises_nothing(tmp_path):
    path = tmp_path / "choice.json"
    path.write_text("old")

    def write(tmp):
        tmp.write_text("half")
        raise OSError("disk full")

    write_cached(path, write)
    assert path.read_text() == "old" and os.listdir(tmp_path) == ["choice.json"]

