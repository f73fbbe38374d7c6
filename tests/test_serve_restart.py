"""Memories created under ``--memory-root`` outlive the server: a ``miita-edge serve`` subprocess
(a tiny GGUF) creates and teaches memories, stops, and a second one started with the same flags
serves every one of them again at the version it had; ``--max-memories`` counts what is on disk.
The same servers check that no response names a server path (memory names only), that a forget
answers with counts and does not echo the forgotten text, and that ``--allow-unlimited-budget``
lets a client set a budget of ``none``."""
from __future__ import annotations

import json

import pytest

pytest.importorskip("fastapi")

from _serve_server import Server, error_shape, tiny_model  # noqa: E402

FORGET_KEYS = {"memory", "version", "removed_prototypes", "removed_anchors", "removed_examples", "prototypes",
               "anchors", "bytes"}


class Recorder:
    """``Server.request`` that keeps every response body, to search them for server paths."""

    def __init__(self, srv: Server):
        self.srv, self.bodies = srv, []

    def __call__(self, method: str, path: str, body=None):
        st, out = self.srv.request(method, path, body)
        self.bodies.append(json.dumps(out))
        return st, out


def start(tmp_path, name: str, *extra: str) -> Server:
    root = tmp_path / "root"
    return Server("--model", str(tiny_model(tmp_path)), "--memory-root", str(root), "--max-memories", "3",
                  "--ctx", "512", *extra, log=tmp_path / f"{name}.log", threads=1)


def chat(name: str, text: str = "card charged twice") -> dict:
    return {"model": name, "max_tokens": 4, "messages": [{"role": "user", "content": text}]}


def test_created_memories_survive_a_restart(tmp_path):
    s = start(tmp_path, "first")
    call = Recorder(s)
    try:
        assert call("POST", "/v1/memories", {"name": "r1", "budget": "32KiB", "template": "qa"})[0] == 200
        assert call("POST", "/v1/memories", {"name": "r2", "preset": "paper"})[0] == 200
        st, rep = call("POST", "/v1/memories/r1/examples", [{"input": "card charged twice", "output": "billing"},
                                                           {"input": "parcel lost", "output": "shipping"}])
        assert st == 200 and rep["version"] == 2
        before = {n: call("GET", f"/v1/memories/{n}")[1] for n in ("r1", "r2")}
        ids = [m["id"] for m in call("GET", "/v1/models")[1]["data"]]
    finally:
        s.stop()
    s = start(tmp_path, "second")  # the same flags
    call.srv = s
    try:
        assert [m["id"] for m in call("GET", "/v1/models")[1]["data"]] == ids and ids[1].endswith(":r1")
        assert [m["name"] for m in call("GET", "/v1/memories")[1]["data"]] == ["r1", "r2"]
        for n in ("r1", "r2"):
            assert call("GET", f"/v1/models/{n}")[1]["id"].endswith(f":{n}")
            assert call("GET", f"/v1/memories/{n}") == (200, before[n])
        st, out = call("POST", "/v1/chat/completions", chat("r1"))
        assert st == 200 and out["miita"]["memory"] == "r1" and out["miita"]["version"] == 2
        # --max-memories 3 counts the two on disk: one more, then 409
        st, out = call("POST", "/v1/memories", {"name": "r1"})
        assert st == 409 and out["error"]["code"] == "memory_exists" and error_shape(out)
        assert call("POST", "/v1/memories", {"name": "r3"})[0] == 200
        st, out = call("POST", "/v1/memories", {"name": "r4"})
        assert st == 409 and out["error"]["code"] == "too_many_memories" and "3" in out["error"]["message"], out
        _forget_reports_counts(call)
    finally:
        s.stop()
    for text in call.bodies:  # no server path in any response, success or error
        assert str(tmp_path) not in text and str(tmp_path.resolve()) not in text, text[:300]


def _forget_reports_counts(call) -> None:
    """A forget answers with counts and the version, never the stored answer's text; a library
    error names the memory, not its directory."""
    st, out = call("DELETE", "/v1/memories/r1/examples", {"output": "billing"})
    assert st == 200 and set(out) == FORGET_KEYS, out
    assert out["memory"] == "r1" and out["removed_prototypes"] >= 1 and out["removed_examples"] == 1
    assert "billing" not in json.dumps(out)
    assert call("GET", "/v1/memories/r1")[1]["version"] == out["version"]
    st, out = call("POST", "/v1/memories/r2/examples", [{"input": "card charged twice", "output": "billing"}])
    assert st == 200
    st, out = call("DELETE", "/v1/memories/r2/examples", {"output": "billing"})  # the paper preset cannot
    assert st == 400 and error_shape(out) and "cannot forget" in out["error"]["message"], out
    assert out["error"]["message"].startswith("memory r2:"), out


def test_unlimited_budget_with_the_flag(tmp_path):
    """``--allow-unlimited-budget``: a client may create a memory without a limit and lift one by
    a teach (without the flag: 403, tests/test_serve_guard.py)."""
    s = start(tmp_path, "flag", "--allow-unlimited-budget")
    try:
        st, out = s.request("POST", "/v1/memories", {"name": "u", "budget": "none"})
        assert st == 200 and out["budget"] == "none", out
        assert s.request("POST", "/v1/memories", {"name": "w", "budget": "1KiB"})[0] == 200
        st, out = s.request("POST", "/v1/memories/w/examples", {"examples": [{"input": "q", "output": "a"}],
                                                                "budget": "Unlimited"})
        assert st == 200 and out["budget_bytes"] is None, out
        assert s.get("/v1/memories/w")[1]["budget"] == "Unlimited"
    finally:
        s.stop()


def test_memories_under_lists_committed_memories(tmp_path):
    """What a restart serves from --memory-root: subdirectories with a memory's name and a committed
    version (``CURRENT``); not files, odd names or directories without a commit."""
    from miita_edge.serve.memories import memories_under

    for name, current in (("b", True), ("a", True), ("empty", False), (".hidden", True), ("bad name", True)):
        (tmp_path / name).mkdir()
        if current:
            (tmp_path / name / "CURRENT").write_text("v00000001\n")
    (tmp_path / "file").write_text("x")
    assert memories_under(tmp_path) == {"a": tmp_path / "a", "b": tmp_path / "b"}
    assert memories_under(tmp_path / "missing") == {} and memories_under(None) == {}


def test_scrub_paths():
    """Known paths become their public names (longest first), any other absolute path its last
    component; URLs and fractions are left alone. (Only library errors pass through it: the
    server's own messages, such as a 404 naming the route, are not scrubbed.)"""
    from miita_edge.serve.errors import scrub_paths

    names = {"/srv/mem/root/r1": "r1", "/srv/mem/root": "--memory-root"}
    msg = ("memory /srv/mem/root/r1 changed since it was opened; lock /srv/mem/root/r1/LOCK; no memory at "
           "/home/u/other/x2: nothing; root /srv/mem/root")
    assert scrub_paths(msg, names) == ("memory r1 changed since it was opened; lock r1/LOCK; no memory at x2: "
                                       "nothing; root --memory-root")
    for keep in ("see http://127.0.0.1:8080/v1/models", "1/2 of a/b", "ratio 3/4"):
        assert scrub_paths(keep, {}) == keep
