"""The lossless Q8_0 twin (``runtime.key_twin``) and the fast ingest that uses it.

References: gguf-py's own dequantisers (independent of our re-encoding) for "the same weights"
(block by block: tests/test_q8_twin.py);
one-prompt-per-decode extraction on the original model for the fast keys' tolerance (the batched
keys' stated bound, tests/test_batched_keys.py).
"""
from __future__ import annotations


import numpy as np
import pytest

from miita_edge.runtime import key_pass

from miita_edge.runtime import contexts as runtime_contexts


def _random_q5_0(n_blocks: int, rng) -> np.ndarray:
    d = rng.uniform(-2, 2, n_blocks).astype(np.float16)  # any finite scale, either sign
    qh = rng.integers(0, 2**32, n_blocks, dtype=np.uint64).astype("<u4")
    qs = rng.integers(0, 256, (n_blocks, 16), dtype=np.uint8)
    return np.concatenate([d.view(np.uint8).reshape(-1, 2), qh.view(np.uint8).reshape(-1, 4), qs], axis=1)


def _tiny_gguf(path, q5: bool) -> None:
    import gguf

    w = gguf.GGUFWriter(str(path), "llama")
    w.add_key_value("general.name", "tiny", gguf.GGUFValueType.STRING)
    w.add_tensor("a.weight", np.arange(64, dtype=np.float32).reshape(2, 32))
    if q5:
        raw = _random_q5_0(4, np.random.default_rng(1)).reshape(2, 2 * 22)  # 2 rows of 64 weights
        w.add_tensor("b.weight", raw, raw_dtype=gguf.GGMLQuantizationType.Q5_0)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()


def test_the_twin_is_written_once_and_only_complete(tmp_path, monkeypatch):
    import gguf
    from gguf.quants import dequantize

    import miita_edge.runtime.key_twin as kt

    src = tmp_path / "tiny.gguf"
    _tiny_gguf(src, q5=True)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))  # the sha256 cache, kept out of ~
    out = tmp_path / "twins"
    p = kt.q8_twin_path(src, out, quiet=True)
    assert p is not None and p.parent == out and p.name.endswith("-q8_0.gguf")
    r0, r1 = gguf.GGUFReader(str(src)), gguf.GGUFReader(str(p))
    t0, t1 = {t.name: t for t in r0.tensors}, {t.name: t for t in r1.tensors}
    assert t1["b.weight"].tensor_type == gguf.GGMLQuantizationType.Q8_0
    assert np.array_equal(dequantize(np.asarray(t0["b.weight"].data), gguf.GGMLQuantizationType.Q5_0),
                          dequantize(np.asarray(t1["b.weight"].data), gguf.GGMLQuantizationType.Q8_0))
    assert np.array_equal(np.asarray(t0["a.weight"].data), np.asarray(t1["a.weight"].data))
    assert bytes(r1.fields["general.name"].parts[-1]) == b"tiny"
    mtime = p.stat().st_mtime_ns
    assert kt.q8_twin_path(src, out, quiet=True) == p and p.stat().st_mtime_ns == mtime  # reused
    assert sorted(x.name for x in out.iterdir()) == [p.name]  # no temporary file left

    # a crash while writing leaves no twin, and the next call writes it whole
    calls = []

    def boom(a, b, layers=None):
        calls.append(b)
        with open(b, "wb") as fh:
            fh.write(b"GGUF half")
        raise KeyboardInterrupt

    out2 = tmp_path / "twins2"
    monkeypatch.setattr(kt, "write_q8_twin", boom)
    with pytest.raises(KeyboardInterrupt):
        kt.q8_twin_path(src, out2, quiet=True)
    assert calls and list(out2.iterdir()) == []
    monkeypatch.undo()
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    assert kt.q8_twin_path(src, out2, quiet=True).stat().st_size == p.stat().st_size

    def denied(a, b, layers=None):
        raise PermissionError(13, "Permission denied")

    monkeypatch.setattr(kt, "write_q8_twin", denied)
    from miita_edge.errors import ModelError

    with pytest.raises(ModelError, match="cannot write the Q8_0 twin of tiny.gguf to .*Permission denied"):
        kt.q8_twin_path(src, tmp_path / "twins3", quiet=True)
    assert list((tmp_path / "twins3").iterdir()) == []
    monkeypatch.undo()
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))

    plain = tmp_path / "plain.gguf"
    _tiny_gguf(plain, q5=False)
    assert kt.q8_twin_path(plain, out, quiet=True) is None  # nothing to re-encode: no twin
    assert kt.q8_twin_path(plain, out, quiet=True) is None  # (the answer remembered)
    assert not any(x.name.endswith(".gguf") and x != p for x in out.iterdir())


@pytest.fixture(scope="module")
def twin_cache(tmp_path_factory):
    """The user cache directory of this module's tests: the twin of the bundled model is written
    there once (~15 s, ~260 MB) and removed with it."""
    d = tmp_path_factory.mktemp("cache")
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("XDG_CACHE_HOME", str(d))
        yield d


@pytest.mark.model
def test_the_twin_of_the_bundled_model_holds_the_same_weights(twin_cache):
    import gguf
    from gguf.quants import dequantize

    from miita_edge.runtime.default_model import resolve_model_path
    from miita_edge.runtime.key_twin import q8_twin_path

    src = resolve_model_path()
    p = q8_twin_path(src, quiet=True)
    assert p is not None and str(p).startswith(str(twin_cache))
    r0, r1 = gguf.GGUFReader(str(src)), gguf.GGUFReader(str(p))
    assert [t.name for t in r0.tensors] == [t.name for t in r1.tensors]
    f0 = {f.name: [bytes(x) for x in f.parts] for f in r0.fields.values() if not f.name.startswith("GGUF.")}
    f1 = {f.name: [bytes(x) for x in f.parts] for f in r1.fields.values() if not f.name.startswith("GGUF.")}
    assert f0 == f1
    Q5, Q8 = gguf.GGMLQuantizationType.Q5_0, gguf.GGMLQuantizationType.Q8_0
    n5 = 0
    for a, b in zip(r0.tensors, r1.tensors):
        assert list(a.shape) == list(b.shape), a.name
        if a.tensor_type == Q5:
            n5 += 1
            assert b.tensor_type == Q8, a.name
            if a.name.startswith(("blk.0.", "blk.9.", "blk.12.")):  # dequantised: the same numbers
                assert np.array_equal(dequantize(np.asarray(a.data), Q5), dequantize(np.asarray(b.data), Q8)), a.name
        else:
            assert b.tensor_type == a.tensor_type and np.array_equal(np.asarray(a.data), np.asarray(b.data)), a.name
    assert n5 > 0


@pytest.mark.model
def test_fast_ingest_keys_stay_within_the_batched_tolerance(twin_cache, tmp_path):
    """``KeyOptions(fast=True)``: keys from the twin on two contexts, against one prompt per decode on
    the original model, in stored form (sign bits of the centred key): the batched keys' bound (at
    most 10% of the bits, nearer its own input than any other), the memory's fingerprint the
    original model's, and a memory built that way answers."""
    from miita_edge.demo.run import demo_stream
    from miita_edge.method.ingest import extract_examples
    from miita_edge.method.key_extractors import KeyOptions, choose_extractor
    from miita_edge.miita import Miita
    from miita_edge.runtime.engine import Engine, EngineConfig

    train, test = demo_stream()
    rows = train[:48]
    with Engine(None, EngineConfig(n_threads=2)) as eng:
        fast = Miita(engine=eng, memory=str(tmp_path / "fast"), template="plain", keys=KeyOptions(fast=True))
        fast.ingest(rows, budget="none", progress=False)
        twin = runtime_contexts.q8_twin(eng)
        assert twin is not None and twin.info.path != eng.info.path
        extractor = choose_extractor(fast.keyed_engine(), fast.template, fast.preset, fast.keys)
        assert extractor.engine is twin and extractor.contexts == 2
        assert fast.fingerprint()["sha256"] == Miita(engine=eng, memory=str(tmp_path / "x"),
                                                     template="plain").fingerprint()["sha256"]
        got = list(extractor(rows))
        one = extract_examples(fast.keyed_engine(), fast.template, fast.preset, rows)
        S = np.array([np.signbit(fast.bank.prepare_key(e.key)) for e in one])
        B = np.array([np.signbit(fast.bank.prepare_key(e.key)) for e in got])
        width = S.shape[1]
        for k in range(len(rows)):
            d = (S != B[k]).sum(1)
            assert d[k] <= 0.10 * width, (k, d[k])
            assert d[k] < np.delete(d, k).min(), (k, d)
        assert (S != B).any()  # batched: not bitwise, which is why it is opt-in
        ans = fast.ask(test[0].input, max_tokens=4)
        assert ans.text is not None
    assert twin.closed  # closed with its engine


@pytest.mark.model
def test_cli_fast_keys(twin_cache, tmp_path, capsys):
    """``miita-edge ingest --fast-keys``: ingests (the twin found in the cache the tests above
    wrote) and the memory answers; refused for a preset that computes corrections at ingest,
    before anything is written."""
    import json

    from miita_edge.cli import main

    data = tmp_path / "rows.jsonl"
    data.write_text("".join(json.dumps({"input": f"question {i} about topic {i % 3}", "output": f"answer {i % 3}"})
                            + "\n" for i in range(12)))
    mem = tmp_path / "mem"
    rc = main(["ingest", str(data), "--memory", str(mem), "--fast-keys", "--json", "--threads", "2"])
    out = capsys.readouterr().out.strip().splitlines()[-1]
    assert rc == 0 and json.loads(out)["examples"] == 12
    assert main(["ask", "question 1 about topic 1", "--memory", str(mem), "--threads", "2"]) == 0
    bad = tmp_path / "paper"
    rc = main(["ingest", str(data), "--memory", str(bad), "--preset", "paper", "--fast-keys", "--threads", "2"])
    err = capsys.readouterr().err
    assert rc != 0 and "--fast-keys" in err and "paper" in err
    assert not bad.exists()


def test_output_rows_are_checked():
    from miita_edge import _native

    st = _native.State(8)
    with pytest.raises(Exception, match="increasing"):
        st.set_output_rows(np.array([3, 1], np.int64))
    with pytest.raises(Exception, match="increasing"):
        st.set_output_rows(np.array([-1], np.int64))
    st.set_output_rows(np.array([0, 5, 9], np.int64))
    st.set_output_rows(np.zeros(0, np.int64))


@pytest.mark.model
def test_the_cut_twin_keeps_the_keys(twin_cache):
    """The twin cut after layer 12 (version 4's deepest key layer, last-row pooled): one prompt per
    decode, its layer-9 block (every row, a layer the cut leaves whole) is bitwise the original
    model's, and its layer-12 block (the prompt's last row, the only one the cut layer computes)
    equal within rounding, for short prompts, a prompt longer than n_batch (decoded in chunks,
    the output row in the last) and a prompt whose last token is masked out; the cut model
    computes keys only."""
    from miita_edge.errors import ModelError
    from miita_edge.runtime.engine import Engine, EngineConfig

    with Engine(None, EngineConfig(n_threads=2, n_batch=64)) as eng:
        eng.set_key_layers([12, 9], ["last", "mean"])
        twin = runtime_contexts.q8_twin(eng)
        assert twin.n_layer == 13 and twin.keys_on_output_rows and twin.config.key_cut
        texts = ["where is my new card", "I was charged twice for the same coffee at the station",
                 "why " * 150]  # the last: 150+ tokens, three chunks of 64
        for text in texts:
            toks = eng.tokenize(text)
            for mask in ([False] + [True] * (len(toks) - 1), [False] + [True] * (len(toks) - 2) + [False]):
                a_sum, a_rows = key_pass.prompt_key(eng, toks, mask)
                b_sum, b_rows = key_pass.prompt_key(twin, toks, mask)
                assert list(a_rows) == list(b_rows) == [1, sum(mask)]
                a, b = a_sum.reshape(2, -1), b_sum.reshape(2, -1)
                assert np.array_equal(a[1], b[1]), text
                cos = float(a[0] @ b[0] / np.linalg.norm(a[0]) / np.linalg.norm(b[0]))
                assert cos > 0.999, (text, cos)
        with pytest.raises(ModelError, match="computes keys only"):
            twin.query(eng.tokenize("where is my new card"))
        with pytest.raises(ModelError, match="must pool the last row"):
            twin.set_key_layers([12, 9], ["mean", "mean"])
        twin.set_key_layers([12, 9], ["last", "mean"])
