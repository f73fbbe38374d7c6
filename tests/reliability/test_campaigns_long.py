"""The reliability campaigns at the length docs/reliability.md reports (skipped unless
``--campaign-long``; hours on a 2-core machine). Each campaign's ``main`` checks every case and
returns non-zero on any failure, so these assert exactly what the documented runs assert.

    PYTHONPATH=python python3 -m pytest -q -p no:cacheprovider tests/reliability --campaign-long
"""
from __future__ import annotations

import pytest

import reliability_concurrency
import reliability_corruption
import reliability_inputs
import reliability_kills
import reliability_resources

pytestmark = pytest.mark.campaign_long


def test_store_kills_1000():
    assert reliability_kills.main(["--store-kills", "1000", "--ingest-kills", "0", "--seed", "0"]) == 0


@pytest.mark.model
def test_ingest_kills_50():
    assert reliability_kills.main(["--store-kills", "0", "--ingest-kills", "50", "--seed", "0"]) == 0


@pytest.mark.model
def test_corruption_10000():
    assert reliability_corruption.main(["--count", "10000", "--seed", "0"]) == 0


@pytest.mark.model
def test_concurrency_100_commits():
    assert reliability_concurrency.main(["--commits", "100", "--readers", "2", "--writer-rounds", "8"]) == 0


@pytest.mark.model
def test_resources_all_cases():
    assert reliability_resources.main(["--seed", "0"]) == 0


@pytest.mark.model
def test_inputs_10000():
    assert reliability_inputs.main(["--seed", "0"]) == 0
