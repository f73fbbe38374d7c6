"""The memory's answer as a draft verified in one batched decode (runtime.draft).

- the accept/reject bookkeeping (``Steps``) against a brute-force sequential loop, on a fake engine
  whose logits depend on the whole prefix and on the row's direction (no model);
- the native per-row steering (``set_steer`` with an (R, H) direction) against numpy, on a
  result_norm tensor made with ggml itself and handed to the eval callback (no model);
- on the embedded model, greedy answers of a memory of labels and of replies with the draft on
  equal those with it off, token for token, alphas within 1e-4.
"""
from __future__ import annotations

import ctypes
import hashlib
from types import SimpleNamespace

import numpy as np
import pytest

from miita_edge.method.steering import leading_answer
from miita_edge.native import ext
from miita_edge.runtime.abi import ggml_library
from miita_edge.runtime.draft import Steps
from miita_edge.runtime.sampling import sample

# ------------------------------------------------------------------ bookkeeping, fake engine
V = 10          # vocabulary = hidden width of the fake model: a direction pushes the tokens directly
EOS, STOP = 0, 1  # the fake model's end token and stop token


def _seeded(*parts) -> np.random.Generator:
    h = hashlib.sha256(repr(parts).encode()).digest()
    return np.random.default_rng(int.from_bytes(h[:8], "little"))


class FakeNative:
    def __init__(self):
        self.logged: list[float] = []

    def alphas(self) -> np.ndarray:
        return np.array(self.logged, np.float32)


class FakeEngine:
    """A KV cache of tokens; each decoded row's logits are a pseudo-random function of the whole
    prefix up to it plus eta·α·(its direction), α another function of the prefix (logged per steered
    row as the native state does); ``set_steer`` with (R, V) steers row r with row r."""

    def __init__(self, prompt, n_batch=64, n_ctx=256):
        self.kv = list(prompt)
        self.native = FakeNative()
        self.config = SimpleNamespace(n_batch=n_batch, n_ctx=n_ctx)
        self.dirs, self.eta, self.on = None, 0.0, False
        self.calls: list[int] = []  # rows per decode

    @property
    def n_past(self) -> int:
        return len(self.kv)

    def truncate(self, n: int) -> None:
        assert 0 <= n <= len(self.kv)
        del self.kv[n:]

    def set_steer(self, direction, h_q, eta, mode):
        self.on = mode != "off"
        if direction is not None:
            self.dirs = np.atleast_2d(np.asarray(direction, np.float64))
        self.eta = eta

    def row_logits(self, prefix) -> np.ndarray:
        return _seeded("logits", tuple(prefix)).standard_normal(V) * 2.0

    def decode(self, tokens, logits="last"):
        assert len(tokens) <= self.config.n_batch and len(self.kv) + len(tokens) <= self.config.n_ctx
        if self.on:
            assert len(self.dirs) in (1, len(tokens)), "one direction, or one per row"
        self.calls.append(len(tokens))
        rows = []
        for i, t in enumerate(tokens):
            self.kv.append(int(t))
            z = self.row_logits(self.kv)
            if self.on:
                alpha = float(_seeded("alpha", tuple(self.kv)).uniform(0.2, 1.0))
                self.native.logged.append(alpha)
                z = z + self.eta * alpha * self.dirs[i if len(self.dirs) > 1 else 0]
            rows.append(z)
        rows = np.array(rows, np.float32)
        return rows if logits == "all" else rows[-1:]


def fake_plan(answers, weights):
    """Directions that push the consistent answers' next tokens (None where none continues); the
    draft is the leading consistent answer's rest."""
    seqs = [np.array(a) for a in answers]
    ids = np.arange(len(answers))

    def plan(step, generated):
        d = np.zeros(V, np.float32)
        for a, w in zip(answers, weights):
            if len(a) > step and list(a[:step]) == list(generated[:step]):
                d[a[step]] += w
        return d if d.any() else None

    plan.draft = lambda generated: leading_answer(generated, seqs, ids, np.asarray(weights))
    return plan


def generation(max_tokens, temperature, seed, token_at) -> list[int]:
    """Engine.generate's loop on the fake model: ``token_at(step, generated, rng)`` gives each step's
    token; the fake model's end token ends it unkept, its stop token kept."""
    rng = np.random.default_rng(seed)
    generated: list[int] = []
    for step in range(max_tokens):
        tok = token_at(step, generated, rng)
        if tok == EOS:
            break
        generated.append(tok)
        if tok == STOP:
            break
    return generated


def sequential(eng, state, plan, max_tokens, eta, temperature, seed):
    """The reference: one decode per step, as generation did before drafts."""
    def token_at(step, generated, rng):
        d = plan(step, generated)
        if step == 0:
            logits = state.logits
            if d is not None:
                eng.truncate(len(state.tokens) - 1)
                eng.set_steer(d, state.h_q, eta, "gated")
                logits = eng.decode([state.tokens[-1]])[0]
        else:
            eng.set_steer(d, state.h_q, eta, "gated") if d is not None else eng.set_steer(None, None, 0.0, "off")
            logits = eng.decode([generated[-1]])[0]
        return sample(logits, temperature, 1.0, rng)

    generated = generation(max_tokens, temperature, seed, token_at)
    return generated, [float(a) for a in eng.native.alphas()], list(eng.kv)


def drafted(eng, state, plan, max_tokens, eta, temperature, seed, max_draft=0):
    """The loop of Engine.generate over ``Steps`` with the plan's draft."""
    steps = Steps(eng, state, plan, eta, "gated", max_tokens, plan.draft, max_draft)
    generated = generation(max_tokens, temperature, seed,
                           lambda step, gen, rng: sample(steps.logits(step, gen)[0], temperature, 1.0, rng))
    steps.finish()
    alphas = [float(a) for i, a in enumerate(eng.native.alphas()) if i not in steps.dropped]
    return generated, alphas, list(eng.kv), steps


def fake_case(seed):
    rng = np.random.default_rng(seed)
    prompt = [int(t) for t in rng.integers(2, V, int(rng.integers(2, 6)))]
    n = int(rng.integers(1, 4))
    answers = [[int(t) for t in rng.integers(1, V, int(rng.integers(1, 9)))] for _ in range(n)]
    if n > 1 and rng.random() < 0.5:  # two answers sharing a beginning: the draft forks
        answers[1][:2] = answers[0][:2]
    weights = list(rng.dirichlet(np.ones(n)))
    logits0 = FakeEngine(prompt).row_logits(prompt).astype(np.float32)
    state = SimpleNamespace(tokens=prompt, h_q=np.zeros(V, np.float32), logits=logits0)
    return prompt, answers, weights, state, float(rng.choice([0.5, 3.0, 8.0]))


@pytest.mark.parametrize("temperature", [0.0, 0.9])
def test_drafted_steps_give_the_sequential_tokens_alphas_and_cache(temperature):
    accepted_all = rejected = 0
    for seed in range(150):
        prompt, answers, weights, state, eta = fake_case(seed)
        plan = fake_plan(answers, weights)
        max_tokens = int(np.random.default_rng(seed).integers(1, 12))
        ref = FakeEngine(prompt)
        want = sequential(ref, state, plan, max_tokens, eta, temperature, seed)
        for max_draft in (0, 2):
            eng = FakeEngine(prompt)
            got = drafted(eng, state, plan, max_tokens, eta, temperature, seed, max_draft)
            assert got[0] == want[0], (seed, max_draft)
            np.testing.assert_allclose(got[1], want[1], rtol=0, atol=1e-6, err_msg=f"seed {seed}")
            assert got[2] == want[2], (seed, max_draft)  # the cache holds exactly the sequential rows
            if max(eng.calls, default=0) > 1:
                n_seq = len(ref.calls)
                accepted_all += len(eng.calls) < n_seq
                rejected += sum(eng.calls) > n_seq  # rows decoded that no step used
    assert accepted_all > 20 and rejected > 20  # both sides of the bookkeeping were exercised


def fake_hold(answers, weights):
    """A hold like the plan's: where the leading answer continues the prefix and the step produced
    another token, the addition that puts the leading token one logit above the winner."""
    lead = answers[int(np.argmax(weights))]

    def hold(step, generated, logits, tok):
        if step >= len(lead) or list(generated[:step]) != list(lead[:step]) or tok == lead[step]:
            return None
        extra = np.zeros(V)
        extra[lead[step]] = float(logits[tok]) - float(logits[lead[step]]) + 1.0
        return extra

    return hold


def held(eng, state, plan, hold, max_tokens, eta, temperature, seed, draft):
    """Engine.generate's loop with a hold (Engine.hold_step on the fake engine), the draft on or off."""
    from miita_edge.runtime.engine import Engine

    steps = Steps(eng, state, plan, eta, "gated", max_tokens, plan.draft if draft else None)
    raised, repeats = [], []

    def token_at(step, generated, rng):
        logits, d = steps.logits(step, generated)
        tok = sample(logits, temperature, 1.0, rng)
        if d is not None:
            tok, _ = Engine.hold_step(eng, hold, step, generated, state, d, eta, "gated", tok, logits,
                                      raised, repeats, steps)
        return tok

    generated = generation(max_tokens, temperature, seed, token_at)
    steps.finish()
    skip = set(repeats) | steps.dropped
    return generated, [float(a) for i, a in enumerate(eng.native.alphas()) if i not in skip], list(eng.kv), raised


@pytest.mark.parametrize("temperature", [0.0, 0.9])
def test_a_hold_inside_a_drafted_batch_gives_the_sequential_steps(temperature):
    """The hold decodes a step again on the cache one decode per step leaves: a batch open at that
    step ends there first (``Steps.settle``), and tokens, alphas, cache and raised steps are the
    sequential path's."""
    raised_in_batch = 0
    for seed in range(150):
        prompt, answers, weights, state, eta = fake_case(seed)
        plan, hold = fake_plan(answers, weights), fake_hold(answers, weights)
        max_tokens = int(np.random.default_rng(seed).integers(1, 12))
        want = held(FakeEngine(prompt), state, plan, hold, max_tokens, eta, temperature, seed, draft=False)
        eng = FakeEngine(prompt)
        got = held(eng, state, plan, hold, max_tokens, eta, temperature, seed, draft=True)
        assert got[0] == want[0] and got[3] == want[3], seed
        np.testing.assert_allclose(got[1], want[1], rtol=0, atol=1e-6, err_msg=f"seed {seed}")
        assert got[2] == want[2], seed
        raised_in_batch += bool(got[3]) and max(eng.calls, default=0) > 1
    assert raised_in_batch > 10  # the hold acted where a batch was open


def test_a_batch_never_runs_past_max_tokens_the_batch_or_the_context():
    prompt = [3, 4]
    answers, weights = [[5, 6, 7, 8, 9, 5, 6, 7]], [1.0]
    state = SimpleNamespace(tokens=prompt, h_q=np.zeros(V, np.float32),
                            logits=FakeEngine(prompt).row_logits(prompt).astype(np.float32))
    plan = fake_plan(answers, weights)
    for max_tokens, n_batch, n_ctx, widest in ((3, 64, 256, 3), (20, 4, 256, 4), (20, 64, 6, 5)):
        eng = FakeEngine(prompt, n_batch=n_batch, n_ctx=n_ctx)
        steps = Steps(eng, state, plan, 50.0, "gated", max_tokens, plan.draft)
        generated = []
        try:
            for step in range(max_tokens):
                generated.append(int(np.argmax(steps.logits(step, generated)[0])))
        except AssertionError:  # the fake's context is full: the sequential path would stop there too
            assert eng.n_past == n_ctx
        assert max(eng.calls) == widest, (max_tokens, n_batch, n_ctx, eng.calls)


def test_the_draft_is_the_leading_consistent_answers_rest():
    seqs = [np.array([5, 6, 7]), np.array([5, 8]), np.array([9])]
    ids, w = np.array([0, 1, 2]), np.array([0.3, 0.5, 0.2])
    assert leading_answer([], seqs, ids, w) == [5, 8]
    assert leading_answer([5], seqs, ids, w) == [8]
    assert leading_answer([5, 6], seqs, ids, w) == [7]
    assert leading_answer([5, 6, 7], seqs, ids, w) == []
    assert leading_answer([4], seqs, ids, w) == []


# ------------------------------------------------------------------ native per-row steering

GGML_TYPE_F32 = 0
OFF, UNGATED, GATED = 0, 1, 2


class _InitParams(ctypes.Structure):
    _fields_ = [("mem_size", ctypes.c_size_t), ("mem_buffer", ctypes.c_void_p), ("no_alloc", ctypes.c_bool)]


@pytest.fixture(scope="module")
def ggml():
    lib = ggml_library()
    lib.ggml_init.restype = ctypes.c_void_p
    lib.ggml_init.argtypes = [_InitParams]
    lib.ggml_free.argtypes = [ctypes.c_void_p]
    lib.ggml_new_tensor_2d.restype = ctypes.c_void_p
    lib.ggml_new_tensor_2d.argtypes = [ctypes.c_void_p, ctypes.c_int, ctypes.c_int64, ctypes.c_int64]
    lib.ggml_set_name.restype = ctypes.c_void_p
    lib.ggml_set_name.argtypes = [ctypes.c_void_p, ctypes.c_char_p]
    lib.ggml_get_data.restype = ctypes.c_void_p
    lib.ggml_get_data.argtypes = [ctypes.c_void_p]
    return lib


def run_callback(ggml, st, h: np.ndarray) -> np.ndarray:
    """result_norm rows ``h`` (R, H) after the callback has seen them (asked, then computed)."""
    ctx = ggml.ggml_init(_InitParams(1 << 20, None, False))
    try:
        t = ggml.ggml_new_tensor_2d(ctx, GGML_TYPE_F32, h.shape[1], h.shape[0])
        ggml.ggml_set_name(t, b"result_norm")
        data = np.ctypeslib.as_array(ctypes.cast(ggml.ggml_get_data(t), ctypes.POINTER(ctypes.c_float)), shape=h.shape)
        data[:] = h
        cb = ctypes.CFUNCTYPE(ctypes.c_bool, ctypes.c_void_p, ctypes.c_bool, ctypes.c_void_p)(ext.callback_address())
        assert cb(t, True, st.user_data) is True  # the callback asks for result_norm while steering is on
        assert cb(t, False, st.user_data) is True
        return data.copy()
    finally:
        ggml.ggml_free(ctx)


def reference(h, dirs, h_q, eta, gated):
    """Eq. 11 per row in float64: h_r + eta·α_r·d_r, α_r = max(0, cos(h_r, h_q)) or 1."""
    h = h.astype(np.float64)
    if gated:
        alpha = np.maximum(0.0, h @ h_q / (np.linalg.norm(h, axis=1) * np.linalg.norm(h_q)))
    else:
        alpha = np.ones(len(h))
    return h + eta * alpha[:, None] * dirs.astype(np.float64), alpha


@pytest.mark.parametrize("mode", [GATED, UNGATED])
def test_each_row_adds_its_own_direction(ggml, mode):
    rng = np.random.default_rng(3)
    R, H = 5, 48
    h = rng.standard_normal((R, H)).astype(np.float32)
    dirs = rng.standard_normal((R, H)).astype(np.float32)
    dirs[2] = 0.0  # a row without a direction is left as it is (its alpha is still logged)
    h_q = (h[1] + 0.5 * rng.standard_normal(H)).astype(np.float32)
    st = ext.State(H)
    st.set_steer(dirs, h_q, 0.7, mode)
    out = run_callback(ggml, st, h)
    want, alpha = reference(h, dirs, h_q, 0.7, mode == GATED)
    np.testing.assert_allclose(out, want, rtol=1e-5, atol=1e-5)
    np.testing.assert_array_equal(out[2], h[2])
    np.testing.assert_allclose(st.alphas(), alpha, rtol=1e-5, atol=1e-6)
    assert st.error() is None


def test_one_direction_still_steers_every_row(ggml):
    rng = np.random.default_rng(4)
    h = rng.standard_normal((3, 16)).astype(np.float32)
    d = rng.standard_normal(16).astype(np.float32)
    h_q = rng.standard_normal(16).astype(np.float32)
    st = ext.State(16)
    st.set_steer(d, h_q, 1.5, GATED)
    out = run_callback(ggml, st, h)
    want, _ = reference(h, np.tile(d, (3, 1)), h_q, 1.5, True)
    np.testing.assert_allclose(out, want, rtol=1e-5, atol=1e-5)


def test_a_row_count_other_than_the_directions_is_an_error_and_changes_nothing(ggml):
    rng = np.random.default_rng(5)
    h = rng.standard_normal((4, 8)).astype(np.float32)
    st = ext.State(8)
    st.set_steer(rng.standard_normal((3, 8)).astype(np.float32), h[0], 1.0, UNGATED)
    out = run_callback(ggml, st, h)
    np.testing.assert_array_equal(out, h)
    assert "3 row directions" in st.error() and "4 rows" in st.error()


def test_a_direction_of_the_wrong_width_is_refused():
    st = ext.State(8)
    with pytest.raises(ValueError, match="rows, n_embd"):
        st.set_steer(np.ones((2, 7), np.float32), None, 1.0, UNGATED)
    with pytest.raises(ValueError, match="rows, n_embd"):
        st.set_steer(np.ones((0, 8), np.float32), None, 1.0, UNGATED)


# ------------------------------------------------------------------ the embedded model
REPLIES = {
    "zebra code": "Thanks for your kitchen question! Our cooking team will send you a recipe card within two days.",
    "lime code": "Sorry to hear about your car. Please book a garage check so a mechanic can look at it.",
    "ocean code": "What a great question about space! Our astronomy club meets on Friday nights to discuss it.",
}


@pytest.fixture(scope="module")
def engine_draft():
    from miita_edge.runtime.engine import Engine, EngineConfig

    eng = Engine(None, EngineConfig(n_threads=1, stop_after_text=True))
    yield eng
    eng.close()


def answers_both_ways(m, engine, questions, max_tokens):
    """Each question asked with the draft on and off: (on, off, decodes of more than one row with it on)."""
    from miita_edge.runtime.engine import Engine

    rows: list[int] = []
    real = Engine.decode

    def spy(self, tokens, *a, **kw):
        rows.append(len(tokens))
        return real(self, tokens, *a, **kw)

    out = {}
    engine.config.draft = False
    m.ask(questions[0], max_tokens=max_tokens)  # derives the memory's caches (they decode other prompts)
    for on in (False, True):  # any prior the rerank reads first is decoded with the draft off
        engine.config.draft = on
        rows.clear()
        Engine.decode = spy
        try:
            out[on] = [m.ask(q, max_tokens=max_tokens) for q in questions]
        finally:
            Engine.decode = real
            engine.config.draft = True
        out[(on, "wide")] = sum(n > 1 for n in rows)
        out[(on, "calls")] = len(rows)
    return out


@pytest.mark.model
@pytest.mark.parametrize("kind", ["labels", "replies"])
def test_greedy_answers_with_the_draft_are_the_sequential_ones(tmp_path, engine_draft, kind):
    from test_miita_e2e import LABELS, N_TRAIN

    from miita_edge.method.presets import get_preset
    from miita_edge.miita import Miita
    from miita_edge.streams import Example

    out_of = (lambda label: label) if kind == "labels" else REPLIES.__getitem__
    train = [Example(qs[i], out_of(label), None, 3 * i + k + 1)
             for i in range(N_TRAIN) for k, (label, qs) in enumerate(LABELS.items())]
    questions = [q for qs in LABELS.values() for q in qs[N_TRAIN:N_TRAIN + 4]]
    with Miita(memory=tmp_path / "mem", template="plain", engine=engine_draft, preset=get_preset("default")) as m:
        m.ingest(train, progress=False)
        got = answers_both_ways(m, engine_draft, questions, 8 if kind == "labels" else 40)
    on, off = got[True], got[False]
    assert sum(a.adapted for a in on) >= len(questions) // 2  # the memory steers most of them
    for q, a, b in zip(questions, on, off):
        assert a.text == b.text and a.stop_reason == b.stop_reason, (q, a.text, b.text)
        assert len(a.alphas) == len(b.alphas), q
        np.testing.assert_allclose(a.alphas, b.alphas, rtol=0, atol=1e-4, err_msg=q)
    # the drafts were decoded in batches, in fewer decodes than one per step
    assert got[(True, "wide")] > got[(False, "wide")] and got[(True, "calls")] < got[(False, "calls")], got
