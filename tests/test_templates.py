"""Tests of templates.py: exact rendering, truncation, unknown names."""
from __future__ import annotations

import json
from pathlib import Path

import pytest

from miita_edge.errors import InputError
from miita_edge.method.templates import TEMPLATES, Template, get_template, strip_lead, truncate_words


@pytest.mark.parametrize("name,x,prompt", [
    ("plain", "2+2?", "2+2?\nAnswer:"),
    ("banking77", "Where is my card?",
     "Classify the banking customer query into an intent.\nQuery: Where is my card?\nIntent:"),
    ("dsc", "Great blender .",
     "Classify the sentiment of the product review.\nReview: Great blender .\nSentiment:"),
    ("qa", "Context: Paris is in France.\nQuestion: Where is Paris?",
     "Answer the question with a short span copied from the context.\n"
     "Context: Paris is in France.\nQuestion: Where is Paris?\nAnswer:"),
    ("superni", "Definition: Say hi.\n\nNow complete the following example -\nInput: x\nOutput: ",
     "Definition: Say hi.\n\nNow complete the following example -\nInput: x\nOutput: "),
])
def test_render_prompt_exact(name, x, prompt):
    assert get_template(name).render_prompt(x) == prompt


@pytest.mark.parametrize("name,target", [
    ("plain", " yes\n"), ("banking77", " yes\n"), ("dsc", " yes\n"), ("qa", " yes\n"), ("superni", "yes\n"),
])
def test_render_target_ends_in_stop_newline(name, target):
    assert get_template(name).render_target("yes") == target


def test_braces_in_input_are_literal():
    t = get_template("plain")
    assert t.render_prompt('{"a": {output}} {input} {0}') == '{"a": {output}} {input} {0}\nAnswer:'
    assert t.render_target("{input}") == " {input}\n"


def test_dsc_truncates_to_80_words():
    t = get_template("dsc")
    assert t.max_input_words == 80
    words = [f"w{i}" for i in range(200)]
    long = "  ".join(words[:100]) + "\n"
    p = t.render_prompt(long)
    body = p.split("Review: ", 1)[1].rsplit("\nSentiment:", 1)[0]
    assert body == " ".join(words[:80])
    exact = " ".join(words[:81])
    assert t.render_prompt(exact).count("w79") == 1 and "w80" not in t.render_prompt(exact)
    short = "keep   this\tspacing"
    assert short in t.render_prompt(short)  # fits: untouched
    assert get_template("plain").render_prompt(" ".join(words)).count(" ") == 199  # no limit


def test_truncate_words_helper():
    assert truncate_words("a b c d", 2) == "a b"
    assert truncate_words(" a\n b ", 2) == " a\n b "
    assert truncate_words("", 3) == ""


def test_unknown_template_lists_known_names():
    with pytest.raises(InputError) as ei:
        get_template("bank")
    msg = str(ei.value)
    assert "\n" not in msg and "'bank'" in msg
    for name in ("banking77", "dsc", "plain", "qa", "superni"):
        assert name in msg
    assert get_template(" DSC ") is TEMPLATES["dsc"]


def test_template_invariants():
    assert set(TEMPLATES) == {"plain", "banking77", "dsc", "qa", "superni"}
    for name, t in TEMPLATES.items():
        assert t.name == name
    with pytest.raises(ValueError):
        Template("x", "no slot", " {output}\n")
    with pytest.raises(ValueError):
        Template("x", "{input}", " {output}")
    with pytest.raises(ValueError):
        Template("x", "{input}{input}", " {output}\n")
    with pytest.raises(ValueError):
        Template("x", "{input}", " {output}\n", max_input_words=0)


@pytest.mark.parametrize("folder,name", [
    ("banking77", "banking77"), ("dsc", "dsc"), ("paxqa_substitute_xquad", "qa"), ("superni", "superni"),
])
def test_templates_fit_shared_data_if_present(folder, name):
    f = Path("/work/shared/data") / folder / "train.jsonl"
    if not f.is_file():
        pytest.skip("shared data not present")
    t = get_template(name)
    with f.open(encoding="utf-8") as fh:
        rows = [json.loads(next(fh)) for _ in range(20)]
    for r in rows:
        p = t.render_prompt(r["input"])
        if name == "qa":
            assert p.startswith("Answer the question with a short span copied from the context.\nContext: ")
            assert "Context: Context:" not in p and "\nQuestion: " in p
        if name == "superni":
            assert p.endswith("Output: ") and not t.render_target(r["output"]).startswith(" ")
        else:
            assert not p.endswith(" ")  # the target supplies the space


CHATML = ("{% for message in messages %}{{'<|im_start|>' + message['role'] + '\n' + message['content'] + "
          "'<|im_end|>' + '\n'}}{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}")


def test_a_chat_template_renders_one_user_turn():
    from miita_edge.method.templates import chat_template

    t = chat_template(CHATML)
    assert t.special and t.name == "chat"
    assert t.render_prompt("where is my card") == "<|im_start|>user\nwhere is my card<|im_end|>\n<|im_start|>assistant\n"
    assert t.render_target("card arrival") == "card arrival\n"


def test_template_resolution_follows_the_model():
    from miita_edge.errors import InputError
    from miita_edge.method.templates import resolve_template

    assert resolve_template(None, None).name == "plain"
    assert resolve_template("auto", CHATML).name == "chat"
    assert resolve_template(None, CHATML).special
    assert resolve_template("banking77", CHATML).name == "banking77"
    with pytest.raises(InputError, match="no chat template"):
        resolve_template("chat", None)
    with pytest.raises(InputError, match="cannot be rendered"):
        resolve_template("chat", "{% for %}")
    with pytest.raises(InputError, match="exactly once"):
        resolve_template("chat", "no messages here")


def test_the_leading_separator_is_what_precedes_the_output():
    assert TEMPLATES["plain"].lead == " " and TEMPLATES["superni"].lead == ""
    assert Template("t", "{input}", ">> {output}\n").lead == ">> "


@pytest.mark.parametrize("text,lead,expect", [
    (" card arrival", " ", (" ", "card arrival")),
    ("card arrival", " ", ("", "card arrival")),   # a model that skipped the separator keeps its text
    ("", " ", ("", "")),                           # the first token ended the answer
    ("  two spaces", " ", ("  ", "two spaces")),   # a space separator takes every leading space
    ("\tx", " ", ("", "\tx")),                     # ... and nothing else
    (">>  x", ">> ", (">> ", " x")),               # any other separator: only itself
    (">", ">> ", (">", "")),                       # a stream still inside the separator shows nothing
    (">> x", ">> ", (">> ", "x")),
    ("> x", ">> ", ("", "> x")),
    (" x", "", ("", " x")),
])
def test_strip_lead(text, lead, expect):
    assert strip_lead(text, lead) == expect
    # every streamed prefix shows a prefix of the final reply
    final = strip_lead(text, lead)[1]
    assert all(final.startswith(strip_lead(text[:i], lead)[1]) for i in range(len(text) + 1))
