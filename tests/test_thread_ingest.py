"""Keys extracted on sibling contexts, one Python thread each (``method.thread_ingest``).

References: one-context batched extraction of the same shards (bitwise: a shard's decodes do not
depend on which context or thread ran them), one-prompt-per-decode ``extract`` (within the batched
keys' stated rounding), and a memory ingested through one context.
"""
from __future__ import annotations

import numpy as np
import pytest

from miita_edge.runtime import key_pass

from miita_edge.runtime import contexts as runtime_contexts

pytestmark = pytest.mark.model

ROWS = [(f"{w} question number {i} about my card and the transfer", f"answer {i % 5}")
        for i, w in enumerate(["why", "where", "how", "when", "what", "who", "can", "should", "is", "does"] * 4)]
ROWS[3] = ("", "empty input, still a prompt")


@pytest.fixture(scope="module")
def engine():
    from miita_edge.runtime.engine import Engine, EngineConfig

    eng = Engine(None, EngineConfig(n_ctx=1024, n_batch=512, n_threads=2))
    eng.set_key_layers([12, 9])
    yield eng
    eng.close()


@pytest.fixture(scope="module")
def template():
    from miita_edge.method.templates import get_template

    return get_template("plain")


def _threaded(engine, template, rows, contexts, shard=8):
    from miita_edge.method.thread_ingest import ThreadExtractor
    from miita_edge.streams import Example

    te = ThreadExtractor(engine, template, skip_bos=True, contexts=contexts, shard=shard)
    return list(te([Example(x, y, line=i + 1) for i, (x, y) in enumerate(rows)]))


def test_keys_do_not_depend_on_the_contexts_that_ran_them(engine, template):
    """Bitwise: 3 contexts, 2 contexts, and one context extracting the same shards in turn."""
    from miita_edge.method.extract import extract_keys
    from miita_edge.method.thread_ingest import KEY_SEQS_PER_DECODE

    one = runtime_contexts.siblings(engine, 1, 2, KEY_SEQS_PER_DECODE)[0]  # two threads, same sequences per decode
    ref = [e for i in range(0, len(ROWS), 8) for e in extract_keys(one, template, ROWS[i:i + 8], skip_bos=True)]
    for contexts in (3, 2):
        got = _threaded(engine, template, ROWS, contexts)
        assert len(got) == len(ROWS)
        for g, r in zip(got, ref):
            assert g.prompt == r.prompt and g.target == r.target
            assert np.array_equal(g.key, r.key)


def test_keys_match_one_prompt_per_decode_within_rounding(engine, template):
    """The batched keys' tolerance (docs/benchmarks.md): cosine > 0.9999 for prompts of 8 tokens
    or more, > 0.999 for shorter ones (the 4-token empty-input prompt: 0.99962, a mean of 3 rows
    through two key layers), no coordinate off by more than 2% of the key's largest."""
    from miita_edge.method.extract import extract

    got = _threaded(engine, template, ROWS, 2)
    for (x, y), g in zip(ROWS, got):
        r = extract(engine, template, x, y, skip_bos=True, corrections=False)
        assert g.prompt == r.prompt and g.target == r.target
        cos = float(g.key @ r.key / np.linalg.norm(g.key) / np.linalg.norm(r.key))
        assert cos > (0.9999 if len(r.prompt) >= 8 else 0.999), (len(r.prompt), cos)
        assert np.abs(g.key - r.key).max() <= 2e-2 * np.abs(r.key).max()


def test_siblings_share_the_model_and_close_with_it():
    from miita_edge.runtime.engine import Engine, EngineConfig

    eng = Engine(None, EngineConfig(n_ctx=512, n_batch=256, n_threads=2))
    a, b = runtime_contexts.siblings(eng, 2, 1, 4)
    assert a is not b and a.owner is b.owner is eng and a.config.n_threads == 1 and a.config.n_seq_max == 4
    assert runtime_contexts.siblings(eng, 2, 1, 4) == [a, b]  # kept, not made again
    assert runtime_contexts.sibling(eng, 1, 4).owner is eng
    a.close()  # a sibling frees its context only: the engine and the other sibling still decode
    assert a not in eng.siblings
    k1 = key_pass.prompt_key(b, eng.tokenize("where is my card"), [False] + [True] * 4)
    k2 = key_pass.prompt_key(eng, eng.tokenize("where is my card"), [False] + [True] * 4)
    assert np.array_equal(k1[0], k2[0]) and k1[1] == k2[1] == 4  # one prompt per decode: bitwise
    eng.close()
    assert b.closed and not eng.siblings


def test_memory_through_contexts_equals_one_context_and_errors_lose_nothing(engine, tmp_path, monkeypatch):
    """key_contexts 2 and 3 give the same committed arrays (bitwise); against one context the same
    answers and anchors. A failing shard raises in the caller and commits nothing."""
    from miita_edge.miita import Miita
    from miita_edge.streams import Example

    import miita_edge.method.key_extractors as kx
    from miita_edge.method.key_extractors import KeyOptions

    exs = [Example(x, y, line=i + 1) for i, (x, y) in enumerate(ROWS)]
    made = []  # the threaded extractors the ingests chose

    def recorded(*a, **k):
        made.append(kx_thread(*a, **k))
        return made[-1]

    kx_thread = kx.ThreadExtractor
    monkeypatch.setattr(kx, "ThreadExtractor", recorded)

    def ingest(contexts, name):
        m = Miita(engine=engine, memory=tmp_path / name, template="plain", keys=KeyOptions(contexts=contexts))
        m.ingest(exs, budget="none", progress=False)
        return m, m.bank.to_arrays()

    m2, a2 = ingest(2, "two")
    _, a3 = ingest(3, "three")
    m1, a1 = ingest(1, "one")
    assert [e.contexts for e in made] == [2, 3]  # one context: the engine's own, no threads
    assert a2.keys() == a3.keys() == a1.keys()
    for k in a2:
        assert np.array_equal(a2[k], a3[k]), k
    assert m1.bank.n_prototypes == m2.bank.n_prototypes and m1.bank.n_anchors == m2.bank.n_anchors

    import miita_edge.method.thread_ingest as ti

    calls = {"n": 0}
    real = ti.extract_keys

    def flaky(*a, **k):
        calls["n"] += 1
        if calls["n"] == 3:
            raise RuntimeError("decode failed on the third shard")
        return real(*a, **k)

    monkeypatch.setattr(ti, "extract_keys", flaky)
    monkeypatch.setattr(kx, "ThreadExtractor", lambda *a, **k: kx_thread(*a, **k, shard=8))
    # 5 shards: the third fails while others are decoding or written
    before = m2.version
    with pytest.raises(RuntimeError, match="third shard"):
        m2.ingest(exs, budget="none", progress=False)
    assert m2.version == before and Miita(engine=engine, memory=tmp_path / "two").examples == len(exs)
    monkeypatch.setattr(ti, "extract_keys", real)
    m2.ingest(exs[:5], budget="none", progress=False)  # the contexts still work after a failure
    assert m2.examples == len(exs) + 5


def test_only_one_prompt_per_decode_keeps_verbatim_inputs_exact_repeats(engine, tmp_path):
    """Why --contexts defaults to 1: with the model's reading off (``read_reach`` 0), answers taught
    once steer only within their radius or on an exact repeat (cosine 1 between sign vectors,
    method/relevance.py). A one-by-one key is bitwise
    the key the same prompt gets at ask time, so every verbatim training input is steered; a
    batched key is within rounding of it, enough to flip sign bits, so the repeat is not exact."""
    from miita_edge.miita import KeyOptions, Miita
    from miita_edge.method.presets import default_preset
    from miita_edge.streams import Example

    rows = [Example(x, f"unique answer {i}", line=i + 1) for i, (x, _) in enumerate(ROWS[10:18])]
    repeat_only = default_preset()
    repeat_only.single_reach = "repeat"
    repeat_only.read_reach = 0.0  # the reading would confirm a verbatim input whatever its key
    steered = {}
    for reach, preset in (("repeat", repeat_only), ("default", default_preset())):
        for contexts in (1, 2):
            m = Miita(engine=engine, memory=tmp_path / f"{reach}-c{contexts}", template="plain", preset=preset,
                      keys=KeyOptions(contexts=contexts))
            m.ingest(rows, budget="none", progress=False)
            steered[reach, contexts] = sum(m.ask(r.input, max_tokens=2).adapted for r in rows)
    assert steered["repeat", 1] == len(rows)
    assert steered["repeat", 2] < len(rows)
    assert steered["default", 1] == steered["default", 2] == len(rows)
