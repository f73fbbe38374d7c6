"""The decode-pass cache of sweeps (``extract_cache.py``): a hit returns what the miss stored,
and a benchmark run through the cache gives exactly the results of a run without it."""
from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from miita_edge import evaluation as ev
from miita_edge.evaluation.extract_cache import ExtractCache

BANKING = Path(__file__).resolve().parents[2] / "shared" / "data" / "banking77"


def test_hit_returns_what_the_miss_stored(tmp_path):
    c = ExtractCache(tmp_path / "c", "sha-a")
    calls = []

    def compute():
        calls.append(1)
        return {"key": np.arange(4.0), "target": np.array([3, 1], np.int64)}

    a = c.get_or_compute("extract", {"prompt": "p", "target": "t"}, compute)
    b = c.get_or_compute("extract", {"prompt": "p", "target": "t"}, compute)
    assert len(calls) == 1 and (c.hits, c.misses) == (1, 1)
    for k in a:
        np.testing.assert_array_equal(a[k], b[k])
    # another field, kind or model is another entry
    c.get_or_compute("extract", {"prompt": "p", "target": "u"}, compute)
    c.get_or_compute("other", {"prompt": "p", "target": "t"}, compute)
    ExtractCache(tmp_path / "c", "sha-b").get_or_compute("extract", {"prompt": "p", "target": "t"}, compute)
    assert len(calls) == 4
    # "no signal" is cached too
    assert c.get_or_compute("extract", {"x": 1}, lambda: None) is None
    assert c.get_or_compute("extract", {"x": 1}, lambda: pytest.fail("recomputed")) is None
    assert not list((tmp_path / "c").glob("*.tmp"))


def test_unreadable_entry_is_recomputed(tmp_path):
    c = ExtractCache(tmp_path, "m")
    c.get_or_compute("k", {"a": 1}, lambda: {"v": np.ones(3)})
    (entry,) = tmp_path.glob("k-*.npz")
    entry.write_bytes(b"truncated")
    v = c.get_or_compute("k", {"a": 1}, lambda: {"v": np.full(3, 2.0)})
    np.testing.assert_array_equal(v["v"], np.full(3, 2.0))


def test_get_and_put_are_the_two_halves_of_get_or_compute(tmp_path):
    from miita_edge.evaluation.extract_cache import ExtractCache

    c = ExtractCache(tmp_path, "m")
    assert c.get("k", {"a": 2}) is ExtractCache.MISS
    c.put("k", {"a": 2}, None)  # a stored "no signal"
    assert c.get("k", {"a": 2}) is None
    c.put("k", {"a": 3}, {"v": np.arange(4)})
    np.testing.assert_array_equal(c.get("k", {"a": 3})["v"], np.arange(4))
    assert c.get_or_compute("k", {"a": 3}, lambda: pytest.fail("a hit must not compute"))["v"].size == 4
    assert (c.hits, c.misses) == (3, 1)


@pytest.mark.model
@pytest.mark.parametrize("method", ["miita-paper", "miita-default", "knn-lm", "example-mem"])
def test_run_through_the_cache_equals_a_run_without(method, engine1, tmp_path):
    kw = dict(budget="none", stages="1,2", limit_per_stage=2, limit_train_per_stage=3, max_tokens=4, progress=False,
              engine=engine1, baseline=None)
    plain = ev.run_benchmark("banking77", BANKING, method, tmp_path / "plain", **kw)
    cache = tmp_path / "cache"
    first = ev.run_benchmark("banking77", BANKING, method, tmp_path / "c1", extract_cache_dir=cache, **kw)
    n_entries = len(list(cache.glob("*.npz")))
    again = ev.run_benchmark("banking77", BANKING, method, tmp_path / "c2", extract_cache_dir=cache, **kw)
    assert n_entries >= 6 and len(list(cache.glob("*.npz"))) == n_entries  # the rerun only read
    for r in (first, again):
        assert r["matrix"] == plain["matrix"] and r["memory_bytes"] == plain["memory_bytes"]
        for t in range(2):
            for tau in range(2):
                p = json.loads((tmp_path / "plain" / "cells" / f"A-{t:02d}-{tau:02d}.json").read_text())["predictions"]
                q = json.loads((Path(r["out_dir"]) / "cells" / f"A-{t:02d}-{tau:02d}.json").read_text())["predictions"]
                assert p == q
