"""Keys of the folded input (``Preset.key_text = "folded"``, ``templates.fold_text``).

References: the personal-facts benchmark's own generator of case, punctuation and spacing forms
(``evaluation.facts.variants``, written for a different purpose) must fold to one text; a prompt pass
of the typed input must keep the typed prompt's logits and hidden state (the model answers what was
typed) while its key is bitwise the key-only pass of the folded prompt (what an ingest stores).
"""
from __future__ import annotations

import numpy as np
import pytest

from miita_edge.errors import InputError
from miita_edge.evaluation.facts import variants
from miita_edge.method.templates import fold_text, get_template

QUESTIONS = ["What is my wifi password?", "Who is my dentist?", "When did my wife and I get married?",
             "I was charged twice for one order.", "Which size is my ring", "what's our customer number for gas!"]


@pytest.mark.parametrize("q", QUESTIONS)
def test_every_form_of_a_question_folds_to_one_text(q):
    forms = variants(q)
    assert len(forms) >= 4  # lower, upper, end punctuation removed or changed, spaces doubled
    assert {fold_text(v) for v in forms} == {fold_text(q)}


def test_folding_keeps_words_order_and_lines_and_is_idempotent():
    text = "  Context:  The Rhine\tflows NORTH.\n\n   Question: Where does it flow?  "
    assert fold_text(text) == "context: the rhine flows north.\nquestion: where does it flow"
    assert fold_text(fold_text(text)) == fold_text(text)
    assert fold_text("Why?") == "why"
    assert fold_text("??") == "??"  # nothing but punctuation: kept, or the prompt would be empty
    assert fold_text("Straße") == "strasse"  # casefold, not lower


def test_folded_template_renders_the_folded_input_under_its_own_name():
    plain, folded = get_template("plain"), get_template("PLAIN+folded")
    assert folded.name == "plain+folded" and folded.fold_input and not plain.fold_input
    assert folded.render_prompt("Who  IS my dentist?") == plain.render_prompt("who is my dentist")
    assert folded.folded() is folded and folded.render_target("Dr. X") == plain.render_target("Dr. X")
    with pytest.raises(InputError):
        get_template("nope+folded")


def test_key_text_is_validated():
    from miita_edge.errors import StoreError
    from miita_edge.evaluation.ablation import with_candidate

    p = with_candidate("folded-keys")
    assert p.key_text == "folded"
    p.key_text = "shouted"
    with pytest.raises(StoreError, match="key_text"):
        p.validate_keys()


@pytest.fixture(scope="module")
def engine():
    from miita_edge.runtime.engine import Engine, EngineConfig

    eng = Engine(None, EngineConfig(n_ctx=1024, n_batch=512, n_threads=2))
    yield eng
    eng.close()


@pytest.mark.model
def test_the_model_answers_the_typed_prompt_and_keys_the_folded_one(engine, tmp_path):
    from miita_edge.evaluation.ablation import with_candidate
    from miita_edge.miita import Miita
    from miita_edge.runtime import key_pass

    m = Miita(engine=engine, memory=tmp_path / "m", template="plain", preset=with_candidate("folded-keys"))
    typed = "WHAT IS MY WIFI  PASSWORD?"
    st = m.query_state(typed)
    eng = m.keyed_engine()
    frozen = eng.query(m.prompt_tokens(typed), skip_bos_in_key=True)
    np.testing.assert_array_equal(st.logits, frozen.logits)
    np.testing.assert_array_equal(st.h_q, frozen.h_q)
    toks = m.key_tokens(typed)
    assert toks == m.prompt_tokens("what is my wifi password")
    s, n = key_pass.prompt_key(eng, toks, eng.key_mask(toks, True))
    np.testing.assert_array_equal(st.key_sum, s)
    np.testing.assert_array_equal(st.pooled_rows, n)
    assert not np.array_equal(frozen.key_sum, s)  # the typed key differs: folding is what makes them one
    np.testing.assert_array_equal(m.query_state("what is my wifi password").key_sum, s)


@pytest.mark.model
def test_every_form_of_a_question_taught_once_is_its_exact_repeat(engine, tmp_path):
    """With reach limited to exact repeats, a folded memory steers every case, punctuation and
    spacing form of a question taught once (its key is the taught key, bitwise); the typed memory
    steers the question as taught but not its upper-case form."""
    from miita_edge.evaluation.ablation import with_candidate
    from miita_edge.method.presets import default_preset
    from miita_edge.miita import Miita
    from miita_edge.streams import Example

    rows = [Example(q, f"answer {chr(97 + i)}", line=i + 1) for i, q in enumerate(QUESTIONS)]
    typed, folded = default_preset(), with_candidate("folded-keys")
    for p in (typed, folded):
        p.single_reach = "repeat"
    got = {}
    for name, preset in (("typed", typed), ("folded", folded)):
        m = Miita(engine=engine, memory=tmp_path / name, template="plain", preset=preset)
        m.ingest(rows, budget="none", progress=False)
        got[name] = {(r.input, v): m.ask(v, max_tokens=3) for r in rows for v in [r.input] + variants(r.input)}
    for (q, v), ans in got["folded"].items():
        assert ans.adapted, (q, v, ans.reason)
    assert all(got["typed"][q, q].adapted for q in QUESTIONS)
    assert not any(got["typed"][q, q.upper()].adapted for q in QUESTIONS)
