"""How long a reply is when the request says nothing (Open WebUI sends no ``max_tokens``): on the
embedded model, through the HTTP API, a taught answer longer than the default 32 tokens comes back
whole, and so does a taught multi-line answer (the server's newline stop passes the newlines
inside the taught answer the reply follows), streamed or not; a request's own ``max_tokens`` or
``"\\n"`` stop still cuts them. One server for the module."""
from __future__ import annotations

import json
import urllib.request

import pytest

pytest.importorskip("fastapi")

from _serve_server import Server  # noqa: E402

pytestmark = pytest.mark.model
LONG_Q = "How do I reset my router?"
LONG_A = ("Unplug the router, wait thirty seconds, plug it back in, then hold the reset button on the back for "
          "ten seconds until the lights blink and log in again with the password printed on its label.")
LIST_Q = "What do I need to travel to Japan?"
LIST_A = "You need:\n- a valid passport\n- a return ticket\n- proof of accommodation"


@pytest.fixture(scope="module")
def srv(tmp_path_factory):
    d = tmp_path_factory.mktemp("length")
    s = Server("--memory", f"help={d / 'help'}", log=d / "server.log")
    st, rep = s.request("POST", "/v1/memories/help/examples",
                        [{"input": LONG_Q, "output": LONG_A}, {"input": LIST_Q, "output": LIST_A}])
    assert st == 200, rep
    yield s
    s.stop()


def ask(srv, question: str, stream: bool = False, **extra) -> tuple[str, str, dict, dict]:
    """(content, finish_reason, usage, miita) of a chat request as Open WebUI sends it: no max_tokens."""
    body = {"model": "x:help", "messages": [{"role": "user", "content": question}], "stream": stream, **extra}
    if not stream:
        st, out = srv.request("POST", "/v1/chat/completions", body)
        assert st == 200, out
        c = out["choices"][0]
        return c["message"]["content"], c["finish_reason"], out["usage"], out["miita"]
    req = urllib.request.Request(srv.url + "/v1/chat/completions", data=json.dumps(body).encode(), method="POST",
                                 headers={"Content-Type": "application/json", **srv.headers()})
    with urllib.request.urlopen(req, timeout=120) as r:
        chunks = [json.loads(line[5:]) for line in (raw.decode().strip() for raw in r)
                  if line.startswith("data:") and line != "data: [DONE]"]
    text = "".join((c["choices"][0].get("delta") or {}).get("content") or "" for c in chunks if c.get("choices"))
    return text, chunks[-1]["choices"][0]["finish_reason"], chunks[-1]["usage"], chunks[-1]["miita"]


def test_the_taught_answers_are_longer_than_the_default(srv):

    _, _, usage, _ = ask(srv, LONG_Q, max_tokens=32)
    assert usage["completion_tokens"] == 32, "the long answer must need more than the old default of 32 tokens"


@pytest.mark.parametrize("stream", [False, True])
def test_a_long_taught_answer_comes_back_whole(srv, stream):
    text, finish, usage, miita = ask(srv, LONG_Q, stream)
    assert miita["adapted"] and miita["steered_by"][0]["answer"] == LONG_A
    assert text.strip() == LONG_A, text
    assert finish == "stop" and usage["completion_tokens"] > 32


@pytest.mark.parametrize("stream", [False, True])
def test_a_multi_line_taught_answer_comes_back_whole(srv, stream):
    text, finish, _, miita = ask(srv, LIST_Q, stream)
    assert miita["adapted"] and miita["steered_by"][0]["answer"] == LIST_A
    assert text.strip() == LIST_A, text
    assert finish == "stop"


def test_the_requests_own_limits_still_cut(srv):
    text, finish, usage, _ = ask(srv, LONG_Q, max_tokens=32)
    assert finish == "length" and usage["completion_tokens"] == 32 and LONG_A.startswith(text.strip())
    text, finish, _, _ = ask(srv, LIST_Q, stop=["\n"])  # a stop the request asked for is honoured
    assert text.strip() == "You need:" and finish == "stop"
    text, _, _, _ = ask(srv, LIST_Q, max_tokens=3)
    assert len(text) < len("You need:\n- a")


def test_newline_end_rule():
    """Pure: where the newline stop ends a reply, given the taught answers it may follow."""
    from miita_edge.serve.answer import newline_end

    taught = ["You need:\n- a passport\n- a visa"]
    assert newline_end("You need:\n- a passport\n- a visa\nAnd more", taught) == len(taught[0])
    assert newline_end("You need:\n- a ticket\n- more", taught) == len("You need:\n- a ticket")
    assert newline_end("Other\nlines", taught) == len("Other")
    assert newline_end("\nYou need:\n- a passport", taught) == -1  # a leading newline is no end
    assert newline_end("no newline", taught) == -1
    assert newline_end("You need:\nx", []) == len("You need:")
