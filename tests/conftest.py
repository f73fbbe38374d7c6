"""Shared fixtures. The real-model tier loads the embedded Gemma-3-270M GGUF once per session."""
from __future__ import annotations

import numpy as np
import pytest


def pytest_addoption(parser):
    parser.addoption("--campaign-long", action="store_true",
                     help="also run the reliability campaigns at their documented length (tests/reliability; hours)")


def pytest_configure(config):
    config.addinivalue_line("markers", "campaign_long: a full-length reliability campaign (needs --campaign-long)")


def pytest_collection_modifyitems(config, items):
    if config.getoption("--campaign-long"):
        return
    skip = pytest.mark.skip(reason="full-length campaign: run with --campaign-long")
    for item in items:
        if "campaign_long" in item.keywords:
            item.add_marker(skip)


@pytest.fixture(scope="session")
def _session_ledger(tmp_path_factory):
    return tmp_path_factory.mktemp("ledger") / "ledger.jsonl"


@pytest.fixture(autouse=True)
def _ledger_off_the_repo(_session_ledger, monkeypatch):
    """No test appends to the repository's ledger of reads (docs/results/ledger.jsonl): a
    ``miita-edge bench --split test`` in a test writes to a temporary ledger unless it names one."""
    monkeypatch.setenv("MIITA_EDGE_LEDGER", str(_session_ledger))


@pytest.fixture(scope="session")
def model_path():
    from miita_edge.runtime.default_model import embedded_model_path

    return embedded_model_path()


@pytest.fixture(scope="session")
def engine(model_path):
    from miita_edge.runtime.engine import Engine, EngineConfig

    eng = Engine(model_path, EngineConfig(n_ctx=1024, n_batch=256))
    yield eng
    eng.close()


@pytest.fixture(scope="session")
def gguf_reader(model_path):
    """gguf-py's own reader: the independent source of tensor bytes and dequantization."""
    from gguf import GGUFReader

    return GGUFReader(str(model_path))


@pytest.fixture(scope="session")
def W_ref(gguf_reader) -> np.ndarray:
    """The LM head dequantized by gguf-py (not by our kernels): (n_vocab, n_embd) float32."""
    from gguf import quants
    from gguf.constants import GGMLQuantizationType

    t = next(t for t in gguf_reader.tensors if t.name == "token_embd.weight")
    return quants.dequantize(t.data, GGMLQuantizationType(t.tensor_type))


@pytest.fixture(scope="session")
def engine1():
    """One thread, a 2,048-token context: what the benchmark runner's tests and baselines use."""
    from miita_edge.runtime.engine import Engine, EngineConfig

    eng = Engine(None, EngineConfig(n_threads=1, n_ctx=2048))
    yield eng
    eng.close()
