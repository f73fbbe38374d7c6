"""OpenAI client conventions and the supported/refused parameter table (docs/serving.md), on the
app in process with a tiny GGUF: seed -1, max_tokens -1, top_p 0, the stop list adding to the
newline stop, n > 1, logprobs against a numpy re-derivation from the engine's own logits, and a
400 naming each option this server does not implement."""
from __future__ import annotations

import json

import numpy as np
import pytest

pytest.importorskip("fastapi")

from _serve_server import error_shape, tiny_client  # noqa: E402


@pytest.fixture(scope="module")
def client(tmp_path_factory):
    d = tmp_path_factory.mktemp("params")
    with tiny_client(d, memories={"m": d / "m"}) as c:
        yield c


def ask(client, text="card charged twice", path="/v1/chat/completions", **kw):
    body = ({"model": kw.pop("model", "m"), "messages": [{"role": "user", "content": text}], **kw}
            if path.endswith("chat/completions") else {"model": kw.pop("model", "m"), "prompt": text, **kw})
    r = client.post(path, json=body)
    return r.status_code, r.json()


def texts(out) -> list[str]:
    return [c["message"]["content"] for c in out["choices"]]


def test_seed_conventions(client):
    a = [texts(ask(client, temperature=1.0, seed=-1, max_tokens=12)[1])[0] for _ in range(3)]
    assert len(set(a)) > 1, "seed -1 must draw a random seed each time"
    b = [texts(ask(client, temperature=1.0, seed=7, max_tokens=12)[1])[0] for _ in range(2)]
    assert b[0] == b[1]
    st, out = ask(client, temperature=1.0, seed=2**80, max_tokens=4)
    assert st == 200


def test_max_tokens_and_top_p_conventions(client):
    default = ask(client, max_tokens=None, miita={"newline_stop": False, "adapt": False})[1]
    minus = ask(client, max_tokens=-1, miita={"newline_stop": False, "adapt": False})[1]
    assert texts(default) == texts(minus)
    assert minus["usage"]["completion_tokens"] <= 32
    assert minus["usage"]["completion_tokens"] == 32 or minus["choices"][0]["finish_reason"] == "stop"
    greedy = texts(ask(client, temperature=0, max_tokens=10)[1])
    assert texts(ask(client, temperature=2.0, top_p=0, seed=-1, max_tokens=10)[1]) == greedy
    for bad in (0, -2):
        st, out = ask(client, max_tokens=bad)
        assert st == 422 and error_shape(out) and out["error"]["param"] == "max_tokens"


def _cut(free: str, stops: list[str]) -> str:
    """``free`` up to the first stop that starts after its first non-blank character (the server's
    rule: blank lines before a reply do not end it)."""
    body = len(free) - len(free.lstrip())
    hits = [free.find(s, body) for s in stops]
    return free[:min([i for i in hits if i >= 0], default=len(free))] if free.strip() else free


def test_stop_adds_to_the_newline_stop(client):
    """With the newline stop off, find sampled answers holding a newline after some text; the
    default answer for the same seed is that answer cut at that newline, and a user stop cuts at
    whichever comes first."""
    found = 0
    for seed in range(40):
        kw = dict(temperature=1.5, seed=seed, max_tokens=40, model="tiny-llama-untied-q8-0")
        free = texts(ask(client, miita={"newline_stop": False}, **kw)[1])[0]
        if "\n" not in free.lstrip():
            continue
        found += 1
        assert texts(ask(client, **kw)[1])[0] == _cut(free, ["\n"])
        stop = _cut(free, ["\n"]).strip()[-2:] or "\n"
        assert texts(ask(client, stop=[stop], **kw)[1])[0] == _cut(free, ["\n", stop])
        if found >= 3:
            break
    assert found >= 1, "no sampled answer held a newline: the test proved nothing"


@pytest.mark.parametrize("temperature", [5e-324, 2e-308, 1e-300, 1e-30, 0.5, 2.0])
@pytest.mark.parametrize("top_p", [5e-324, 1e-300, 0.0, 0.5, 1.0])
def test_sample_never_gives_nan(temperature, top_p):
    """Every temperature and top_p the API accepts, on ordinary and extreme logits (the float32
    range, ties, -inf, NaN, +inf): a valid token id, no warning (warnings are errors here), and the
    most likely token wherever the limit is greedy (a temperature too small for logits / T to be finite)."""
    from miita_edge.runtime.engine import sample

    big = np.finfo(np.float32).max
    cases = [np.array([1.0, 3.0, 2.0], np.float32), np.array([big, -big, big / 2, 0.0], np.float32),
             np.array([-big, -big, 5.0, 5.0], np.float32), np.array([0.0, -np.inf, 7.0, -np.inf], np.float32),
             np.array([np.nan, 1.0, 2.0], np.float32), np.array([1.0, np.inf, 2.0], np.float32),
             np.linspace(-30, 30, 1000).astype(np.float32)]
    rng = np.random.default_rng(0)
    for logits in cases:
        for _ in range(5):
            tok = sample(logits, temperature, top_p, rng)
            assert 0 <= tok < len(logits) and not np.isnan(logits[tok])
            if temperature < 1e-200 or top_p < 1e-200:
                assert logits[tok] == np.nanmax(logits), (logits, temperature, top_p)  # a top token (ties: any)


def test_extreme_temperature_and_top_p_are_answered(client):
    """The smallest temperatures and top_p the schema allows (5e-324, 2e-308) are answered (they
    were a 500: logits / temperature overflowed to inf and the probabilities to NaN) and, being
    greedy in the limit, give the greedy answer; the largest (2.0, 1.0) are answered too."""
    kw = dict(model="tiny-llama-untied-q8-0", max_tokens=8, miita={"newline_stop": False})
    greedy = texts(ask(client, temperature=0, **kw)[1])
    for extra in ({"temperature": 5e-324}, {"temperature": 2e-308}, {"temperature": 1e-300, "top_p": 0.5},
                  {"temperature": 1.0, "top_p": 5e-324}, {"temperature": 2.0, "top_p": 2e-308}):
        st, out = ask(client, seed=5, **extra, **kw)
        assert st == 200, (extra, out)
        assert texts(out) == greedy, extra
    for path in ("/v1/chat/completions", "/v1/completions"):
        st, out = ask(client, path=path, temperature=2.0, top_p=1.0, seed=-1, **kw)
        assert st == 200, out


def test_n_choices(client):
    st, out = ask(client, n=3, temperature=0, max_tokens=6)
    assert st == 200 and [c["index"] for c in out["choices"]] == [0, 1, 2] and len(set(texts(out))) == 1
    st, out = ask(client, n=3, temperature=1.5, seed=3, max_tokens=10)
    again = ask(client, n=3, temperature=1.5, seed=3, max_tokens=10)[1]
    assert texts(out) == texts(again) and len(set(texts(out))) > 1
    assert out["usage"]["completion_tokens"] == sum(min(10, 10) for _ in range(3)) or out["usage"][
        "completion_tokens"] <= 30
    r = client.post("/v1/chat/completions", json={"model": "m", "n": 2, "temperature": 1.5, "seed": 3,
                                                  "max_tokens": 10, "stream": True,
                                                  "messages": [{"role": "user", "content": "card charged twice"}]})
    assert r.status_code == 200
    got = {0: "", 1: ""}
    for line in r.text.splitlines():
        if line.startswith("data: {"):
            for c in json.loads(line[6:])["choices"]:
                got[c["index"]] += c["delta"].get("content") or ""
    assert [got[0], got[1]] == texts(ask(client, n=2, temperature=1.5, seed=3, max_tokens=10)[1])


def _log_softmax(z: np.ndarray) -> np.ndarray:
    z = z.astype(np.float64)
    return z - (z.max() + np.log(np.sum(np.exp(z - z.max()))))


def test_logprobs_match_the_engine_logits(client):
    """Frozen model, greedy: re-derive each step's log-softmax with numpy from the engine's logits
    (a fresh prompt pass, then one decode per answer token) and compare token by token."""
    st, out = ask(client, model="tiny-llama-untied-q8-0", logprobs=True, top_logprobs=3, max_tokens=8,
                  miita={"newline_stop": False})
    assert st == 200
    rows = out["choices"][0]["logprobs"]["content"]
    reg = client.app.state.registry
    m = reg.memory(None)
    # the entries cover every generated token: the template's leading separator, then the content
    joined = "".join(bytes(r["bytes"]).decode("utf-8", "replace") for r in rows)
    content = out["choices"][0]["message"]["content"]
    assert rows and joined in (content, m.template.lead + content) and not content.startswith(m.template.lead)
    from miita_edge.method.extract import prompt_tokens

    eng = reg.engine
    state = eng.query(prompt_tokens(eng, m.template, "card charged twice", m.max_prompt_tokens))
    logits = state.logits
    for row in rows:
        lp = _log_softmax(logits)
        tok = int(np.argmax(logits))
        assert bytes(row["bytes"]) == eng.token_bytes(tok)
        assert row["logprob"] == pytest.approx(lp[tok], abs=1e-5)
        top = np.argsort(-lp, kind="stable")[:3]
        assert [t["logprob"] for t in row["top_logprobs"]] == pytest.approx(list(lp[top]), abs=1e-5)
        assert [bytes(t["bytes"]) for t in row["top_logprobs"]] == [eng.token_bytes(int(t)) for t in top]
        logits = eng.decode([tok], "last")[0]
    st, out = ask(client, model="tiny-llama-untied-q8-0", path="/v1/completions", logprobs=2, max_tokens=5,
                  miita={"newline_stop": False})
    lp = out["choices"][0]["logprobs"]
    assert st == 200 and len(lp["tokens"]) == len(lp["token_logprobs"]) == len(lp["top_logprobs"]) == 5
    assert lp["token_logprobs"] == pytest.approx([r["logprob"] for r in rows[:5]], abs=1e-6)
    assert all(len(t) <= 2 for t in lp["top_logprobs"])


REFUSED = [  # (extra body, param)
    ({"response_format": {"type": "json_object"}}, "response_format"),
    ({"response_format": {"type": "json_schema", "json_schema": {"name": "x", "schema": {}}}}, "response_format"),
    ({"tools": [{"type": "function", "function": {"name": "f"}}], "tool_choice": "required"}, "tool_choice"),
    ({"tool_choice": {"type": "function", "function": {"name": "f"}}}, "tool_choice"),
    ({"functions": [{"name": "f"}], "function_call": {"name": "f"}}, "function_call"),
    ({"logprobs": True, "stream": True}, "logprobs"),
    ({"top_logprobs": 2}, "top_logprobs"),
    ({"frequency_penalty": 0.5}, "frequency_penalty"),
    ({"presence_penalty": -1.0}, "presence_penalty"),
    ({"logit_bias": {"12": 5}}, "logit_bias"),
    ({"messages": [{"role": "user", "content": [{"type": "text", "text": "hi"},
                                                 {"type": "image_url", "image_url": {"url": "data:,"}}]}]},
     "messages[0].content[1]"),
    ({"messages": [{"role": "user", "content": [{"type": "input_audio", "input_audio": {}}]}]},
     "messages[0].content[0]"),
    ({"messages": [{"role": "user", "content": "hi"}, {"role": "function", "name": "f", "content": "1"}]},
     "messages[1].role"),
    ({"messages": [{"role": "wizard", "content": "hi"}]}, "messages[0].role"),
]


@pytest.mark.parametrize("extra,param", REFUSED, ids=[p for _, p in REFUSED])
def test_refused_parameters_are_named(client, extra, param):
    body = {"model": "m", "max_tokens": 4, "messages": [{"role": "user", "content": "hi"}], **extra}
    r = client.post("/v1/chat/completions", json=body)
    out = r.json()
    assert r.status_code == 400 and error_shape(out), out
    assert out["error"]["param"] == param and out["error"]["code"] == "unsupported_parameter"
    assert param in out["error"]["message"]


@pytest.mark.parametrize("extra,param", [({"echo": True}, "echo"), ({"suffix": "x"}, "suffix"),
                                         ({"best_of": 3}, "best_of")])
def test_refused_completion_parameters(client, extra, param):
    st, out = ask(client, path="/v1/completions", max_tokens=4, **extra)
    assert st == 400 and out["error"]["param"] == param and error_shape(out)


ACCEPTED = [{"response_format": {"type": "text"}}, {"tools": [{"type": "function", "function": {"name": "f"}}]},
            {"tools": [{"type": "function", "function": {"name": "f"}}], "tool_choice": "auto"},
            {"tool_choice": "none"}, {"frequency_penalty": 0, "presence_penalty": 0.0, "logit_bias": {}},
            {"user": "u1", "stream_options": {"include_usage": True}, "parallel_tool_calls": False},
            {"messages": [{"role": "system", "content": "s"}, {"role": "developer", "content": "d"},
                          {"role": "user", "content": "q"},
                          {"role": "assistant", "content": None, "tool_calls": [{"id": "1", "type": "function",
                                                                                  "function": {"name": "f",
                                                                                               "arguments": "{}"}}]},
                          {"role": "tool", "tool_call_id": "1", "content": "42"},
                          {"role": "user", "content": [{"type": "text", "text": "and?"}]}]}]


@pytest.mark.parametrize("extra", ACCEPTED, ids=range(len(ACCEPTED)))
def test_accepted_parameters(client, extra):
    body = {"model": "m", "max_tokens": 4, "messages": [{"role": "user", "content": "hi"}], **extra}
    r = client.post("/v1/chat/completions", json=body)
    assert r.status_code == 200, r.text
    assert r.json()["choices"][0]["message"]["role"] == "assistant"


def test_openapi_declares_bodies_and_responses(client):
    spec = client.get("/openapi.json").json()
    for path, ops in spec["paths"].items():
        for method, op in ops.items():
            ok = op["responses"]["200"]["content"]
            schema = ok.get("application/json", {}).get("schema") or ok.get("text/html", {}).get("schema")
            assert schema is not None and (schema.get("$ref") or path == "/"), (method, path)
            if method in ("post", "delete"):
                assert "requestBody" in op, (method, path)
            for status in ("400", "401", "403", "415", "421") if path != "/" else ():
                assert op["responses"][status]["content"]["application/json"]["schema"]["$ref"].endswith(
                    "/ErrorBody"), (method, path, status)
    teach = spec["paths"]["/v1/memories/{name}/examples"]["post"]["requestBody"]["content"]["application/json"]
    assert {"$ref": "#/components/schemas/TeachObject"} in teach["schema"]["oneOf"]
