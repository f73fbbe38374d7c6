"""A key pooled from a prompt of its own (``Preset.key_prompt``): the canonical form of an input,
the key template, and, on the embedded model, that a memory keys what it stores and what it is
asked by the same prompt (bitwise), so that a question typed in another case, end mark or spacing
is an exact repeat of the taught one."""
from __future__ import annotations

import re

import numpy as np
import pytest

from miita_edge.errors import InputError, StoreError
from miita_edge.method.presets import default_preset, paper_preset
from miita_edge.method.templates import KEY_PROMPTS, canonical_text, folded_text, get_template, key_template


def reference_canonical(text: str) -> str:
    """The rule in words: split on whitespace and join with one space; drop trailing characters
    from . ? ! ; : , and spaces; lower case; upper-case the first character."""
    words = re.split(r"\s+", text.strip())
    t = " ".join(w for w in words if w)
    while t and t[-1] in ".?!;:, ":
        t = t[:-1]
    t = t.lower()
    return t[:1].upper() + t[1:]


@pytest.mark.parametrize("text", [
    "What is my wifi password?", "what is my wifi password", "WHAT IS MY WIFI PASSWORD?!",
    "What  is my\twifi password .", "  who is my dentist? ", "I was charged twice for one order.",
    "Dr. Okafor, please", "", "?", "ça va?", "Q: 3 + 4 =",
])
def test_canonical_text_is_the_rule_stated_character_by_character(text):
    assert canonical_text(text) == reference_canonical(text)
    assert canonical_text(canonical_text(text)) == canonical_text(text)  # a canonical form is its own


def test_forms_of_one_question_share_a_canonical_text_and_other_words_do_not():
    forms = ["Who is my dentist?", "who is my dentist?", "WHO IS MY DENTIST?", "Who is my dentist",
             "Who is my dentist.", "Who  is  my  dentist?"]
    assert len({canonical_text(f) for f in forms}) == 1
    # the words and their order are what a paraphrase changes: they are kept
    assert canonical_text("Who is my dentist?") != canonical_text("Who is my doctor?")
    assert canonical_text("Is my dentist who?") != canonical_text("Who is my dentist?")
    assert canonical_text("Dr. Okafor is my dentist.") == "Dr. okafor is my dentist"  # inner marks kept


def test_the_memory_key_prompt_is_the_memory_template_itself():
    t = get_template("banking77")
    assert key_template("memory", t) is t


def test_the_meaning_key_prompt_wraps_the_canonical_input_and_cuts_as_the_template_does():
    t = get_template("dsc")  # cuts reviews to 80 words
    k = key_template("meaning", t)
    assert k.name == "dsc+meaning" and k.name != t.name  # caches derived from keys are per template name
    assert k.max_input_words == t.max_input_words and k.special == t.special and k.target == t.target
    long = " ".join(["Great"] * 100) + "!"
    want = KEY_PROMPTS["meaning"].replace("{input}", canonical_text(" ".join(["Great"] * 80)))
    assert k.render_prompt(long) == want
    assert k.render_prompt("WHAT is my PIN?") == KEY_PROMPTS["meaning"].replace("{input}", "What is my pin")
    with pytest.raises(InputError, match="unknown key prompt"):
        key_template("nope", t)


def test_the_canonical_key_prompt_is_the_memory_prompt_with_the_input_folded():
    for name in ("plain", "dsc", "banking77"):
        t = get_template(name)
        k = key_template("canonical", t)
        assert k.name == f"{name}+canonical" and k.prompt == t.prompt and k.canonical and not t.canonical
        assert k.max_input_words == t.max_input_words and k.special == t.special and k.target == t.target
        # every form of one question renders one key prompt; the answer's prompt keeps the text as typed
        forms = ["Who is my dentist?", "who is my dentist", "WHO IS MY DENTIST?", "Who  is my dentist ."]
        assert len({k.render_prompt(f) for f in forms}) == 1
        assert k.render_prompt(forms[0]) == t.prompt.replace("{input}", canonical_text(forms[0]))
        assert len({t.render_prompt(f) for f in forms}) == len(forms)


def reference_folded(text: str) -> str:
    """The rule in words: each maximal run of characters that are blank (str.isspace) and not a
    newline becomes one space; if the text has a letter and no letter of the other case (all lower,
    or all upper), lower case with the first character upper."""
    out, run = [], False
    for c in text:
        if c.isspace() and c != "\n":
            if not run:
                out.append(" ")
            run = True
        else:
            out.append(c)
            run = False
    t = "".join(out)
    letters = [c for c in t if c.isalpha()]
    if letters and (all(c == c.lower() for c in letters) or all(c == c.upper() for c in letters)):
        t = t.lower()
        first = min(i for i, c in enumerate(t) if c.isalpha())  # the first letter, not a leading blank or digit
        t = t[:first] + t[first].upper() + t[first + 1:]
    return t


@pytest.mark.parametrize("text", [
    "What is my wifi password?", "what is my wifi password?", "WHAT IS MY WIFI PASSWORD?",
    "What  is my\twifi password .", "  who is my dentist? ", "Who is Dr. Okafor?", "I was charged twice.",
    "Dialogue: hi\nOutput: ", "3 lost cards?", "  ¿dónde está?",
    "", "?", "123 456", "ça va?", "ÇA VA?", "i lost my card", "iPhone won't charge",
    "Context: A  b.\n\nQuestion:  who?  ", "line one \t\nLINE TWO", "\u00a0odd\u2003blanks here",
])
def test_folded_text_is_the_rule_stated_character_by_character(text):
    assert folded_text(text) == reference_folded(text)
    assert folded_text(folded_text(text)) == folded_text(text)


def test_the_folded_key_prompt_joins_typing_forms_and_keeps_what_may_carry_meaning():
    t = get_template("plain")
    k = key_template("folded", t)
    assert k.name == "plain+folded" and k.prompt == t.prompt and k.folded and not k.canonical
    one = {k.render_prompt(f) for f in ("What is my wifi password?", "what is my wifi password?",
                                        "WHAT IS MY WIFI PASSWORD?", "What is  my wifi password?")}
    assert one == {t.render_prompt("What is my wifi password?")}  # as typed, the answer's own prompt
    # the end mark and mixed-case capitals are kept: they are not only typing
    assert k.render_prompt("What is my wifi password") != k.render_prompt("What is my wifi password?")
    assert k.render_prompt("Who is Dr. Okafor?") == t.render_prompt("Who is Dr. Okafor?")
    # a context's lines are structure, not typing: they stay
    assert folded_text("Context: The cat sat.\n\nQuestion: Where?") == "Context: The cat sat.\n\nQuestion: Where?"


def test_a_preset_refuses_a_key_prompt_it_cannot_key_by():
    p = paper_preset()
    assert p.key_prompt == "memory"
    p.key_prompt = "meaning"  # the paper's corrections are read from the pass that pools the key
    with pytest.raises(StoreError, match="needs the 'tokens' payload"):
        p.validate_keys()
    d = default_preset()
    d.key_prompt = "sentence"
    with pytest.raises(StoreError, match="key_prompt 'sentence'"):
        d.validate_keys()


def _meaning_preset():
    p = default_preset()
    p.key_prompt = "meaning"
    p.validate_keys()
    return p


@pytest.mark.model
def test_a_meaning_memory_stores_and_asks_keys_of_the_key_prompt(engine, tmp_path):
    from miita_edge import Example, Miita
    from miita_edge.method.calibration import raw_key
    from miita_edge.method.extract import prompt_tokens

    facts = [("What is my wifi password?", "tulip-4821"), ("Who is my dentist?", "Dr. Okafor"),
             ("When do the bins go out?", "Thursdays at 7")]
    with Miita(memory=tmp_path / "mem", engine=engine, preset=_meaning_preset()) as m:
        m.ingest([Example(x, y) for x, y in facts], budget="none", progress=False)
        kt = m.pipeline.key_template
        assert kt.name.endswith("+meaning")
        eng = m.keyed_engine()
        # what is stored is the key of the key prompt, prepared as the bank prepares keys
        for j, (x, _) in enumerate(facts):
            want = m.bank.store_key(m.bank.prepare_key(raw_key(eng, kt, x, m.preset.skip_bos))[None])[0]
            assert np.array_equal(m.bank.protos[j].anchors[0], want)
        # the query's key comes from the same prompt, so another form of a taught question is an exact repeat
        ans = m.ask("WHAT IS MY WIFI PASSWORD", max_tokens=8)
        assert ans.adapted and ans.text.strip().startswith("tulip-4821")
        assert m.key_tokens("WHAT IS MY WIFI PASSWORD") == m.key_tokens("What is my wifi password?")
        assert m.key_tokens("who is my dentist") == prompt_tokens(eng, kt, "Who is my dentist?")
        # a caller that passes only the answer's tokens cannot be keyed
        with pytest.raises(InputError, match="ask with the query's text"):
            m.ask_tokens(m.prompt_tokens("Who is my dentist?"), max_tokens=4)


@pytest.mark.model
def test_a_folded_memory_keys_a_prompt_folding_leaves_alone_by_the_answer_pass_bitwise(engine, tmp_path):
    from miita_edge import Example, Miita
    from miita_edge.method.presets import default_preset as dp
    from miita_edge.runtime import key_pass

    p = dp()
    p.key_prompt = "folded"
    p.validate_keys()
    with Miita(memory=tmp_path / "mem", engine=engine, preset=p) as m:
        m.ingest([Example("What is my wifi password?", "tulip-4821")], budget="none", progress=False)
        x = "What is my wifi password?"
        assert m.key_tokens(x) == m.prompt_tokens(x)  # folding changes nothing: no key pass of its own
        state = m.query_state(x)
        eng = m.keyed_engine()
        toks = m.key_tokens(x)
        forced = key_pass.prompt_key(eng, toks, eng.key_mask(toks, p.skip_bos))
        assert np.array_equal(state.key_sum, forced[0])
        # the same question typed in capitals is an exact repeat of the taught one, and is answered
        assert m.key_tokens("WHAT IS MY WIFI PASSWORD?") == m.prompt_tokens(x)
        ans = m.ask("WHAT IS MY WIFI PASSWORD?", max_tokens=8)
        assert ans.adapted and ans.text.strip().startswith("tulip-4821")


@pytest.mark.model
def test_a_memory_keyed_by_its_template_asks_as_before(engine, tmp_path):
    from miita_edge import Example, Miita

    p = default_preset()
    p.key_prompt = "memory"  # the default before version 16
    with Miita(memory=tmp_path / "mem", engine=engine, preset=p) as m:
        m.ingest([Example("What is my wifi password?", "tulip-4821")], budget="none", progress=False)
        assert m.key_tokens("What is my wifi password?") is None
        assert not m.pipeline.own_key_pass
        ans = m.ask_tokens(m.prompt_tokens("What is my wifi password?"), max_tokens=8)
        assert ans.adapted and ans.text.strip().startswith("tulip-4821")


@pytest.mark.model
def test_a_retrieval_without_generation_keys_the_query_as_ask_does(engine, tmp_path):
    """``Miita.query_state`` (the label vote's and the probes' query) takes the key of the key prompt,
    so a plan made from it is the plan ``ask`` makes."""
    from miita_edge import Example, Miita
    from miita_edge.method.calibration import raw_key

    with Miita(memory=tmp_path / "mem", engine=engine, preset=_meaning_preset()) as m:
        m.ingest([Example("What is my wifi password?", "tulip-4821"), Example("Who is my dentist?", "Dr. Okafor")],
                 budget="none", progress=False)
        st = m.query_state("who is my DENTIST")
        want = raw_key(m.keyed_engine(), m.pipeline.key_template, "Who is my dentist?", m.preset.skip_bos)
        assert np.array_equal(st.key, want)
        assert st.tokens == m.prompt_tokens("who is my DENTIST")  # the answer's prompt is what was decoded
        qp = m.plan(st)
        assert qp.gate is None or qp.gate.adapted
        assert int(qp.ids[int(np.argmax(qp.weights))]) == 1  # the dentist's answer, written second
