"""Clear one-line errors for bad models and ABI mismatches (fast tier: no model load)."""
from __future__ import annotations

import types

import numpy as np
import pytest

from miita_edge.errors import AbiError, ModelError


def test_missing_model_path(tmp_path):
    from miita_edge.runtime.gguf_model import inspect_gguf

    with pytest.raises(ModelError, match="not found"):
        inspect_gguf(tmp_path / "nope.gguf")


def test_directory_and_non_gguf(tmp_path):
    from miita_edge.runtime.gguf_model import inspect_gguf

    with pytest.raises(ModelError, match="directory"):
        inspect_gguf(tmp_path)
    bad = tmp_path / "x.gguf"
    bad.write_bytes(b"PK\x03\x04 definitely a zip")
    with pytest.raises(ModelError, match="not a GGUF"):
        inspect_gguf(bad)
    trunc = tmp_path / "t.gguf"
    trunc.write_bytes(b"GGUF\x03\x00\x00\x00\x05")
    with pytest.raises(ModelError, match="cannot parse"):
        inspect_gguf(trunc)


def _tiny_gguf(path, arch, softcap=None, n_embd=32, n_vocab=64):
    import gguf

    w = gguf.GGUFWriter(str(path), arch)
    w.add_embedding_length(n_embd)
    w.add_block_count(2)
    if softcap is not None:
        w.add_float32(f"{arch}.final_logit_softcapping", softcap)
    w.add_tensor("token_embd.weight", np.zeros((n_vocab, n_embd), np.float32))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()


def test_tiny_gguf_is_parsed(tmp_path):
    from miita_edge.runtime.gguf_model import inspect_gguf

    p = tmp_path / "tiny.gguf"
    _tiny_gguf(p, "llama")
    info = inspect_gguf(p)
    assert (info.arch, info.n_embd, info.n_layer, info.n_vocab) == ("llama", 32, 2, 64)
    assert info.lm_head.n_bytes == 64 * 32 * 4 and info.logit_softcap is None
    # the mapped bytes are the tensor (zeros), not the header
    assert not info.map_lm_head().any()


def test_softcapped_architecture_is_refused(tmp_path):
    from miita_edge.runtime.engine import Engine

    p = tmp_path / "capped.gguf"
    _tiny_gguf(p, "gemma2", softcap=30.0)
    with pytest.raises(ModelError, match="soft-caps its logits"):
        Engine(p)


def test_abi_mismatch_is_refused():
    from miita_edge import _native
    from miita_edge.runtime.abi import check_abi

    facts = check_abi()
    assert facts["ggml_tensor_overhead"] == facts["compiled_tensor_size"] + 32
    with pytest.raises(AbiError, match="llama-cpp-python 0.3.99"):
        check_abi(llama_cpp_version="0.3.99")
    fake = types.SimpleNamespace(compiled_tensor_size=lambda: _native.compiled_tensor_size() + 8)
    with pytest.raises(AbiError, match="ABI mismatch"):
        check_abi(native=fake)


def test_native_kernels_reject_bad_input():
    from miita_edge import _native

    W = np.zeros(16 * 32 * 4, np.uint8)
    with pytest.raises(RuntimeError, match="outside the vocabulary"):
        _native.lm_gather(W, 0, 16, 32, 128, np.array([16], np.int32))
    with pytest.raises(RuntimeError, match="unknown ggml type"):
        _native.lm_gather(W, 999, 16, 32, 128, np.array([0], np.int32))
    with pytest.raises(ValueError, match="shorter"):
        _native.lm_gather(W[:10], 0, 16, 32, 128, np.array([0], np.int32))


def test_refused_steer_leaves_the_state_as_it_was():
    """A refused miita_state_set_steer copies nothing: its h_q must not serve a later call."""
    from miita_edge import _native

    st = _native.State(4)
    h = np.ones(4, np.float32)
    with pytest.raises(RuntimeError, match="needs a direction"):
        st.set_steer(None, h, 1.0, _native.STEER_GATED)
    with pytest.raises(RuntimeError, match="needs h_q"):
        st.set_steer(np.ones(4, np.float32), None, 1.0, _native.STEER_GATED)
    with pytest.raises(RuntimeError, match="finite"):
        st.set_steer(np.ones(4, np.float32), h, float("nan"), _native.STEER_GATED)
    with pytest.raises(RuntimeError, match="needs a direction"):  # nor the direction of the refused calls
        st.set_steer(None, None, 1.0, _native.STEER_GATED)
    st.set_steer(np.ones(4, np.float32), h, 1.0, _native.STEER_GATED)
