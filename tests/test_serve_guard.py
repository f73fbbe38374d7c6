"""Cross-site safety and bad input against a real ``miita-edge serve`` (uvicorn, a tiny GGUF), over
one keep-alive connection: Host (DNS rebinding), Origin, content type, the API key's forms, and
client input that must never be a 500 -- each answer OpenAI-shaped, nothing stored, and the same
connection still serving afterwards."""
from __future__ import annotations

import http.client
import json
import re
import socket
import weakref

import pytest

pytest.importorskip("fastapi")

from _serve_server import API_KEY, Server, error_shape, tiny_model  # noqa: E402

ALLOWED = "http://allowed.example:3000"


@pytest.fixture(scope="module")
def srv(tmp_path_factory):
    d = tmp_path_factory.mktemp("guard")
    model = tiny_model(d)
    s = Server("--model", str(model), "--memory", f"m={d / 'mem' / 'm'}", "--memory-root", str(d / "root"),
               "--max-memories", "2", "--allow-origin", ALLOWED, "--allow-host", "myhost.lan", "--ctx", "512",
               "--max-body", "64KiB", log=d / "server.log", threads=1)
    st, _ = s.request("POST", "/v1/memories/m/examples", [{"input": "card charged twice", "output": "billing"}])
    assert st == 200
    yield s
    s.stop()


class Conn:
    """One keep-alive connection; ``call`` checks it was not reopened."""

    def __init__(self, srv):
        self.c = http.client.HTTPConnection("127.0.0.1", srv.port, timeout=60)
        self.c.connect()
        self.sock = self.c.sock
        weakref.finalize(self, self.c.close)  # closed when the test lets go of it, not left to the GC

    def call(self, method, path, body=None, headers=None, auth=True):
        h = {"Authorization": f"Bearer {API_KEY}"} if auth else {}
        if isinstance(body, (dict, list)):
            body = json.dumps(body).encode()
            h["Content-Type"] = "application/json"
        h.update(headers or {})
        self.c.request(method, path, body=body, headers=h)
        r = self.c.getresponse()
        data = r.read()
        assert self.c.sock is self.sock, f"{method} {path}: the keep-alive connection was closed"
        is_json = (r.getheader("content-type") or "").startswith("application/json")
        return r.status, json.loads(data) if data and is_json else data, r


def version(srv) -> int:
    return srv.get("/v1/memories/m")[1]["version"]


def chat(text="hi", **kw):
    return {"model": "m", "max_tokens": 4, "messages": [{"role": "user", "content": text}], **kw}


def raw_chat(fragment: bytes) -> bytes:
    return b'{"model": "m", "max_tokens": 4, "messages": [{"role": "user", "content": "' + fragment + b'"}]}'


JSON = {"Content-Type": "application/json"}
BAD = [  # (method, path, body, headers, status, code)
    ("GET", "/v1/models", None, {"Host": "evil.example:8080"}, 421, "host_not_allowed"),
    ("GET", "/v1/models", None, {"Host": "127.0.0.1.evil.example"}, 421, "host_not_allowed"),
    ("GET", "/v1/models", None, {"Origin": "http://evil.example"}, 403, "origin_not_allowed"),
    ("GET", "/v1/models", None, {"Origin": "null"}, 403, "origin_not_allowed"),
    ("POST", "/v1/memories/m/examples", b'[{"input": "x", "output": "y"}]', {"Content-Type": "text/plain"}, 415,
     "unsupported_media_type"),
    ("POST", "/v1/memories/m/examples", b"input=x&output=y", {"Content-Type": "application/x-www-form-urlencoded"},
     415, "unsupported_media_type"),
    ("POST", "/v1/memories/m/examples", b'[{"input": "x", "output": "y"}]', {}, 415, "unsupported_media_type"),
    ("DELETE", "/v1/memories/m/examples", b'{"output": "billing"}', {"Content-Type": "text/plain"}, 415, None),
    ("POST", "/v1/memories", b'{"name": "x1"}', {"Content-Type": "text/plain"}, 415, None),
    ("POST", "/v1/memories/m/examples", b'[{"input": "a\\ud800b", "output": "y"}]', JSON, 400, "invalid_unicode"),
    ("POST", "/v1/memories/m/examples", b'[{"input": "ok", "output": "\\udfff"}]', JSON, 400, "invalid_unicode"),
    ("POST", "/v1/chat/completions", raw_chat(b"a\\ud800b"), JSON, 400, "invalid_unicode"),
    ("POST", "/v1/chat/completions", raw_chat(b"\xff\xfe"), JSON, 400, "invalid_utf8"),
    ("POST", "/v1/chat/completions", b"[" * 5000 + b"]" * 5000, JSON, 400, "json_too_deep"),
    ("POST", "/v1/chat/completions", b"[" * 60000, JSON, 400, None),
    ("POST", "/v1/chat/completions", json.dumps(chat(temperature=1e308)).encode(), JSON, 422, None),
    ("POST", "/v1/chat/completions", json.dumps(chat()).replace('"max_tokens": 4', '"temperature": NaN').encode(),
     JSON, 400, "json_invalid"),
    ("POST", "/v1/chat/completions", json.dumps(chat(max_tokens=10**30)).encode(), JSON, 400,
     "context_length_exceeded"),
    ("POST", "/v1/chat/completions", json.dumps(chat(top_p=-0.5)).encode(), JSON, 422, None),
    ("POST", "/v1/chat/completions", json.dumps(chat(n=10**6)).encode(), JSON, 422, None),
    ("GET", "/no/such/route", None, {}, 404, "not_found"),
    ("PUT", "/v1/models", None, {}, 405, "method_not_allowed"),
    ("GET", "/v1/memories/" + "x" * 3000, None, {}, 422, "string_too_long"),
    ("GET", "/v1/memories/" + "x" * 250, None, {}, 404, "memory_not_found"),
    ("POST", "/v1/chat/completions", json.dumps({**chat(), "model": "q" * 200}).encode(), JSON, 404,
     "model_not_found"),
    ("POST", "/v1/memories", b'{"name": "../etc"}', JSON, 422, None),
]


@pytest.mark.parametrize("method,path,body,headers,status,code", BAD,
                         ids=[f"{i}-{s}-{c}" for i, (_, _, _, _, s, c) in enumerate(BAD)])
def test_refused_shaped_nothing_stored_connection_kept(srv, method, path, body, headers, status, code):
    v0 = version(srv)
    conn = Conn(srv)
    st, out, _ = conn.call(method, path, body, headers)
    assert st == status, out
    assert error_shape(out), out
    assert len(out["error"]["message"]) < 400  # bounded: never the whole input or memory list
    if code:
        assert out["error"]["code"] == code, out
    st, out, _ = conn.call("POST", "/v1/chat/completions", chat())  # the same connection still serves
    assert st == 200 and out["choices"][0]["message"]["content"] is not None
    assert version(srv) == v0


ACCEPTED = [
    chat(seed=-1, temperature=1.0), chat(seed=2**70, temperature=1.0), chat(seed=-(2**70), temperature=1.0),
    chat(max_tokens=-1), chat(max_tokens=None), chat(top_p=0, temperature=2.0), chat(temperature=0),
    chat("🦜 ‮rtl‬ zero​width \u0000 nul \U0010ffff 😀"), chat("é" * 100), chat(stop=["zz", "\u2028"]),
    chat(temperature=5e-324), chat(temperature=2e-308), chat(temperature=2.0, top_p=5e-324),
]


@pytest.mark.parametrize("body", ACCEPTED, ids=range(len(ACCEPTED)))
def test_odd_but_valid_input_is_answered(srv, body):
    conn = Conn(srv)
    st, out, _ = conn.call("POST", "/v1/chat/completions", body)
    assert st == 200, out
    assert out["usage"]["completion_tokens"] <= 32


def test_host_and_origin_allowed(srv):
    conn = Conn(srv)
    for h in ({"Host": "myhost.lan:1234"}, {"Host": "localhost"}, {"Host": f"[::1]:{srv.port}"},
              {"Origin": f"http://127.0.0.1:{srv.port}"}):
        st, out, _ = conn.call("GET", "/v1/models", headers=h)
        assert st == 200, (h, out)
    st, out, r = conn.call("GET", "/v1/models", headers={"Origin": ALLOWED})
    assert st == 200 and r.getheader("access-control-allow-origin") == ALLOWED
    st, out, r = conn.call("OPTIONS", "/v1/chat/completions", auth=False, headers={
        "Origin": ALLOWED, "Access-Control-Request-Method": "POST", "Access-Control-Request-Headers": "content-type"})
    assert st == 200 and r.getheader("access-control-allow-origin") == ALLOWED
    st, out, r = conn.call("OPTIONS", "/v1/chat/completions", auth=False, headers={
        "Origin": "http://evil.example", "Access-Control-Request-Method": "POST"})
    assert st == 403 and error_shape(out) and r.getheader("access-control-allow-origin") is None


def test_api_key_forms(srv):
    conn = Conn(srv)
    for value, status in [(f"Bearer {API_KEY}", 200), (f"bearer {API_KEY}", 200), (f"BEARER  {API_KEY} ", 200),
                          (f"Bearer {API_KEY}x", 401), (f"Bearer {API_KEY[:-1]}", 401), (f"Basic {API_KEY}", 401),
                          ("Bearer", 401), ("", 401), ("Bearer é", 401)]:
        st, out, _ = conn.call("GET", "/v1/models", headers={"Authorization": value} if value else {}, auth=False)
        assert st == status, (value, out)
        if status == 401:
            assert error_shape(out) and out["error"]["code"] == "invalid_api_key"
    st, out, _ = conn.call("GET", "/", auth=False)  # the page itself needs no key
    assert st == 200 and b"miita-edge" in out


def test_max_memories(srv):
    conn = Conn(srv)
    for name in ("a1", "a2"):
        st, out, _ = conn.call("POST", "/v1/memories", {"name": name})
        assert st == 200, out
    st, out, _ = conn.call("POST", "/v1/memories", {"name": "a3"})
    assert st == 409 and out["error"]["code"] == "too_many_memories" and error_shape(out)
    st, out, _ = conn.call("GET", "/v1/models")
    assert not any(m["id"].endswith(":a3") for m in out["data"])


def test_no_response_points_to_another_host(srv):
    """Offline by default: no page or schema of this server makes a browser fetch from elsewhere
    (FastAPI's /docs and /redoc load Swagger UI and ReDoc from a CDN; they are not served)."""
    conn = Conn(srv)
    seen = 0
    for path in ("/", "/openapi.json", "/docs", "/redoc", "/docs/oauth2-redirect", "/v1/models", "/v1/memories",
                 "/v1/memories/m", "/no/such/route"):
        st, out, r = conn.call("GET", path)
        text = out.decode("utf-8", "replace") if isinstance(out, bytes) else json.dumps(out)
        urls = re.findall(r"(?:https?:)?//[A-Za-z0-9.\-\[\]:]+", text)
        assert not [u for u in urls if not re.match(r"(?:https?:)?//(127\.0\.0\.1|localhost|\[::1\])(:|$)", u)], (path, urls)
        seen += len(text)
        if path in ("/docs", "/redoc", "/docs/oauth2-redirect"):
            assert st == 404 and error_shape(out), (path, st)
    assert seen > 10000  # the page and the schema were read


@pytest.mark.parametrize("method,path,allow", [
    ("OPTIONS", "/v1/memories", "GET, POST"), ("PUT", "/v1/memories", "GET, POST"), ("PUT", "/v1/models", "GET"),
    ("PATCH", "/v1/memories/m/examples", "DELETE, POST"), ("GET", "/v1/memories/m/examples", "DELETE, POST"),
    ("DELETE", "/v1/memories/m", "GET"), ("POST", "/v1/models/m", "GET"), ("OPTIONS", "/v1/chat/completions", "POST"),
    ("POST", "/", "GET")])
def test_405_allow_lists_every_method_of_the_path(srv, method, path, allow):
    conn = Conn(srv)
    st, out, r = conn.call(method, path)
    assert st == 405 and error_shape(out) and out["error"]["code"] == "method_not_allowed"
    assert r.getheader("allow") == allow


def test_models_retrieve(srv):
    """``GET /v1/models/{id}``: what the openai client's ``models.retrieve`` calls."""
    openai = pytest.importorskip("openai")
    c = srv.client()
    ids = [m.id for m in c.models.list().data]
    for i in ids:
        card = c.models.retrieve(i)
        assert card.id == i and card.object == "model" and card.owned_by == "miita-edge"
    assert c.models.retrieve("m").id == next(i for i in ids if i.endswith(":m"))  # a memory by its bare name
    with pytest.raises(openai.NotFoundError) as e:
        c.models.retrieve("nope")
    assert e.value.body["code"] == "model_not_found"


def _raw(srv, head: bytes, body: bytes) -> tuple[int, bytes]:
    """Send a request's head and ``body`` on a fresh socket, then read until the server closes it;
    a server that neither answers nor closes within 20 s fails the test (socket timeout)."""
    with socket.create_connection(("127.0.0.1", srv.port), timeout=20) as sock:
        sock.sendall(head + b"\r\n" + body)
        data = b""
        while chunk := sock.recv(65536):
            data += chunk
    return int(data.split(b" ", 2)[1]), data


def test_a_body_shorter_than_its_length_is_answered_and_closed(srv):
    """A client that announces more bytes than it sends gets a 408 within seconds (the body
    timeout) and the connection is closed; it was held until the client gave up."""
    head = ("POST /v1/chat/completions HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
            f"Authorization: Bearer {API_KEY}\r\nContent-Length: {{n}}\r\n")
    for n in (50_000_000, 1000):
        st, data = _raw(srv, head.format(n=n).encode(), b"{}")
        assert st == 408 and b"body_timeout" in data and b"connection: close" in data.lower(), data
    assert Conn(srv).call("GET", "/v1/models")[0] == 200  # and the server still serves


def test_a_text_part_that_is_not_a_string_is_named(srv):
    conn = Conn(srv)
    for text, kind in ((5, "number"), (None, "null"), (["x"], "array")):
        st, out, _ = conn.call("POST", "/v1/chat/completions",
                               chat(**{"messages": [{"role": "user", "content": [{"type": "text", "text": text}]}]}))
        assert st == 400 and error_shape(out) and out["error"]["param"] == "messages[0].content[0].text", out
        assert "must be a string" in out["error"]["message"] and kind in out["error"]["message"], out
        assert "not supported" not in out["error"]["message"]


def test_an_unlimited_budget_needs_the_server_flag(srv):
    """Without --allow-unlimited-budget, no client can make a memory unlimited (create or teach):
    403 naming the flag, nothing created or stored."""
    conn = Conn(srv)
    v0 = version(srv)
    for spelling in ("none", "Unlimited", "inf"):
        st, out, _ = conn.call("POST", "/v1/memories", {"name": "u1", "budget": spelling})
        assert st == 403 and error_shape(out) and out["error"]["code"] == "unlimited_budget_not_allowed", out
        assert out["error"]["param"] == "budget" and "--allow-unlimited-budget" in out["error"]["message"]
        st, out, _ = conn.call("POST", "/v1/memories/m/examples",
                               {"examples": [{"input": "q", "output": "a"}], "budget": spelling})
        assert st == 403 and out["error"]["code"] == "unlimited_budget_not_allowed", out
    assert version(srv) == v0 and srv.get("/v1/memories/m")[1]["budget"] != "none"
    assert not any(m["id"].endswith(":u1") for m in conn.call("GET", "/v1/models")[1]["data"])
