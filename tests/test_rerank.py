"""The rerank of the vote's leading answers (method/rerank.py) against plain recomputations."""
from __future__ import annotations

import numpy as np
import pytest

from miita_edge.method.rerank import channel_logprob, continuation_logprob, rerank_plan, rerank_weights, token_logprobs

# three canned replies and two taught paraphrases each: the memories the plan-level tests rerank
REPLIES = {"pin": "You can change your PIN at any of our cash machines under PIN services.",
           "lost": "Freeze the card in the app at once, then order a replacement card there.",
           "fee": "Top-ups by bank transfer are free; card top-ups cost half a percent of the amount."}
ASKS = {"pin": ["How do I change my PIN?", "I want a new PIN number"],
        "lost": ["I lost my card", "My card was stolen yesterday"],
        "fee": ["Is there a fee to top up?", "What does a top-up cost?"]}


def test_token_logprobs_is_log_softmax_picked_per_row():
    rng = np.random.default_rng(0)
    z = rng.normal(size=(5, 11)) * 4
    toks = [3, 0, 10, 7, 7]
    ref = [np.log(np.exp(z[i, t]) / np.exp(z[i]).sum()) for i, t in enumerate(toks)]
    np.testing.assert_allclose(token_logprobs(z, toks), ref, rtol=1e-12)


def test_rerank_weights_multiply_by_exp_lambda_pmi_and_keep_the_mass():
    w = np.array([0.5, 0.25, 0.05])
    pmi = np.array([-10.0, 4.0, 30.0])
    out = rerank_weights(w, pmi, 0.1)
    ref = w * np.exp(0.1 * pmi)
    ref = ref / ref.sum() * w.sum()
    np.testing.assert_allclose(out, ref, rtol=1e-12)
    np.testing.assert_allclose(rerank_weights(w, pmi, 0.0), w, rtol=1e-12)
    # far apart in log space (a weight of 1e-200, a PMI of 800 nats) it stays finite
    out = rerank_weights(np.array([1.0, 1e-200]), np.array([0.0, 800.0]), 1.0)
    assert np.isfinite(out).all() and out[1] > 0.99


def test_rerank_plan_touches_only_the_leading_long_answers():
    seqs = [[1] * 10, [2] * 10, [3] * 10, [4] * 10, [5] * 3]
    ids = np.array([3, 0, 1, 2])
    w = np.array([0.1, 0.5, 0.3, 0.1])
    pri = {j: -float(j) for j in range(5)}
    asked = []

    def q(toks):
        asked.append(toks[0])
        return {1: -20.0, 2: -5.0, 4: -9.0, 3: 0.0}[toks[0]]

    out, pmi = rerank_plan(ids, w, seqs, top=2, lam=0.5, min_tokens=8, query_logprob=q,
                           prior_logprob=pri.__getitem__)
    # the two leading answers are ids 0 (w 0.5) and 1 (w 0.3); the others keep their weights
    assert sorted(asked) == [1, 2]
    np.testing.assert_allclose(pmi, [-20.0 - 0.0, -5.0 - (-1.0)])
    lead = np.array([0.5, 0.3]) * np.exp(0.5 * pmi)
    np.testing.assert_allclose(out[[1, 2]], lead / lead.sum() * 0.8, rtol=1e-12)
    assert out[0] == 0.1 and out[3] == 0.1
    # a short answer among the leaders: the vote alone decides
    ids2 = np.array([4, 0])
    out2, pmi2 = rerank_plan(ids2, np.array([0.6, 0.4]), seqs, top=2, lam=0.5, min_tokens=8,
                             query_logprob=q, prior_logprob=pri.__getitem__)
    assert pmi2 is None and list(out2) == [0.6, 0.4]
    # a single candidate: nothing to choose between
    out3, pmi3 = rerank_plan(np.array([0]), np.array([1.0]), seqs, top=3, lam=0.5, min_tokens=8,
                             query_logprob=q, prior_logprob=pri.__getitem__)
    assert pmi3 is None and list(out3) == [1.0]


def test_continuation_logprob_equals_one_full_decode_and_restores_the_cache(engine):
    prompt = engine.tokenize("Question: where is my new card?\nAnswer:")
    cont = engine.tokenize(" It is on its way and arrives within a week.", add_bos=False)
    engine.reset()
    first = engine.decode(prompt, "last")[0]
    got = continuation_logprob(engine, first, cont)
    assert engine.n_past == len(prompt)
    # the cache still holds the prompt: the next token's logits are the prompt's last row again
    again = engine.decode(cont[:1], "last")[0]
    engine.reset()
    full = engine.decode(prompt + cont, "all")
    ref = sum(float(np.log(np.exp(full[len(prompt) - 1 + i].astype(np.float64)
                                  - full[len(prompt) - 1 + i].max()).sum()) * -1
                        + (full[len(prompt) - 1 + i, t] - full[len(prompt) - 1 + i].max()))
              for i, t in enumerate(cont))
    assert got == pytest.approx(ref, abs=2e-3)
    # against the same one-token decode after a fresh prompt: a one-token batch takes other kernels
    # than a whole decode (up to 0.9 logits apart on an AVX2 EPYC), so the whole decode's row is
    # only a loose check of the restored cache, the fresh prompt's an exact one
    engine.reset()
    engine.decode(prompt, "last")
    fresh = engine.decode(cont[:1], "last")[0]
    np.testing.assert_allclose(again, fresh, atol=1e-4)
    np.testing.assert_allclose(again, full[len(prompt)], atol=2.0)
    engine.reset()


def test_a_memory_with_the_rerank_plans_the_weights_a_plain_recomputation_gives(engine, tmp_path):
    """Through ``Miita.plan``: the leading answers' weights are the vote's times exp(λ·PMI), PMI
    recomputed here from two fresh decodes per answer (after the query's prompt, after the empty
    prompt), and the engine's cache holds the query's prompt again afterwards."""
    from miita_edge.method.presets import default_preset
    from miita_edge.miita import Miita
    from miita_edge.streams import Example

    replies, asks = REPLIES, ASKS
    with Miita(engine=engine, memory=tmp_path / "mem", template="plain") as m:
        m.ingest([Example(x, replies[k]) for k in replies for x in asks[k]], budget=None, progress=False)
        m.preset.rerank_lambda, m.preset.rerank_top, m.preset.rerank_min_tokens = 0.0, 3, 8
        m.preset.relevance_gate = False  # every answer a candidate: the rerank is what is checked
        toks = m.prompt_tokens("Somebody took my card, what now?")
        eng = m.keyed_engine()
        state = eng.query(toks, skip_bos_in_key=m.preset.skip_bos)
        off = m.plan(state)
        m.preset.rerank_lambda = 0.2
        on = m.plan(state)
        assert eng.n_past == len(toks)
        seqs = m.retrieval_index().seqs
        null = m.prompt_tokens("")

        def lp(prompt, cont):
            eng.reset()
            z = eng.decode(list(prompt) + list(cont), "all")[len(prompt) - 1:len(prompt) - 1 + len(cont)]
            return float(token_logprobs(z, cont).sum())

        lead = np.argsort(-off.weights, kind="stable")[:3]
        assert len(lead) >= 2
        pmi = np.array([lp(toks, seqs[int(off.ids[i])]) - lp(null, seqs[int(off.ids[i])]) for i in lead])
        ref = off.weights.astype(np.float64).copy()
        r = off.weights[lead] * np.exp(0.2 * pmi)
        ref[lead] = r / r.sum() * off.weights[lead].sum()
        assert list(on.ids) == list(off.ids)
        # incremental and whole decodes differ (batch shapes): within 2% of a weight on AVX2 EPYCs, up
        # to 7.5% on an AVX-512 Xeon (about 0.37 nat over a reply), so 10% here
        np.testing.assert_allclose(on.weights, ref, rtol=1e-1, atol=1e-6)
        assert not np.allclose(on.weights, off.weights, rtol=2e-2)  # the rerank moved something
        # a context too small for prompt + reply: the vote alone decides, nothing overflows
        n_ctx = eng.config.n_ctx
        try:
            eng.config.n_ctx = len(toks) + 5
            m.retrieval_index().prior.clear()
            state = eng.query(toks, skip_bos_in_key=m.preset.skip_bos)
            np.testing.assert_allclose(m.plan(state).weights, off.weights, rtol=1e-6)
        finally:
            eng.config.n_ctx = n_ctx
        eng.reset()


def test_a_channel_rerank_plans_the_weights_a_plain_recomputation_gives(engine, tmp_path, monkeypatch):
    """``rerank_score = "channel"`` through ``Miita.plan`` and ``Miita.ask``: the leading answers'
    weights are the vote's times exp(λ·log p(query | answer)); the text reaches the plan from
    ``ask``, and a prompt given as tokens alone falls back to the PMI."""
    from miita_edge.miita import Miita
    from miita_edge.streams import Example

    replies, asks = REPLIES, ASKS
    query = "Somebody took my card, what now?"
    with Miita(engine=engine, memory=tmp_path / "mem", template="plain") as m:
        m.ingest([Example(x, replies[k]) for k in replies for x in asks[k]], budget=None, progress=False)
        m.preset.rerank_lambda, m.preset.rerank_top, m.preset.rerank_min_tokens = 0.0, 3, 8
        m.preset.relevance_gate = False
        toks = m.prompt_tokens(query)
        eng = m.keyed_engine()
        state = eng.query(toks, skip_bos_in_key=m.preset.skip_bos)
        off = m.plan(state)
        m.preset.rerank_lambda, m.preset.rerank_score = 0.3, "channel"
        on = m.plan(state, query_text=query)
        assert eng.n_past == len(toks)  # the query's prompt is back in the cache
        np.testing.assert_allclose(m.plan(state).weights, m.plan(state, query_text=None).weights)
        seqs = m.retrieval_index().seqs

        # each answer's score by the function the channel test above checks against whole decodes
        # (whole and incremental decodes differ by up to 0.7 nats on an AVX2 EPYC, 22% of a weight
        # at λ 0.3): here the plan's wiring is what is checked, to float precision
        lead = np.argsort(-off.weights, kind="stable")[:3]
        assert len(lead) >= 2
        c = np.array([channel_logprob(eng, seqs[int(off.ids[i])], query) for i in lead])
        ref = off.weights.astype(np.float64).copy()
        r = off.weights[lead] * np.exp(0.3 * (c - c.max()))
        ref[lead] = r / r.sum() * off.weights[lead].sum()
        np.testing.assert_allclose(on.weights, ref, rtol=1e-4, atol=1e-7)
        assert not np.allclose(on.weights, off.weights, rtol=2e-2)
        # ask() hands its text to the plan
        seen = []
        real = m.plan
        monkeypatch.setattr(m, "plan", lambda st, **kw: seen.append(kw.get("query_text")) or real(st, **kw))
        m.ask(query, max_tokens=2)
        assert seen == [query]
        eng.reset()


def test_the_probe_rule_keeps_the_vote_alone_unless_a_lambda_wins_by_the_margin(tmp_path):
    """bench/rerank.py choose: accuracy is recomputed by hand on rows where PMI helps, hurts or
    ties; the rule returns 0 when no λ beats the vote alone by more than 0.5 points."""
    import json

    from test_split_guard import load_bench

    rr = load_bench("rerank")

    def row(gold, cands, adapted=True):
        return {"gold": gold, "adapted": adapted,
                "cands": [{"answer": a, "w": w, "pmi": p} for a, w, p in cands]}

    # the vote is wrong, a large PMI of the gold answer fixes it at λ >= 0.1 (log 0.6 - log 0.4 = 0.405)
    fixable = row("a", [("b", 0.6, 0.0), ("a", 0.4, 5.0)])
    right = row("a", [("a", 0.9, 0.0), ("b", 0.1, 1.0)])
    declined = row("a", [], adapted=False)
    rows = [fixable, right, declined]
    assert rr.accuracy(rows, 0.0) == pytest.approx(100 / 3)
    assert rr.accuracy(rows, 0.1) == pytest.approx(200 / 3)
    assert rr.accuracy(rows, 0.03) == pytest.approx(100 / 3)  # 0.15 < 0.405: not enough
    f = tmp_path / "wins.json"
    f.write_text(json.dumps({"rows": rows}))
    assert rr.choose([f]) == ("empty", 3, 0.1)
    # PMI pointing the wrong way everywhere: no λ helps and the vote alone is kept
    hurt = [row("a", [("a", 0.6, 0.0), ("b", 0.4, 50.0)]) for _ in range(3)]
    g = tmp_path / "hurts.json"
    g.write_text(json.dumps({"rows": hurt}))
    assert rr.choose([g]) == ("empty", 3, 0.0)
    # the gold answer fourth: only a rerank over four leading answers finds it
    deep = row("a", [("b", 0.4, 0.0), ("c", 0.3, 0.0), ("d", 0.2, 0.0), ("a", 0.1, 9.0)])
    assert rr.accuracy([deep], 0.3, top=3) == 0.0
    assert rr.accuracy([deep], 0.3, top=4) == 100.0  # log 0.4 - log 0.1 = 1.39 < 0.3 * 9
    h = tmp_path / "deep.json"
    h.write_text(json.dumps({"top": 4, "rows": [deep, right]}))
    assert rr.choose([h], tops=(3, 4), shipped=(3, 0.1)) == ("empty", 4, 0.3)
    # a file that recorded three answers cannot score a rerank over four
    with pytest.raises(SystemExit, match="fewer than --tops"):
        rr.choose([f], tops=(3, 4))
    # within the margin of the best, the fewest answers win (each is one more decode per query)
    both = tmp_path / "both.json"
    both.write_text(json.dumps({"top": 4, "rows": [fixable, right]}))
    assert rr.choose([both], tops=(3, 4), shipped=(3, 0.0)) == ("empty", 3, 0.1)


def test_the_probe_rule_grids_baselines_and_guards_each_model(tmp_path):
    """``choose`` with a second baseline: PMI is the continuation's log p minus that baseline's
    recorded prior; a point wins only by the margin, and ``guard`` keeps out a point that costs one
    model's files more than the guard even when the mean gains."""
    import json

    from test_split_guard import load_bench

    rr = load_bench("rerank")

    def cand(a, w, lp, empty, ctx):
        return {"answer": a, "w": w, "lp": lp, "pmi": lp - empty, "prior": {"empty": empty, "replies": ctx}}

    # a hub: against the empty prompt its PMI (-10 + 40 = 30) beats the gold one's (-8 + 30 = 22);
    # against the context baseline the gold's (-8 + 12 = 4) beats the hub's (-10 + 12 = 2)
    hubbed = {"gold": "a", "adapted": True, "cands": [cand("hub", 0.5, -10.0, -40.0, -12.0),
                                                       cand("a", 0.5, -8.0, -30.0, -12.0)]}
    assert rr.pmi(hubbed["cands"][0]) == 30.0 and rr.pmi(hubbed["cands"][0], "replies") == 2.0
    assert rr.accuracy([hubbed], 0.1) == 0.0
    assert rr.accuracy([hubbed], 0.1, baseline="replies") == 100.0
    # the same row the other way round: the context baseline loses it
    fooled = {"gold": "a", "adapted": True, "cands": [cand("a", 0.5, -10.0, -40.0, -5.0),
                                                       cand("b", 0.5, -8.0, -30.0, -12.0)]}
    one, two = tmp_path / "replies-1-12-m1-ctx.json", tmp_path / "replies-1-12-m2-ctx.json"
    one.write_text(json.dumps({"rows": [hubbed] * 4}))
    two.write_text(json.dumps({"rows": [hubbed, hubbed, fooled, fooled]}))
    # m1: empty 0 -> replies 100; m2: empty 50 -> replies 50: the mean gains 50 points
    assert rr.choose([one, two], shipped=(3, 0.1), baselines=("empty", "replies")) == ("replies", 3, 0.01)
    # model 2 loses nothing either way, so a guard of 1 point still lets it through
    assert rr.choose([one, two], shipped=(3, 0.1), baselines=("empty", "replies"), guard=1.0)[0] == "replies"
    two.write_text(json.dumps({"rows": [fooled] * 4}))  # m2: empty 100 -> replies 0
    three = tmp_path / "replies-2-12-m1-ctx.json"
    three.write_text(json.dumps({"rows": [hubbed] * 4}))
    # mean over three files: replies 66.7 against empty 33.3, but m2 loses 100 points: guarded out
    assert rr.choose([one, two, three], shipped=(3, 0.1), baselines=("empty", "replies"))[0] == "replies"
    assert rr.choose([one, two, three], shipped=(3, 0.1), baselines=("empty", "replies"), guard=1.0) == ("empty", 3, 0.1)
    old = tmp_path / "old.json"  # a file probed before the baselines were recorded
    old.write_text(json.dumps({"rows": [{"gold": "a", "adapted": True, "cands": [{"answer": "a", "w": 1.0, "pmi": 0.0}]}]}))
    with pytest.raises(SystemExit, match="no 'replies' baseline"):
        rr.choose([old], baselines=("empty", "replies"))


def test_context_answers_spread_over_distinct_answers():
    from test_split_guard import load_bench

    context_answers = load_bench("rerank").context_answers
    seqs = [[1, 2], [3], [1, 2], [4], [5], [6], [7], [8], [3]]
    # distinct answers by first prototype: 0, 1, 3, 4, 5, 6, 7 (2 and 8 repeat 0 and 1)
    assert context_answers(seqs, 10) == [0, 1, 3, 4, 5, 6, 7]
    assert context_answers(seqs, 6) == [0, 1, 3, 4, 5, 6, 7]
    got = context_answers(seqs, 2)
    assert got == [0, 4, 7]  # positions 0, 3, 6 of the seven
    assert context_answers([], 4) == []


def test_context_priors_are_the_mean_of_whole_decodes_after_each_context(engine):
    """Each answer's baseline against a plain recomputation: one whole decode of context prompt
    plus answer per pair, log-softmax picked by hand, averaged over the answer's first n contexts."""
    from test_split_guard import load_bench

    context_priors = load_bench("rerank").context_priors
    ctxs = [engine.tokenize(f"Question: {q}\nAnswer:") for q in ("where is my card?", "what is a fee?",
                                                                  "how do I top up?")]
    seqs = [engine.tokenize(t, add_bos=False) for t in (" It arrives within a week.", " A small charge.",
                                                        " Use the app to add money.")]
    plan = [(ctxs[0], [1, 2]), (ctxs[1], [0, 2]), (ctxs[2], [0, 1, 2])]
    got = context_priors(engine, plan, seqs, 2)

    def lp(prompt, cont):
        engine.reset()
        z = engine.decode(list(prompt) + list(cont), "all")[len(prompt) - 1:len(prompt) - 1 + len(cont)]
        return float(token_logprobs(z, cont).sum())

    ref = {0: np.mean([lp(ctxs[1], seqs[0]), lp(ctxs[2], seqs[0])]),
           1: np.mean([lp(ctxs[0], seqs[1]), lp(ctxs[2], seqs[1])]),
           2: np.mean([lp(ctxs[0], seqs[2]), lp(ctxs[1], seqs[2])])}  # n = 2: the third context unread
    assert sorted(got) == [0, 1, 2]
    for j in ref:
        assert got[j] == pytest.approx(ref[j], abs=0.4)  # incremental vs whole decodes (see above)
    engine.reset()


def test_the_channel_score_is_the_query_log_p_after_the_answer(engine):
    answer = engine.tokenize(" Freeze the card in the app, then order a new one.", add_bos=False)
    got = channel_logprob(engine, answer, "  I lost my card ")
    ctx = engine.tokenize("Answer: Freeze the card in the app, then order a new one.\nQuestion:")
    q = engine.tokenize(" I lost my card", add_bos=False)
    engine.reset()
    z = engine.decode(ctx + q, "all")[len(ctx) - 1:len(ctx) - 1 + len(q)]
    assert got == pytest.approx(float(token_logprobs(z, q).sum()), abs=0.4)  # incremental vs whole decode
    assert got < 0
    engine.reset()


def test_a_template_with_no_prompt_for_an_empty_input_still_reranks(engine, tmp_path, monkeypatch):
    """A template that is only "{input}" on a model without BOS renders an empty input as no tokens
    at all (SuperNI's on SmolLM2): the prior is read after a newline instead, and nothing fails."""
    from miita_edge.miita import Miita
    from miita_edge.streams import Example

    with Miita(engine=engine, memory=tmp_path / "mem", template="superni") as m:
        m.ingest([Example(f"Summarise: note {i} about the {w}. Output: ", f"A long summary of note {i}: the {w} "
                          "was discussed at length and everyone agreed on the plan.") for i, w in
                  enumerate(["budget", "garden", "holiday", "meeting"])], budget=None, progress=False)
        m.preset.relevance_gate = False
        m.preset.rerank_lambda = 0.1
        real = m.prompt_tokens
        monkeypatch.setattr(m, "prompt_tokens", lambda text: [] if text == "" else real(text))
        toks = real("Summarise: note 9 about the garden. Output: ")
        eng = m.keyed_engine()
        state = eng.query(toks, skip_bos_in_key=m.preset.skip_bos)
        qp = m.plan(state)
        assert len(qp.ids) >= 2 and len(m.retrieval_index().prior) >= 2  # reranked, priors read
        assert eng.n_past == len(toks)
        eng.reset()



def test_preset_stores_and_checks_its_rerank_score():
    from miita_edge.errors import StoreError
    from miita_edge.method.presets import Preset, default_preset

    p = default_preset()
    p.rerank_score = "channel"
    assert Preset.from_json(p.to_json()).rerank_score == "channel"
    with pytest.raises(StoreError, match="rerank_score"):
        Preset.from_json({**p.to_json(), "rerank_score": "bayes"})
