"""Ingest with extraction on a local Ray cluster equals a single-process ingest.

Run by tests/test_ray_ingest.py in a process of its own (see there why); runnable by hand with
``python -m pytest -q tests/_ray_cases.py``.

The driver writes the bank in stream order with the same budget repair, and each worker extracts
with the same model, template and preset, so the committed arrays must be identical.
"""
from __future__ import annotations

import json

import numpy as np
import pytest

ray = pytest.importorskip("ray", reason='Ray is an optional extra: pip install ".[ray]"')

pytestmark = pytest.mark.model


def _rows(n):
    topics = [("my card payment was declined at the shop", "card declined"),
              ("how do I top up with a bank transfer", "top up by transfer"),
              ("the exchange rate you used looks wrong", "exchange rate"),
              ("I want to close my account today", "close account")]
    return [(f"{x} ({i})", y) for i, (x, y) in enumerate(topics[i % 4] for i in range(n))]


def test_ray_cli_flag_starts_and_stops_a_local_cluster(tmp_path, capsys):
    from miita_edge.cli import main

    assert not ray.is_initialized()
    data = tmp_path / "rows.jsonl"
    data.write_text("".join(json.dumps({"input": x, "output": y}) + "\n" for x, y in _rows(6)))
    rc = main(["ingest", str(data), "--memory", str(tmp_path / "m"), "--ray", "--contexts", "1",
               "--threads", "1", "--json"])
    out, err = capsys.readouterr()
    assert rc == 0, err
    assert json.loads(out)["examples"] == 6
    assert not ray.is_initialized()  # the cluster started for the call is stopped again


@pytest.fixture(scope="module")
def cluster():
    """One local cluster for the equality tests (starting one costs ~15 s on 2 cores)."""
    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False)
    yield
    ray.shutdown()


@pytest.mark.parametrize("preset,budget", [("default", "3KiB"), ("paper", "none")])
def test_ray_ingest_equals_local_ingest(tmp_path, preset, budget, cluster):
    from miita_edge import Example, Miita
    from miita_edge.memory.store import Store
    from miita_edge.runtime.engine import EngineConfig

    rows = _rows(12 if preset == "default" else 6)
    examples = [Example(x, y, line=i + 1) for i, (x, y) in enumerate(rows)]
    with Miita(memory=tmp_path / "local", preset=preset, template="plain",
               engine_config=EngineConfig(n_threads=1)) as m:
        rep_local = m.ingest(examples, budget=budget, progress=False)
        with Miita(memory=tmp_path / "ray", preset=preset, template="plain", engine=m.engine) as r:
            rep_ray = r.ingest(examples, budget=budget, progress=False, ray=True, ray_workers=2)
    a, b = Store(tmp_path / "local").read(), Store(tmp_path / "ray").read()
    assert sorted(a.arrays) == sorted(b.arrays)
    for k in a.arrays:
        assert np.array_equal(np.asarray(a.arrays[k]), np.asarray(b.arrays[k])), k
    assert a.manifest == b.manifest
    for f in ("examples", "skipped", "prototypes", "anchors", "bytes", "budget_bytes", "repair"):
        assert getattr(rep_local, f) == getattr(rep_ray, f), f
    assert rep_local.examples == len(rows)
