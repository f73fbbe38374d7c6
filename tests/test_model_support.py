"""Any GGUF: the adapter on every common llama.cpp architecture and LM-head type, on tiny generated
models (tests/tiny_gguf.py: random weights, 512-token vocabulary, 3 layers of 256; the heads
quantised by llama.cpp's own quantiser). Each case runs check-model's self-test, an ingest and an
ask, against numpy references built from gguf-py's dequantisation of the same file.

These test the mechanics (tensor names, head layouts and types, the logit scale), not answer quality.
"""
from __future__ import annotations

import json

import numpy as np
import pytest

import tiny_gguf

# (architecture, LM-head type, tied): every architecture tied and untied (OLMo-2's llama.cpp graph
# requires output.weight), every head type on untied and tied heads.
SUPPORTED = (
    [(a, "Q8_0", tied) for a in ("llama", "qwen2", "qwen3", "phi3", "granite") for tied in (False, True)]
    + [("olmo2", "Q8_0", False)]
    + [("qwen3", ht, False) for ht in ("F32", "F16", "BF16", "Q4_K", "Q6_K")]
    + [("llama", ht, True) for ht in ("F16", "BF16", "Q4_K", "Q6_K")]
    + [("phi3", "Q6_K", False), ("granite", "Q4_K", False), ("granite", "BF16", True), ("olmo2", "Q6_K", False),
       ("qwen2", "F16", True), ("olmo2", "BF16", False)]
)
TYPE_IDS = {"F32": 0, "F16": 1, "BF16": 30, "Q8_0": 8, "Q4_K": 12, "Q6_K": 14}


@pytest.fixture(scope="session")
def tiny_dir(tmp_path_factory):
    return tmp_path_factory.mktemp("tiny-gguf")


def _case_id(c):
    return f"{c[0]}-{c[1]}-{'tied' if c[2] else 'untied'}"


def _dense_head(path):
    """The whole LM head and the logit multiplier, from gguf-py alone (reader + dequantisation)."""
    from gguf import GGUFReader
    from gguf.quants import dequantize
    from gguf.constants import GGMLQuantizationType

    r = GGUFReader(str(path))
    tensors = {t.name: t for t in r.tensors}
    t = tensors.get("output.weight") or tensors["token_embd.weight"]
    W = np.asarray(dequantize(t.data, GGMLQuantizationType(t.tensor_type)), np.float64)
    arch = bytes(r.fields["general.architecture"].parts[-1]).decode()
    f = r.fields.get(f"{arch}.logit_scale")
    c = 1.0 / float(f.parts[-1][0]) if (f is not None and arch == "granite") else 1.0
    return W, c, t.name, int(t.tensor_type)


def _softmax(z):
    z = z - z.max(axis=-1, keepdims=True)
    e = np.exp(z)
    return e / e.sum(axis=-1, keepdims=True)


@pytest.mark.parametrize("case", SUPPORTED, ids=_case_id)
def test_check_model_ingest_and_ask(case, tiny_dir, tmp_path):
    from miita_edge import Example, Miita
    from miita_edge.runtime.engine import Engine, EngineConfig
    from miita_edge.runtime.model_check import check_model, round_activations

    arch, head_type, tied = case
    path = tiny_gguf.make(arch, head_type, tied, tiny_dir)
    W, c, head_name, ttype = _dense_head(path)
    # llama.cpp's quantiser gave the head the type under test, and no output.weight when tied
    assert ttype == TYPE_IDS[head_type]
    assert head_name == ("token_embd.weight" if tied else "output.weight")
    assert W.shape == (tiny_gguf.N_VOCAB, tiny_gguf.N_EMBD)

    # 1. check-model's self-test passes, with every item
    rep = check_model(path, threads=1)
    assert rep.supported, rep.lines()
    assert (rep.arch, rep.n_embd, rep.n_layer, rep.key_layer) == (arch, 256, 3, 1)
    assert rep.head_tensor == head_name and rep.head_type == head_type
    assert rep.has_key_tensor and rep.has_result_norm
    assert [i.name for i in rep.items] == ["head rows", "captured key", "logits = c·W·h", "logit shift = c·W·δ"]
    assert rep.logit_mult == pytest.approx(c)

    eng = Engine(path, EngineConfig(n_ctx=512, n_threads=1))
    try:
        # 2. eq. 2 from the captured hidden states (the ingest route) vs numpy with the dense head:
        #    p_t = softmax(c W h_t) — this is where a logit scale must be applied
        toks = eng.tokenize("my parcel never arrived")
        target = eng.tokenize(" shipping desk", add_bos=False)
        flags = [False] * (len(toks) - 1) + [True] * len(target) + [False]
        hidden = eng.hidden_states(toks + target, flags)
        R = eng.lm_head.correction_from_hidden(hidden, target, per_position=True)
        P = _softmax(c * (hidden.astype(np.float64) @ W.T))
        R_ref = W[target] - P @ W
        assert np.abs(R - R_ref).max() <= 1e-4 * np.abs(R_ref).max()
        # the same probabilities as llama.cpp's own logits at those positions
        eng.reset()
        logits = eng.decode(toks + target, flags)
        hr = np.stack([round_activations(h, ttype) for h in hidden]).astype(np.float64)
        assert np.abs(logits - c * hr @ W.T).max() <= 1e-4 * np.abs(logits).max()

        # 3. ingest + ask through the facade; the first steered token against numpy
        ex = [Example("my parcel never arrived", "shipping desk"), Example("I was charged twice", "refund"),
              Example("the atm kept my card", "card blocked")]
        with Miita(path, tmp_path / "mem", template="plain", engine=eng) as m:
            rep_in = m.ingest(ex, budget="none")
            assert rep_in.to_json()["examples"] == 3 and m.bank.n_prototypes >= 1
            text = ex[1].input
            state = m.query_state(text)  # the key from the memory's key prompt, the answer's prompt decoded last
            plan = m.plan(state).plan
            d0 = plan(0, [])
            assert d0 is not None and np.isfinite(d0).all()
            eta_abs = 4.0 * float(np.linalg.norm(state.h_q))
            g = eng.generate(state, max_tokens=3, plan=plan, eta=eta_abs, mode="ungated")
            h1 = state.h_q + np.float32(eta_abs) * d0.astype(np.float32)
            z = state.logits.astype(np.float64) + c * W @ (round_activations(h1, ttype).astype(np.float64)
                                                             - round_activations(state.h_q, ttype))
            top2 = np.sort(z)[-2:]
            assert g.tokens, "no token generated"
            if top2[1] - top2[0] > 1e-3 * abs(top2[1]):  # no near-tie in the reference
                assert g.tokens[0] == int(np.argmax(z))
            # steering at this scale changes the first token (a no-op adapter would not)
            assert g.tokens[0] != int(np.argmax(state.logits)) or int(np.argmax(z)) == int(np.argmax(state.logits))
            ans = m.ask(text, max_tokens=4)
            assert isinstance(ans.text, str) and ans.adapted
    finally:
        eng.close()


def test_gemma2_soft_cap_is_refused_with_the_same_reason_everywhere(tiny_dir, capsys):
    from miita_edge.cli import main
    from miita_edge.errors import ModelError
    from miita_edge.runtime.engine import Engine
    from miita_edge.runtime.model_check import check_model

    for tied in (False, True):
        path = tiny_gguf.make("gemma2", "Q8_0", tied, tiny_dir)
        rep = check_model(path)
        assert not rep.supported and "soft-caps its logits" in rep.reason
        assert rep.arch == "gemma2" and rep.head_type == "Q8_0"
        with pytest.raises(ModelError) as ei:
            Engine(path)
        assert rep.reason in str(ei.value)
        assert main(["check-model", str(path)]) == 2
        out = capsys.readouterr().out.strip().splitlines()
        assert out[-1] == f"refused: {rep.reason}"
        # --model elsewhere: one line naming the same reason, exit 2
        assert main(["ask", "hello", "--model", str(path), "--no-adapt", "--memory", str(tiny_dir / "m")]) == 2
        err = capsys.readouterr().err.strip().splitlines()
        assert len(err) == 1 and err[0].endswith(rep.reason) and "unsupported model" in err[0]


def test_refusal_reasons_from_the_header(tmp_path):
    from miita_edge.runtime.gguf_model import inspect_gguf
    from miita_edge.runtime.model_check import check_model, refusal_reason

    import gguf

    def write(name, arch, extra=()):
        p = tmp_path / name
        w = gguf.GGUFWriter(str(p), arch)
        w.add_embedding_length(32)
        w.add_block_count(2)
        w.add_tensor("token_embd.weight", np.zeros((64, 32), np.float32))
        for t in extra:
            w.add_tensor(t, np.zeros(64, np.float32))
        w.write_header_to_file()
        w.write_kv_data_to_file()
        w.write_tensors_to_file()
        w.close()
        return p

    cases = {"mamba": "recurrent", "rwkv7": "recurrent", "bert": "encoder-only", "t5": "encoder-decoder",
             "llada": "diffusion", "nomic-bert": "encoder-only"}
    for arch, word in cases.items():
        p = write(f"{arch}.gguf", arch)
        assert word in refusal_reason(inspect_gguf(p))
        rep = check_model(p)
        assert not rep.supported and word in rep.reason and rep.arch == arch
    assert refusal_reason(inspect_gguf(write("llama.gguf", "llama"))) is None
    assert "bias" in refusal_reason(inspect_gguf(write("bias.gguf", "phi2", ["output.bias"])))


def test_missing_tensor_names_are_refused(tiny_dir, monkeypatch):
    """An architecture whose graph does not name l_out-<k> would give zero keys silently: the engine's
    graph probe refuses it (simulated by watching a name no graph has)."""
    from miita_edge.errors import ModelError
    from miita_edge.runtime import engine as engine_mod
    from miita_edge.runtime.model_check import check_model

    path = tiny_gguf.make("llama", "Q8_0", False, tiny_dir)
    monkeypatch.setattr(engine_mod, "key_tensor_name", lambda k: f"l_out_renamed-{k}")
    with pytest.raises(ModelError, match="no tensor named 'l_out_renamed-1'"):
        engine_mod.Engine(path)
    rep = check_model(path)
    assert not rep.supported and rep.has_key_tensor is False and "l_out_renamed-1" in rep.reason


def test_self_test_catches_a_wrong_logit_scale_and_wrong_rows(tiny_dir, monkeypatch):
    """The self-test can fail: a logit scale the graph does not apply, head rows read wrongly."""
    from miita_edge.runtime import gguf_model, model_check
    from miita_edge.runtime.engine import Engine, EngineConfig, LMHeadRows

    path = tiny_gguf.make("granite", "Q8_0", False, tiny_dir)
    rep = model_check.check_model(path)
    assert rep.supported and rep.logit_mult == pytest.approx(1 / tiny_gguf.GRANITE_LOGIT_SCALE)
    # a multiplier instead of a divisor (command-r's convention) must fail the logits checks
    monkeypatch.setattr(gguf_model, "LOGIT_SCALE_DIVIDES", frozenset())
    monkeypatch.setattr(gguf_model, "LOGIT_SCALE_MULTIPLIES", frozenset({"granite"}))
    bad = model_check.check_model(path)
    assert not bad.supported and "logits = c·W·h" in bad.reason
    monkeypatch.undo()
    # rows off by one
    orig = LMHeadRows.rows
    monkeypatch.setattr(LMHeadRows, "rows", lambda self, ids: orig(self, (np.asarray(ids) + 1) % self.head.n_vocab))
    with Engine(path, EngineConfig(n_ctx=512, n_threads=1)) as eng:
        items = {i.name: i for i in eng.check()}
    assert not items["head rows"].ok and items["captured key"].ok


def test_check_model_cli_output_and_json(tiny_dir, capsys):
    from miita_edge.cli import main

    path = tiny_gguf.make("qwen3", "Q6_K", False, tiny_dir)
    # a random-weight model passes the mechanics, and the functional test says that its memory
    # cannot give taught answers back (what the verdict is for)
    code = main(["check-model", str(path), "--threads", "1"])
    out = capsys.readouterr().out.splitlines()
    assert code in (2, 3) and out[-1].startswith(("refused: steering", "limited: steering")), out[-3:]
    assert any(ln.startswith("steering     default") for ln in out) and any("paper" in ln for ln in out)
    assert main(["check-model", str(path), "--threads", "1", "--quick"]) == 0  # the mechanics hold
    out = capsys.readouterr().out.splitlines()
    text = "\n".join(out)
    for needle in ("architecture qwen3", "n_embd       256", "n_layer      3", "key layer    1 (l_out-1)",
                   "LM head      output.weight (Q6_K)", "graph        l_out-1: yes, result_norm: yes"):
        assert needle in text
    assert out[-1] == "supported"
    assert main(["check-model", "--model", str(path), "--json", "--quick"]) == 0
    js = json.loads(capsys.readouterr().out)
    assert js["supported"] and js["head_type"] == "Q6_K" and js["steering"] == []  # no functional test
    assert {i["name"] for i in js["self_test"]} >= {"head rows", "captured key"}
    assert all(i["ok"] for i in js["self_test"]), js["self_test"]
    # bad input: one line, exit 2, no traceback
    assert main(["check-model", str(tiny_dir / "missing.gguf")]) == 2
    cap = capsys.readouterr()
    assert cap.out.strip().splitlines()[-1].startswith("refused: model file not found") and "Traceback" not in cap.err
    bad = tiny_dir / "garbage.gguf"
    bad.write_bytes(b"GGUF" + bytes(range(200)))
    assert main(["check-model", str(bad)]) == 2
    assert capsys.readouterr().out.strip().splitlines()[-1].startswith("refused: cannot parse GGUF")


def test_check_model_survives_a_crash_of_llama_cpp(tiny_dir, capsys, monkeypatch):
    """llama.cpp aborts the process on some malformed models (GGML_ASSERT): check-model runs the check
    in a child process, so the verdict still prints (simulated: the child aborts)."""
    from miita_edge.cli import main

    path = tiny_gguf.make("llama", "Q8_0", False, tiny_dir)
    monkeypatch.setenv("MIITA_CHECK_MODEL_TEST_ABORT", "1")
    assert main(["check-model", str(path)]) == 2
    cap = capsys.readouterr()
    assert cap.out.strip().splitlines()[-1] == "refused: llama.cpp crashed while loading or running this model (SIGABRT)"
    assert "Traceback" not in cap.err


def test_the_check_child_imports_the_package_the_parent_loaded(tiny_dir, tmp_path, monkeypatch):
    """A script may put another copy of the package first on ``sys.path`` (a checkout's ``python/``,
    which has no compiled extension): the child must still import the one this process runs."""
    from miita_edge.runtime.model_check import check_model, check_model_isolated

    other = tmp_path / "other" / "miita_edge"
    other.mkdir(parents=True)
    (other / "__init__.py").write_text("raise ImportError('the other copy was imported')\n")
    monkeypatch.syspath_prepend(str(other.parent))
    path = tiny_gguf.make("gemma2", "Q8_0", False, tiny_dir)
    rep = check_model_isolated(path, run_self_test=False)
    assert rep.reason == check_model(path, run_self_test=False).reason
    assert "soft-caps its logits" in rep.reason
