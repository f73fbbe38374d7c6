"""Fuzz every operation of the OpenAPI schema (hypothesis; no network) against the app in process on
a tiny GGUF: bodies that are nearly valid (odd values in every field: extreme numbers, lone
surrogates, empty and odd Unicode strings, wrong types), arbitrary JSON, raw bytes, wrong content
types and keys. No response may be a 5xx, every error is OpenAI-shaped, every 200 is the declared
JSON, and the memory stays readable. A fixed number of examples per operation (derandomized, so CI
sees the same cases; 14-30 s in all on the shared 2-core machine)."""
from __future__ import annotations

import json
from urllib.parse import quote

import pytest

pytest.importorskip("fastapi")
hyp = pytest.importorskip("hypothesis")
from hypothesis import HealthCheck, given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402

from _serve_server import error_shape, tiny_client  # noqa: E402

KEY = "fuzz-key"
EXAMPLES = 200

chars = st.characters(blacklist_categories=())  # surrogates included
text = st.one_of(st.text(chars, max_size=40), st.sampled_from(["", " ", "\n", "m", "x:m", "a\ud800b", "\udfff",
                                                               "😀" * 5, "\u202e", "\x00", "../m", "m" * 300]))
numbers = st.one_of(st.integers(min_value=-(2**70), max_value=2**70), st.floats(allow_nan=False),
                    st.sampled_from([-1, 0, 1, 2**63, -(2**63), 1e308, -1e308, 5e-324, 0.5, 2.0, 32]))
leaf = st.one_of(st.none(), st.booleans(), numbers, text)
anything = st.recursive(leaf, lambda c: st.lists(c, max_size=3) | st.dictionaries(st.text(max_size=8), c,
                                                                                    max_size=3), max_leaves=12)
odd = st.one_of(leaf, anything)


def maybe(**fields):
    """Each field present or not, valid-looking or odd."""
    return st.fixed_dictionaries({}, optional={k: st.one_of(v, v, v, odd) for k, v in fields.items()})


words = st.sampled_from(["card charged twice", "hi", "my parcel never arrived", "yo", "é😀 mixed ‮ text"])
def need(**fields):
    """Each field present, mostly valid-looking."""
    return st.fixed_dictionaries({k: st.one_of(v, v, v, odd) for k, v in fields.items()})


part = st.fixed_dictionaries({"type": st.sampled_from(["text", "image_url", "x"]), "text": text})
content = st.one_of(words, words, words, text, st.lists(part, max_size=2), st.none())
roles = ["user"] * 6 + ["system", "assistant", "tool", "function", "x"]
message = st.fixed_dictionaries({"role": st.sampled_from(roles),
                                 "content": content})
unit = st.one_of(st.floats(0, 2), numbers)
common = dict(max_tokens=st.integers(-3, 40), temperature=unit, top_p=unit, seed=numbers,
              stop=st.one_of(text, st.lists(text, max_size=3)), n=st.integers(-1, 3), stream=st.booleans(),
              miita=st.fixed_dictionaries({}, optional={"adapt": st.booleans(), "newline_stop": st.booleans(),
                                                        "background": st.booleans()}))
BODIES = {
    ("post", "/v1/chat/completions"): st.fixed_dictionaries(
        {"model": st.sampled_from(["m", "tiny-llama-untied-q8-0", "x:m"]),
         "messages": st.lists(message, min_size=1, max_size=3)}).flatmap(
        lambda b: maybe(logprobs=st.booleans(), top_logprobs=st.integers(-1, 21), response_format=anything,
                        tools=st.lists(anything, max_size=2), tool_choice=text, **common).map(lambda o: {**b, **o})),
    ("post", "/v1/completions"): st.fixed_dictionaries({"model": st.sampled_from(["m", "x:m"]),
                                                        "prompt": st.one_of(words, text)}).flatmap(
        lambda b: maybe(logprobs=st.integers(-1, 6), echo=st.booleans(), **common).map(lambda o: {**b, **o})),
    ("post", "/v1/memories"): st.tuples(
        need(name=st.one_of(st.sampled_from(["n1", "n2", "n3", "n4"]), text)),
        maybe(budget=st.sampled_from(["64KiB", "1%", "none", "x"]), template=st.sampled_from(["plain", "x"]),
              preset=st.sampled_from(["default", "paper", "x"]))).map(lambda t: {**t[0], **t[1]}),
    ("post", "/v1/memories/{name}/examples"): st.one_of(
        st.lists(need(input=st.one_of(words, text), output=st.one_of(words, text)), max_size=3),
        maybe(examples=st.lists(need(input=st.one_of(words, text), output=st.one_of(words, text)), max_size=2),
              budget=st.sampled_from(["64KiB", "1%", "none", "10", "lots"]))),
    ("delete", "/v1/memories/{name}/examples"): need(output=st.one_of(words, text)),
}


def request_strategy(method: str, path: str):
    good = BODIES.get((method, path), st.none())
    body = st.one_of(good, good, good, anything)
    raw = st.one_of(*[body.map(lambda b: json.dumps(b).encode())] * 5, st.binary(max_size=64))
    ctype = st.sampled_from(["application/json"] * 6 + ["application/json; charset=utf-8", "text/plain", None])
    key = st.sampled_from([f"Bearer {KEY}"] * 6 + [f"bearer {KEY}", "Bearer nope", None])
    name = st.one_of(st.sampled_from(["m", "nope"]), st.text(st.characters(blacklist_categories=("Cs",)),
                                                             min_size=1, max_size=20).map(lambda s: quote(s, safe="")))
    return st.tuples(raw, ctype, key, name)


@pytest.fixture(scope="module")
def client(tmp_path_factory):
    d = tmp_path_factory.mktemp("fuzz")
    with tiny_client(d, memories={"m": d / "m"}, memory_root=d / "root", max_memories=3, api_key=KEY,
                     max_body_bytes=16384) as c:
        h = {"Authorization": f"Bearer {KEY}"}
        assert c.post("/v1/memories/m/examples", json=[{"input": "hi", "output": "yo"}], headers=h).status_code == 200
        yield c


def operations():
    from miita_edge.serve.app import create_app

    spec = create_app().openapi()
    return [(m, p) for p, ops in spec["paths"].items() for m in ops]


@pytest.mark.parametrize("method,path", operations())
def test_fuzz_operation(client, method, path):
    @settings(max_examples=EXAMPLES, deadline=None, derandomize=True, database=None,
              suppress_health_check=list(HealthCheck))
    @given(request_strategy(method, path))
    def run(req):
        raw, ctype, key, name = req
        headers = {k: v for k, v in (("Content-Type", ctype), ("Authorization", key)) if v is not None}
        url = path.replace("{name}", name)
        r = client.request(method.upper(), url, content=raw if method != "get" else None, headers=headers)
        assert r.status_code < 500, (method, url, raw[:200], r.text[:500])
        if r.status_code >= 400:
            assert error_shape(r.json()), r.text[:500]
        elif r.headers["content-type"].startswith("application/json"):
            assert isinstance(r.json(), dict)
        else:
            assert r.headers["content-type"].startswith(("text/event-stream", "text/html")), r.headers

    run()
    h = {"Authorization": f"Bearer {KEY}"}
    info = client.get("/v1/memories/m", headers=h)
    # still readable and consistent (a fuzzed forget may legitimately remove every taught answer)
    js = info.json()
    assert info.status_code == 200 and isinstance(js["examples"], int) and js["examples"] >= 0 and js["version"] >= 1
