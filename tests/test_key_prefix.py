"""Key-only passes that continue the previous prompt's rows (``runtime.key_prefix``).

A templated stream shares its instruction: ``runtime.key_pass.prompt_key`` decodes only the rows after the
deepest cut that ``key_prefix.cut`` allows, starting the key sums from the snapshot the callback
took at that row. The reference is a full pass of the same engine (``Engine.query``: every layer,
the logits, no cache): keys must be bitwise equal, for short prompts, for prompts past flash
attention's 64-row tile, across switches between the two and between key layers. The rules are
also checked against brute-force enumerations, the probe must reject looser rules, and cuts must
really happen (a cache that never cuts would pass the equality tests trivially).
"""
from __future__ import annotations

import itertools

import numpy as np
import pytest

from miita_edge.runtime import key_pass
from miita_edge.runtime import key_prefix as kp


# ---------------------------------------------------------------- the rules, without a model

def test_mark_rows_against_enumeration():
    for start, n in itertools.product(range(0, 80), range(1, 140)):
        if start >= n:
            continue
        want = [q for q in range(n) if q > start and q >= kp.MIN_ROWS and q % kp.ROW_ALIGN == 0]
        assert kp.mark_rows(start, n) == want, (start, n)


def test_cut_against_enumeration():
    rng = np.random.default_rng(0)
    for _ in range(3000):
        n = int(rng.integers(1, 200))
        common = int(rng.integers(0, n + 1))
        marks = sorted(set(rng.integers(1, 200, int(rng.integers(0, 12))).tolist()))
        cached_tiled = bool(rng.integers(0, 2))
        ok = [q for q in marks
              if q <= common and (n >= 64) == cached_tiled and n - q >= (64 if n >= 64 else 8)]
        assert kp.cut(n, common, marks, cached_tiled) == (max(ok) if ok else 0)


def test_common_prefix_counts_tokens_and_mask_flags():
    assert kp.common_prefix([1, 2, 3], [True] * 3, [1, 2, 4], [True] * 3) == 2
    assert kp.common_prefix([1, 2, 3], [False, True, True], [1, 2, 3], [True] * 3) == 0
    assert kp.common_prefix([1, 2], [True, True], [1, 2, 3], [True] * 3) == 2
    p = kp.KeyPrefix([1, 2, 3] * 10, [True] * 30, ("l_out-9",), False, {8: None, 12: None, 16: None})
    assert p.cut_for([1, 2, 3] * 5 + [9] * 15, [True] * 30, ["l_out-9"]) == 12  # common 15
    assert p.cut_for([1, 2, 3] * 5 + [9] * 15, [True] * 30, ["l_out-12"]) == 0   # other key layers


# ---------------------------------------------------------------- the native snapshots

def test_bad_marks_and_states_are_refused():
    from miita_edge import _native

    st = _native.State(8)
    st.set_key_tensors(["l_out-3"])
    with pytest.raises(Exception, match="increasing"):
        st.set_key_marks(np.array([4, 4], np.int64))
    st.set_key_marks(np.array([4, 8], np.int64))
    with pytest.raises(Exception, match="not reached"):
        st.key_marks()
    with pytest.raises(Exception, match="wrong size"):
        st.key_set(np.zeros(7), np.zeros(1, np.int64), 0)
    st.key_set(np.arange(8, dtype=np.float64), np.array([3], np.int64), 3)
    sums, rows = st.keys()
    assert np.array_equal(sums.reshape(-1), np.arange(8, dtype=np.float32)) and rows == 3


def test_marks_are_dropped_with_their_shape():
    """Marks stay until set again, until a key list of another length, or until key_reset: after
    either, no snapshot of the old shape is left to read (nor a stale 'not reached')."""
    from miita_edge import _native

    st = _native.State(8)
    st.set_key_tensors(["l_out-3"])
    st.set_key_marks(np.array([4, 8], np.int64))
    st.key_reset()
    sums, pooled, rows = st.key_marks()
    assert sums.shape == (0, 8) and pooled.shape == (0, 1) and rows.shape == (0,)
    st.set_key_marks(np.array([2], np.int64))
    st.set_key_tensors(["l_out-3", "l_out-5"])
    sums, pooled, rows = st.key_marks()
    assert sums.shape == (0, 16) and pooled.shape == (0, 2) and rows.shape == (0,)



def _texts():
    instr = "Classify the banking customer query into an intent.\nQuery: "
    queries = ["where is my new card", "I was charged twice for the same coffee",
               "my transfer to a friend has not arrived yet", "why is the exchange rate different today",
               "close my account please", "can I top up with a transfer from abroad?"]
    definition = ("Definition: In this task you are given a short product review and must decide "
                  "whether its sentiment is positive or negative. Answer with one word only, and "
                  "do not explain the answer. Reviews may be sarcastic, so read them carefully. "
                  "Positive example: Input: It works and the battery lasts all week. Output: positive. "
                  "Negative example: Input: It broke after two days and support never replied. "
                  "Output: negative. Now read the next review and answer. ")
    short = [instr + q + "\nIntent:" for q in queries]
    long = [definition + "Input: " + q + " and honestly it was " + w + "\nOutput: "
            for q, w in zip(queries, ["fine", "awful", "great", "slow", "cheap", "broken"])]
    # interleaved: short runs, long runs, a switch each way, a repeat, a prompt that extends another
    return short[:3] + long[:3] + short[3:] + [short[0]] + long[3:] + [long[0], long[0] + "really?"]


@pytest.mark.model
@pytest.mark.parametrize("layers,pooling", [((9,), ("mean",)), ((12, 9), ("last", "mean"))],
                         ids=["layer 9 mean", "v4: layer 12 last row, 9 mean"])
def test_continued_keys_are_bitwise_a_full_pass(engine, layers, pooling):
    engine.set_key_layers(layers, pooling)
    engine.reset()
    assert key_pass.key_prefix_ok(engine)
    prompts = [engine.tokenize(t) for t in _texts()]
    assert any(len(p) >= 64 for p in prompts) and any(len(p) < 64 for p in prompts)
    got, cuts = [], []
    for p in prompts:
        before = engine.key_rows_reused
        got.append(key_pass.prompt_key(engine, p, engine.key_mask(p, True)))
        cuts.append(engine.key_rows_reused - before)
    # cuts really happened: short prompts after the 13-token instruction at 12, long ones (~110
    # rows, rests kept at >= 64 rows) at 40+
    assert sum(c == 12 for c in cuts) >= 4 and sum(c >= 40 for c in cuts) >= 4, cuts
    for p, (s, n) in zip(prompts, got):
        q = engine.query(p)  # every layer and the logits, from an empty cache
        assert np.array_equal(s, q.key_sum) and np.array_equal(n, q.pooled_rows)
    engine.set_key_layers((engine.key_layer,))


@pytest.mark.model
def test_snapshot_is_the_key_of_the_first_rows(engine):
    """The state kept before row q of an n-row pass is the key of a q-row pass (same rounding side),
    summed by the callback in double: the native snapshot checked against a pass that never took one."""
    engine.set_key_layers((9,))
    engine.reset()
    toks = engine.tokenize("Classify the banking customer query into an intent.\nQuery: where is my card\nIntent:")
    mask = engine.key_mask(toks, True)
    key_pass.prompt_key(engine, toks, mask)
    states = engine.key_prefix.states
    assert sorted(states) == kp.mark_rows(0, len(toks))
    for q in (8, 16):
        sums, pooled, rows = states[q]
        engine.config.key_prefix_cache = False
        try:
            s, n = key_pass.prompt_key(engine, toks[:q], mask[:q])
        finally:
            engine.config.key_prefix_cache = True
        assert np.array_equal(sums.astype(np.float32), s) and np.array_equal(pooled, n) and rows == q - 1


@pytest.mark.model
def test_the_kept_rows_leave_no_trace(engine):
    """After a key-only pass keeps its rows, any other use of the sequence starts from empty: a
    query and a plain decode give what they give after a reset, and truncation to 0 clears too."""
    engine.set_key_layers((9,))
    t1 = engine.tokenize("Classify the banking customer query into an intent.\nQuery: where is my card\nIntent:")
    t2 = engine.tokenize("Classify the banking customer query into an intent.\nQuery: close my account\nIntent:")
    engine.reset()
    clean = engine.query(t2)
    engine.reset()
    logits = engine.decode(t1)
    engine.reset()
    for then in ("query", "decode", "truncate"):
        key_pass.prompt_key(engine, t1, engine.key_mask(t1, True))
        assert engine.key_prefix is not None and engine.n_past == 0
        if then == "query":
            got = engine.query(t2)
            assert np.array_equal(got.logits, clean.logits) and np.array_equal(got.key_sum, clean.key_sum)
        elif then == "decode":
            assert np.array_equal(engine.decode(t1), logits)
        else:
            engine.truncate(0)
            assert engine.key_prefix is None
            assert np.array_equal(engine.decode(t1), logits)
        engine.reset()


@pytest.mark.model
@pytest.mark.parametrize("rule,value", [("MIN_ROWS", 1), ("ROW_ALIGN", 1), ("FA_TILE_ROWS", 10 ** 6)])
def test_the_probe_rejects_looser_rules(engine, monkeypatch, rule, value):
    """Each rule is needed on this build: loosened, some cut of the probe's chain lands where rows
    round otherwise, the probe says so, and prompt_key falls back to whole passes."""
    engine.set_key_layers((12, 9), ("last", "mean"))
    monkeypatch.setattr(kp, rule, value)
    try:
        verdict = key_pass.probe_key_prefix(engine)
        if verdict and rule == "ROW_ALIGN":
            # seen on an AVX-512 Xeon (the rule was found on AVX2 EPYCs): there the probe, which every
            # engine runs before it reuses a prefix, finds cuts off the 4-row grid reproduce whole
            # passes bitwise, so the rule is not needed on this CPU and cannot be shown needed
            pytest.skip("on this CPU cuts off the 4-row grid match whole passes (the probe checked)")
        assert verdict is False
    finally:
        engine.set_key_layers((engine.key_layer,))


@pytest.mark.model
def test_a_failed_probe_means_whole_passes(engine):
    was = key_pass.set_key_prefix_ok(engine, False)
    try:
        engine.set_key_layers((9,))
        engine.reset()
        before = engine.key_rows_reused
        for t in _texts()[:3]:
            toks = engine.tokenize(t)
            key_pass.prompt_key(engine, toks, engine.key_mask(toks, True))
        assert engine.key_rows_reused == before and engine.key_prefix is None
    finally:
        assert key_pass.set_key_prefix_ok(engine, was) is False


@pytest.mark.model
def test_ingest_is_the_same_with_and_without_the_cache(engine, tmp_path):
    """A whole default-preset ingest (keys, anchors, budget repair) stores the same arrays. Keys are
    pooled here from the memory's own prompt (``key_prompt = "folded"``), whose template prefix the
    inputs share: the default's meaning prompt shares only its first few tokens, fewer than a kept
    row needs (``MIN_ROWS``), so it never reuses rows (checked below)."""
    from miita_edge.method.presets import default_preset
    from miita_edge.miita import Miita
    from miita_edge.streams import Example

    preset = default_preset()
    preset.key_prompt = "folded"
    preset.validate_keys()

    qs = ["where is my new card", "I was charged twice", "my transfer has not arrived",
          "why is the exchange rate different", "close my account", "top up from abroad",
          "my card was declined", "where is my new card"]
    ys = ["card arrival", "double charge", "transfer pending", "exchange rate", "close account",
          "top up", "declined", "card arrival"]
    banks = []
    for on in (True, False):
        engine.config.key_prefix_cache = on
        try:
            m = Miita(engine=engine, memory=str(tmp_path / f"mem-{on}"), template="banking77", preset=preset)
            before = engine.key_rows_reused
            m.ingest([Example(x, y, i + 1) for i, (x, y) in enumerate(zip(qs, ys))], budget="4KiB", progress=False)
            reused = engine.key_rows_reused - before
            banks.append([(p.dirs, p.tokens, p.anchors, p.anchor_n) for p in m.bank.protos])
        finally:
            engine.config.key_prefix_cache = True
        assert (reused > 0) == on
    assert len(banks[0]) == len(banks[1]) > 0
    for a, b in zip(*banks):
        assert all(np.array_equal(x, y) for x, y in zip(a, b))
    m = Miita(engine=engine, memory=str(tmp_path / "mem-meaning"), template="banking77")
    assert m.preset.key_prompt == "meaning"
    before = engine.key_rows_reused
    m.ingest([Example(x, y, i + 1) for i, (x, y) in enumerate(zip(qs, ys))], budget="4KiB", progress=False)
    assert engine.key_rows_reused == before
    engine.set_key_layers((engine.key_layer,))
