"""Per-layer key pooling (default preset v4): a key layer pooled at its last selected row.

The reference for a last-row block is independent of the pooling code: the same engine pooling by
the mean over a mask that selects only the last prompt row (one row summed in double and divided
by one is that row, bitwise), and l_out rows read by a plain Python eval callback (within llama.cpp's
rounding). Memories built with earlier versions of the default keep mean pooling.
"""
from __future__ import annotations

import numpy as np
import pytest

from miita_edge.runtime import key_pass

from miita_edge.errors import InputError, StoreError
from miita_edge.method.presets import Preset, default_preset, get_preset, paper_preset, preset_version
from miita_edge.runtime.key_pooling import key_mean

PROMPTS = ["where is my new card", "I was charged twice for the same coffee",
           "the card payment was declined again " * 20]  # the last spans two ubatches (n_batch 256)


def _mask(engine, toks):
    m = [True] * len(toks)
    if toks[0] == engine.bos and len(toks) > 1:
        m[0] = False
    return m


def _last_only(mask):
    last = max(i for i, keep in enumerate(mask) if keep)
    return [i == last for i in range(len(mask))]


# ------------------------------------------------------------------ pure
def test_key_mean_divides_each_block_by_its_own_count():
    rng = np.random.default_rng(0)
    s = rng.normal(size=12).astype(np.float32)
    got = key_mean(s, np.array([1, 4, 0]))
    ref = np.concatenate([s[:4] / np.float32(1), s[4:8] / np.float32(4), s[8:] / np.float32(1)])
    assert got.dtype == np.float32 and np.array_equal(got, ref)
    assert np.array_equal(key_mean(s, 3), s / 3)  # one shared count: what every caller did before
    assert np.array_equal(key_mean(s, np.array([3, 3, 3])), s / 3)


def test_presets_pool_as_their_version_says():
    assert default_preset().version == 22 and default_preset().key_pooling == ("last", "mean")
    assert default_preset().key_poolings(18) == ["last", "mean"]
    for old in ({"name": "default", "version": 3}, {"name": "default", "version": 2}, {"name": "default"}):
        p = Preset.from_json(old)
        assert p.key_pooling == () and set(p.key_poolings(18)) == {"mean"}
    assert paper_preset().key_poolings(18) == ["mean"]
    assert preset_version("default", 3).key_poolings(18) == ["mean", "mean"]
    again = Preset.from_json(default_preset().to_json())
    assert again.key_pooling == ("last", "mean") and again.version == 22
    # a shallow model whose two depths round to one layer keeps the first depth's pooling
    assert default_preset().key_layers(2) == [0] and default_preset().key_poolings(2) == ["last"]
    for bad in (["max", "mean"], ["last"], "last"):
        with pytest.raises(StoreError, match="key_pooling"):
            Preset.from_json({"name": "default", "version": 4, "key_pooling": bad})


def test_an_earlier_version_by_number_but_users_select_only_the_current_ones():
    """``preset_version("default", 3)`` builds a memory as version 3 did (the benches reproduce old
    memories); a user selects only ``default`` and ``paper``, at their current versions."""
    from miita_edge.method.presets import preset_names, preset_version

    assert preset_version("default", 3).version == 3 and preset_version("default", 3).key_pooling == ()
    assert preset_version("default", 3).bank.anchor_fold == "ward"
    assert get_preset("default").version == 22 and preset_version("default", 4).key_pooling == ("last", "mean")
    assert preset_version("paper", 1).name == "paper" and get_preset("paper").name == "paper"
    assert preset_names() == ["paper", "default"]
    for bad in ("default/3", "default/4", "default/5", "paper/1", "paper/2", "default/10", "default/11", "default/12", "default/13", "default/x", "nope", "nope/1", "default/"):
        with pytest.raises(InputError, match="unknown preset"):
            get_preset(bad)
    for name, version in (("default", 23), ("paper", 3), ("nope", 1)):
        with pytest.raises(InputError, match="unknown preset"):
            preset_version(name, version)


# ------------------------------------------------------------------ model
@pytest.mark.model
def test_a_last_row_block_is_the_mean_over_a_last_row_mask(engine):
    """Layers 12 (last row) and 9 (mean) in one pass, against two mean-pooled passes: one over the
    last row alone (bitwise the last row) and one over every row; prompts of one and two ubatches."""
    old = engine.key_layers, engine.key_pooling
    try:
        for text in PROMPTS:
            toks = engine.tokenize(text)
            mask = _mask(engine, toks)
            engine.set_key_layers([12, 9], ("last", "mean"))
            q = engine.query(toks)
            s, n = key_pass.prompt_key(engine, toks, mask)
            assert list(n) == [1, sum(mask)] and list(q.pooled_rows) == [1, sum(mask)]
            assert q.key_rows == sum(mask)
            engine.set_key_layers([12, 9])
            ref_last = engine.query(toks[:], skip_bos_in_key=True)  # mean of every row, both layers
            s_last, n_last = key_pass.prompt_key(engine, toks, _last_only(mask))
            assert list(n_last) == [1, 1]
            assert np.array_equal(q.keys[0], key_mean(s_last, n_last).reshape(2, -1)[0])
            assert np.array_equal(q.keys[1], ref_last.keys[1])
            assert np.array_equal(key_mean(s, n), q.key)  # the key-only pass agrees bitwise
            assert not np.allclose(q.keys[0], ref_last.keys[0])  # the pooling did change the block
    finally:
        engine.set_key_layers(*old)


@pytest.mark.model
def test_last_row_pooling_against_rows_read_by_a_python_callback(model_path):
    """The rows themselves from an independent decode (tests/test_engine.py's reference), and the
    last row kept across ubatches (n_batch 4) and across decode calls (token by token)."""
    from miita_edge.runtime.engine import Engine, EngineConfig
    from test_engine import PROMPT, _reference_layer_rows

    with Engine(model_path, EngineConfig(n_ctx=256)) as eng:
        toks = eng.tokenize(PROMPT)
        eng.set_key_layers([12, 9, 3], ("last", "mean", "last"))
        q = eng.query(toks)
        rows = {k: _reference_layer_rows(model_path, toks, k) for k in (12, 9, 3)}
        refs = [rows[12][-1], rows[9][1:].mean(axis=0), rows[3][-1]]
        for block, ref in zip(q.keys, refs):
            np.testing.assert_allclose(block, ref, rtol=1e-4, atol=1e-3 * np.abs(ref).max())
        # token by token (one decode call per row; llama.cpp rounds a one-row batch its own way, so
        # the reference is the same decode pooling by the mean over the last row alone)
        def by_token(mask):
            eng.reset()
            for t, m in zip(toks, mask):
                eng.decode([t], "last", key_mask=[m])
            return eng.key_sum()

        s, n = by_token(_mask(eng, toks))
        assert list(n) == [1, len(toks) - 1, 1]
        eng.set_key_layers([12, 9, 3])
        s_ref, n_ref = by_token(_last_only(_mask(eng, toks)))
        assert list(n_ref) == [1, 1, 1]
        got, want = key_mean(s, n).reshape(3, -1), key_mean(s_ref, n_ref).reshape(3, -1)
        assert np.array_equal(got[[0, 2]], want[[0, 2]])
    # several ubatches per decode (n_batch 4): the last row is the last ubatch's; a single row moves
    # with llama.cpp's batch shapes (~2% at layer 12, where a mean of rows moved < 1e-4), so again
    # the reference is the same engine over a last-row mask
    with Engine(model_path, EngineConfig(n_ctx=256, n_batch=4)) as eng:
        eng.set_key_layers([12, 9, 3], ("last", "mean", "last"))
        q4 = eng.query(toks)
        mask = _mask(eng, toks)
        eng.set_key_layers([12, 9, 3])
        s_ref, n_ref = key_pass.prompt_key(eng, toks, _last_only(mask))
        want = key_mean(s_ref, n_ref).reshape(3, -1)
        assert np.array_equal(q4.keys[[0, 2]], want[[0, 2]])
        assert np.linalg.norm(q4.keys[1] - refs[1]) <= 1e-2 * np.linalg.norm(refs[1])
        with pytest.raises(ValueError, match="pooling"):
            eng.set_key_layers([12, 9], ("last",))
        with pytest.raises(ValueError, match="pooling"):
            eng.set_key_layers([12, 9], ("max", "mean"))
        with pytest.raises(Exception, match="one entry per key tensor"):
            eng.native.set_key_pooling([True])


@pytest.mark.model
def test_keys_of_several_prompts_per_decode_pool_each_sequence_last_row(model_path):
    """Group mode (several prompts per llama_decode) keeps each sequence's own last row: bitwise the
    single path with one prompt per decode, within rounding when prompts share a decode."""
    from miita_edge.runtime.engine import Engine, EngineConfig

    with Engine(model_path, EngineConfig(n_ctx=1024, n_batch=256, n_seq_max=8)) as eng:
        eng.set_key_layers([12, 9], ("last", "mean"))
        toks = [eng.tokenize(t) for t in PROMPTS[:2] + ["close my account please", "hi"]]
        masks = [_mask(eng, t) for t in toks]
        ref = [key_pass.prompt_key(eng, t, m) for t, m in zip(toks, masks)]
        got = key_pass.prompt_keys(eng, toks, masks)
        for (s, n), (rs, rn) in zip(got, ref):
            assert list(n) == list(rn) == [1, n[1]]
            # a single row moves more with batch shapes than a mean of rows (measured: cos 0.99987)
            for a, b, floor in zip(key_mean(s, n).reshape(2, -1), key_mean(rs, rn).reshape(2, -1), (0.999, 0.9999)):
                assert float(a @ b / np.linalg.norm(a) / np.linalg.norm(b)) > floor
        eng.config.n_seq_max = 1
        for (s, n), (rs, rn) in zip(key_pass.prompt_keys(eng, toks, masks), ref):
            assert np.array_equal(key_mean(s, n), key_mean(rs, rn))


@pytest.mark.model
def test_memories_keep_the_pooling_they_were_built_with(engine, tmp_path):
    """A memory built with version 3 of the default answers from mean-pooled keys after it is
    reopened by this version; a version 4 memory from the last row; each stored key is the key its
    prompt gets at ask time (the exact-repeat rule needs that)."""
    from miita_edge.miita import Miita
    from miita_edge.streams import Example

    rows = [Example("where is my new card", "card arrival", line=1),
            Example("I was charged twice for the same coffee", "double charge", line=2)]
    old = engine.key_layers, engine.key_pooling
    try:
        for preset, version, want in ((preset_version("default", 3), 3, ("mean", "mean")), ("default", 22, ("last", "mean")),
                                      (default_preset(), 22, ("last", "mean"))):
            d = tmp_path / f"v{version}-{isinstance(preset, str)}"
            with Miita(engine=engine, memory=d, preset=preset, template="plain") as m:
                m.ingest(rows, budget="none", progress=False)
            with Miita(engine=engine, memory=d, preset="default", template="plain") as m:
                assert m.preset.version == version and tuple(m.key_pooling) == want
                a = m.ask(rows[0].input, max_tokens=3)
                assert engine.key_pooling == want
                assert a.adapted
    finally:
        engine.set_key_layers(*old)
