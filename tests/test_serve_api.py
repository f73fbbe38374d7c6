"""The OpenAI-compatible server, driven by the real ``openai`` client against a subprocess
(``miita-edge serve`` on 127.0.0.1, a free port): chat and completions, streamed and not; teach ->
ask on the demo stream (the taught answer only with adapt on); forget; the bad inputs of
docs/serving.md ("Bad input": OpenAI-style error JSON, right status, nothing stored, still serving).
One server for the module."""
from __future__ import annotations

import json

import pytest

pytest.importorskip("fastapi")
openai = pytest.importorskip("openai")

from _serve_server import Server, demo_rows  # noqa: E402

pytestmark = pytest.mark.model
N_TEACH = 60


@pytest.fixture(scope="module")
def srv(tmp_path_factory):
    d = tmp_path_factory.mktemp("serve")
    s = Server("--memory", f"demo={d / 'demo'}", "--memory", f"other={d / 'other'}", "--memory-root", str(d),
               "--max-body", "64KiB", log=d / "server.log")
    yield s
    s.stop()


@pytest.fixture(scope="module")
def taught(srv):
    """The demo memory taught the first N_TEACH training rows of the demo stream (one POST)."""
    rows = [{"input": r["input"], "output": r["output"]} for r in demo_rows()[:N_TEACH]]
    st, rep = srv.request("POST", "/v1/memories/demo/examples", rows)
    assert st == 200, rep
    assert rep["examples"] == N_TEACH and rep["version"] == 1 and rep["prototypes"] > 0
    return rows


def chat(client, model, text, adapt=True, **kw):
    return client.chat.completions.create(model=model, messages=[{"role": "user", "content": text}],
                                          max_tokens=kw.pop("max_tokens", 8), extra_body={"miita": {"adapt": adapt}},
                                          **kw)


def test_models_lists_model_and_memories(srv):
    ids = [m.id for m in srv.client().models.list().data]
    assert len(ids) == 3 and ids[1].endswith(":demo") and ids[2].endswith(":other")


def test_frozen_chat_and_completion(srv):
    c = srv.client()
    r = chat(c, srv.client().models.list().data[0].id, "Say hello.")
    assert r.object == "chat.completion" and r.choices[0].finish_reason in ("stop", "length")
    assert r.usage.prompt_tokens > 0 and 1 <= r.usage.completion_tokens <= 8
    assert r.usage.total_tokens == r.usage.prompt_tokens + r.usage.completion_tokens
    assert r.model_extra["miita"]["adapted"] is False
    r = c.completions.create(model="demo", prompt="The capital of France is", max_tokens=4, stop=["."])
    assert r.object == "text_completion" and r.usage.completion_tokens <= 4
    assert r.choices[0].finish_reason in ("stop", "length")


def test_teach_then_ask_round_trip(srv, taught):
    """On the demo stream: test queries whose answer was taught are steered by taught answers only,
    or, where the answer nearest them is not trusted, left to the frozen model with the reason; most
    are steered and get the taught answer."""
    c = srv.client()
    taught_outputs = {r["output"] for r in taught}
    tests = [r for r in demo_rows("test") if r["output"] in taught_outputs][:10]
    hits_on = hits_off = adapted = 0
    for r in tests:
        on = chat(c, "gemma:demo", r["input"])
        off = chat(c, "gemma:demo", r["input"], adapt=False)
        x = on.model_extra["miita"]
        assert x["version"] == 1 and x["memory"] == "demo"
        if x["adapted"]:
            adapted += 1
            assert x["steered_by"] and all(s["answer"].strip() in taught_outputs for s in x["steered_by"])
            assert 1 <= len(x["alphas"]) <= on.usage.completion_tokens
        else:
            assert x["reason"], x
        assert off.model_extra["miita"]["adapted"] is False
        hits_on += on.choices[0].message.content.strip() == r["output"]
        hits_off += off.choices[0].message.content.strip() == r["output"]
    assert hits_off == 0, "the frozen model already knows these labels: the round trip would prove nothing"
    assert hits_on >= len(tests) // 2 and adapted >= len(tests) // 2, (hits_on, adapted, len(tests))


def test_streamed_equals_unstreamed(srv, taught):
    c = srv.client()
    q = demo_rows("test")[0]["input"]
    full = chat(c, "demo", q)
    chunks = list(chat(c, "demo", q, stream=True))
    text = "".join(ch.choices[0].delta.content or "" for ch in chunks if ch.choices)
    assert text == full.choices[0].message.content and text.strip()
    last = chunks[-1]
    assert last.choices[0].finish_reason == full.choices[0].finish_reason
    assert last.model_extra["miita"].get("steered_by") == full.model_extra["miita"].get("steered_by")
    assert last.model_extra["miita"]["adapted"] == full.model_extra["miita"]["adapted"]
    comp = list(srv.client().completions.create(model="demo", prompt=q, max_tokens=8, stream=True))
    assert "".join(ch.choices[0].text for ch in comp) == full.choices[0].message.content


def test_a_frozen_reply_that_opens_with_a_blank_line_is_not_empty(srv):
    """The bundled Gemma opens its greedy reply to this chat with a newline; the newline stop ends a
    reply only after text, so the user reads the line after it, streamed or not (measured: "" when a
    stop could end the reply anywhere)."""
    c = srv.client()
    q = "My card was charged twice for one purchase."
    model = c.models.list().data[0].id
    full = chat(c, model, q, max_tokens=12)
    assert full.choices[0].message.content.startswith("\n") and full.choices[0].message.content.strip()
    chunks = list(chat(c, model, q, max_tokens=12, stream=True))
    assert "".join(ch.choices[0].delta.content or "" for ch in chunks if ch.choices) == full.choices[0].message.content


def test_chat_key_is_last_user_turn(srv, taught):
    """The key text in chat mode is the last user turn: earlier turns do not change the answer."""
    c = srv.client()
    q = taught[0]["input"]
    plain = chat(c, "demo", q)
    long = c.chat.completions.create(model="demo", max_tokens=8, messages=[
        {"role": "system", "content": "You are terse."}, {"role": "user", "content": "What's up?"},
        {"role": "assistant", "content": "Not much."}, {"role": "user", "content": q}])
    assert long.choices[0].message.content == plain.choices[0].message.content
    assert long.model_extra["miita"]["steered_by"] == plain.model_extra["miita"]["steered_by"]


def test_forget_removes_the_answer(srv, taught):
    c = srv.client()
    tests = [r for r in demo_rows("test") if r["output"] in {t["output"] for t in taught}]
    q = next(r for r in tests if chat(c, "demo", r["input"]).choices[0].message.content.strip() == r["output"])
    st, before = srv.get("/v1/memories/demo")
    st, rep = srv.request("DELETE", "/v1/memories/demo/examples", {"output": q["output"]})
    assert st == 200 and rep["removed_prototypes"] >= 1 and rep["version"] == before["version"] + 1
    assert rep["removed_examples"] == sum(t["output"] == q["output"] for t in taught)
    after = chat(c, "demo", q["input"])
    x = after.model_extra["miita"]
    assert x["version"] == rep["version"]
    assert after.choices[0].message.content.strip() != q["output"]
    assert all(s["answer"].strip() != q["output"] for s in x.get("steered_by", []))
    st, again = srv.request("DELETE", "/v1/memories/demo/examples", {"output": q["output"]})
    assert st == 200 and again["removed_prototypes"] == 0 and again["version"] == rep["version"]


def test_create_memory_and_info(srv):
    st, out = srv.request("POST", "/v1/memories", {"name": "fresh", "budget": "32KiB", "template": "plain"})
    assert st == 200 and out["version"] == 1 and out["prototypes"] == 0 and out["budget"] == "32KiB"
    st, out = srv.request("POST", "/v1/memories", {"name": "fresh"})
    assert st == 409 and out["error"]["code"] == "memory_exists"
    st, out = srv.request("POST", "/v1/memories/fresh/examples", [{"input": "my parcel never arrived",
                                                                   "output": "shipping desk"}])
    assert st == 200 and out["version"] == 2 and out["budget_bytes"] == 32 * 1024
    r = chat(srv.client(), "fresh", "my parcel never arrived")
    assert r.model_extra["miita"]["steered_by"][0]["answer"].strip() == "shipping desk"


def _err(srv, st, body, status, code=None):
    assert st == status, body
    assert set(body) == {"error"} and body["error"]["message"] and "Traceback" not in json.dumps(body)
    if code:
        assert body["error"]["code"] == code, body


BAD_CHAT = [
    (b'{"model": "demo", "messages": [', 400, "json_invalid"),
    (json.dumps({"model": "demo", "messages": "hi"}).encode(), 422, None),
    (json.dumps({"model": "demo"}).encode(), 422, "missing"),
    (json.dumps({"model": "nope", "messages": [{"role": "user", "content": "hi"}]}).encode(), 404, "model_not_found"),
    (json.dumps({"model": "demo", "messages": []}).encode(), 422, "too_short"),
    (json.dumps({"model": "demo", "max_tokens": 0, "messages": [{"role": "user", "content": "hi"}]}).encode(), 422,
     None),
    (json.dumps({"model": "demo", "max_tokens": -3, "messages": [{"role": "user", "content": "hi"}]}).encode(), 422,
     None),
    (json.dumps({"model": "demo", "max_tokens": 5000, "messages": [{"role": "user", "content": "hi"}]}).encode(),
     400, "context_length_exceeded"),
    (json.dumps({"model": "demo", "messages": [{"role": "assistant", "content": "hi"}]}).encode(), 400, None),
    (json.dumps({"model": "demo", "messages": [{"role": "user", "content": "x" * 70000}]}).encode(), 413,
     "body_too_large"),
]


@pytest.mark.parametrize("raw,status,code", BAD_CHAT, ids=[f"{s}-{c}-{i}" for i, (_, s, c) in enumerate(BAD_CHAT)])
def test_bad_chat_requests(srv, taught, raw, status, code):
    st, body = srv.request("POST", "/v1/chat/completions", raw=raw)
    _err(srv, st, body, status, code)
    st, body = srv.request("POST", "/v1/chat/completions", raw=raw.replace(b'"messages"', b'"stream": true, "messages"'))
    _err(srv, st, body, status, code)  # streamed: the same error, before any chunk


def test_bad_input_through_the_client(srv):
    with pytest.raises(openai.NotFoundError):
        chat(srv.client(), "gemma:nope", "hi")
    with pytest.raises(openai.BadRequestError) as e:
        chat(srv.client(), "demo", "hi", max_tokens=100000)
    assert e.value.body["code"] == "context_length_exceeded"
    bad = openai.OpenAI(base_url=srv.url + "/v1", api_key="wrong", max_retries=0)
    with pytest.raises(openai.AuthenticationError):
        bad.models.list()
    st, body = srv.request("GET", "/v1/memories/demo", headers={"Authorization": "Bearer wrong"})
    _err(srv, st, body, 401, "invalid_api_key")


BAD_TEACH = [
    ("demo", b"[{", 400, "json_invalid", None),
    ("demo", b"[]", 422, None, None),
    ("demo", b'{"input": "a", "output": "b"}', 422, None, None),
    ("demo", json.dumps([{"input": "a", "output": "b"}, {"input": "c"}]).encode(), 422, None, "examples[1].output"),
    ("demo", json.dumps([{"input": "a", "output": "b"}, {"input": "", "output": "d"}]).encode(), 422, None,
     "examples[1].input"),
    ("demo", json.dumps([{"input": "a", "output": "b"}, "row"]).encode(), 422, None, "examples[1]"),
    ("demo", json.dumps({"examples": [{"input": "a", "output": "b"}], "budget": "10"}).encode(), 422,
     "budget_exceeded", None),
    ("demo", json.dumps({"examples": [{"input": "a", "output": "b"}], "budget": "lots"}).encode(), 422, None, "budget"),
    ("nope", json.dumps([{"input": "a", "output": "b"}]).encode(), 404, "memory_not_found", None),
    ("demo", json.dumps([{"input": "a" * 70000, "output": "b"}]).encode(), 413, "body_too_large", None),
]


@pytest.mark.parametrize("name,raw,status,code,param", BAD_TEACH,
                         ids=[f"{s}-{i}" for i, (_, _, s, _, _) in enumerate(BAD_TEACH)])
def test_bad_teach_stores_nothing(srv, taught, name, raw, status, code, param):
    st0, before = srv.get("/v1/memories/demo")
    st, body = srv.request("POST", f"/v1/memories/{name}/examples", raw=raw)
    _err(srv, st, body, status, code)
    if param:
        assert body["error"]["param"] == param and param in body["error"]["message"]
    st1, after = srv.get("/v1/memories/demo")
    assert st0 == st1 == 200 and after == before  # nothing stored (same version, counts, bytes, budget)
    assert chat(srv.client(), "demo", "still serving?").choices  # and the server keeps serving


def test_bad_forget_and_memory_requests(srv, taught):
    st, before = srv.get("/v1/memories/demo")
    for path, body, status in [("/v1/memories/demo/examples", {"output": ""}, 422),
                               ("/v1/memories/demo/examples", {"answer": "x"}, 422),
                               ("/v1/memories/nope/examples", {"output": "x"}, 404)]:
        st, out = srv.request("DELETE", path, body)
        _err(srv, st, out, status)
    for body, status in [({"name": "../x"}, 422), ({"name": "ok2", "budget": "lots"}, 422),
                         ({"name": "ok3", "template": "nope"}, 422)]:
        st, out = srv.request("POST", "/v1/memories", body)
        _err(srv, st, out, status)
    st, out = srv.get("/v1/memories/nope")
    _err(srv, st, out, 404, "memory_not_found")
    assert srv.get("/v1/memories/demo") == (200, before)
    assert "ok2" not in [m.id.split(":")[-1] for m in srv.client().models.list().data]


def test_chat_template_renderer():
    """A GGUF chat template (Jinja, sandboxed) renders the whole conversation for frozen requests."""
    from miita_edge.serve.chat import last_user_text, render_chat_template
    from miita_edge.serve.types import Message

    msgs = [Message(role="system", content="be brief"), Message(role="user", content="hi"),
            Message(role="assistant", content="hello"), Message(role="user", content=[{"type": "text", "text": "bye"}])]
    tmpl = ("{{ bos_token }}{% for m in messages %}<{{ m['role'] }}>{{ m['content'] }}</s>{% endfor %}"
            "{% if add_generation_prompt %}<assistant>{% endif %}")
    assert render_chat_template(tmpl, msgs, bos="<b>") == ("<b><system>be brief</s><user>hi</s><assistant>hello</s>"
                                                           "<user>bye</s><assistant>")
    assert last_user_text(msgs) == "bye"
    from jinja2.exceptions import SecurityError

    with pytest.raises(SecurityError):  # sandboxed: a template cannot reach Python internals
        render_chat_template("{{ messages.__class__.__init__.__globals__ }}", msgs)
