"""Key-only passes stop the graph after the deepest key layer (``runtime.key_pass.prompt_key``).

The rows a key sums are computed before the stop exactly as in a full pass, so the reference is a
full pass of the same engine (``Engine.query``, which computes every layer and the logits):
bitwise equality. The stop must really happen (the callback counts graphs it ended early), must
not happen while capture or steering needs result_norm, and must leave no trace in the sequence.
"""
from __future__ import annotations

import numpy as np
import pytest

from miita_edge.runtime import key_pass

from miita_edge.runtime.key_pooling import key_mean

pytestmark = pytest.mark.model

PROMPTS = ["where is my new card", "I was charged twice for the same coffee",
           "the card payment was declined again " * 20]  # the last one spans two ubatches (n_batch 256)


def _mask(engine, toks):
    m = [True] * len(toks)
    if toks[0] == engine.bos and len(toks) > 1:
        m[0] = False
    return m


@pytest.fixture(params=[([9], None), ([12, 9], None), ([12, 9], ("last", "mean"))],
                ids=["one key layer", "layers 12 and 9", "layer 12 last row, 9 mean"])
def layers(request, engine):
    old = engine.key_layers, engine.key_pooling
    engine.set_key_layers(*request.param)
    yield request.param
    engine.set_key_layers(*old)


def test_a_key_only_pass_is_bitwise_the_full_pass(engine, layers):
    for text in PROMPTS:
        toks = engine.tokenize(text)
        full = engine.query(toks, skip_bos_in_key=True)
        stops0 = engine.native.hits(2)
        s, n = key_pass.prompt_key(engine, toks, _mask(engine, toks))
        stopped = engine.native.hits(2) - stops0
        assert stopped == (len(toks) + engine.config.n_batch - 1) // engine.config.n_batch  # one per ubatch
        assert list(n) == list(full.pooled_rows)
        assert np.array_equal(key_mean(s, n), full.key)


def test_the_full_depth_when_asked(engine, layers):
    toks = engine.tokenize(PROMPTS[0])
    engine.config.keys_stop_early = False
    try:
        stops0 = engine.native.hits(2)
        s, n = key_pass.prompt_key(engine, toks, _mask(engine, toks))
        assert engine.native.hits(2) == stops0
    finally:
        engine.config.keys_stop_early = True
    s2, n2 = key_pass.prompt_key(engine, toks, _mask(engine, toks))
    assert list(n) == list(n2) and np.array_equal(s, s2)


def test_the_sequence_is_clean_after_a_key_only_pass(engine):
    """A key-only pass leaves the deeper layers' KV cache unwritten; what follows must not see it."""
    toks = engine.tokenize(PROMPTS[1])
    engine.reset()
    ref = engine.query(toks)
    key_pass.prompt_key(engine, toks, _mask(engine, toks))
    assert engine.n_past == 0
    got = engine.query(toks)
    assert np.array_equal(got.logits, ref.logits) and np.array_equal(got.h_q, ref.h_q)
    a = engine.generate(got, max_tokens=6)
    engine.reset()
    b = engine.generate(engine.query(toks), max_tokens=6)
    assert a.tokens == b.tokens


def test_capture_or_steering_keep_the_full_graph(engine):
    """With result_norm wanted (capture, or a steering direction), the stop flag does nothing."""
    toks = engine.tokenize(PROMPTS[0])
    st = engine.native
    st.set_stop_after_keys(True)
    try:
        engine.reset()
        st.set_capture(True, 1)
        stops0, norm0 = st.hits(2), st.hits(1)
        engine.decode(toks, "last", key_mask=_mask(engine, toks))
        assert st.hits(2) == stops0 and st.hits(1) > norm0
        assert st.captured().shape[0] == 1
        st.set_capture(False, 0)
        engine.reset()
        d = np.random.default_rng(0).standard_normal(engine.n_embd).astype(np.float32)
        engine.set_steer(d, d, 1.0, "ungated")
        stops0 = st.hits(2)
        engine.decode(toks, "last", key_mask=_mask(engine, toks))
        assert st.hits(2) == stops0
    finally:
        st.set_stop_after_keys(False)
        engine.reset()
