"""Work nobody waits for stops, on the real model (docs/serving.md, "Teach jobs" and "Stopping"):
a streamed answer whose client has gone stops at its next token; a waited teach whose client has
gone is cancelled and commits nothing; SIGTERM stops a server that is teaching, streaming and
answering within seconds, its teach job cancelled with nothing committed. Answers are served
between a running job's batches. The first tests run the app on uvicorn in a thread of this
process (to read its log records); the SIGTERM test runs ``miita-edge serve`` as a subprocess."""
from __future__ import annotations

import http.client
import json
import logging
import socket
import threading
import time
from contextlib import contextmanager

import pytest

pytest.importorskip("fastapi")
uvicorn = pytest.importorskip("uvicorn")

from _serve_server import Server, demo_rows, free_port  # noqa: E402

pytestmark = pytest.mark.model
COUNTING = "1, 2, 3, 4, 5, 6, 7, 8, 9, 10,"  # the model goes on counting: no early end of generation


@contextmanager
def live(settings):
    """The app on uvicorn in a thread; yields (host, port, app)."""
    from miita_edge.serve.app import create_app

    app = create_app(settings)
    server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=settings.port, log_level="warning"))
    th = threading.Thread(target=server.run, name="uvicorn-test")
    th.start()
    try:
        end = time.monotonic() + 120
        while not server.started:
            assert th.is_alive() and time.monotonic() < end, "the server did not start"
            time.sleep(0.05)
        yield "127.0.0.1", settings.port, app
    finally:
        server.should_exit = True
        th.join(60)


@pytest.fixture(scope="module")
def srv(tmp_path_factory):
    from miita_edge.serve.settings import Settings

    d = tmp_path_factory.mktemp("stop")
    with live(Settings(memories={"mem": d / "mem"}, threads=2, n_ctx=1024, port=free_port())) as out:
        yield out


def _post(host, port, path, body, timeout=120) -> dict:
    c = http.client.HTTPConnection(host, port, timeout=timeout)
    try:
        c.request("POST", path, json.dumps(body), {"Content-Type": "application/json"})
        return json.loads(c.getresponse().read())
    finally:
        c.close()


def _get(host, port, path) -> dict:
    c = http.client.HTTPConnection(host, port, timeout=120)
    try:
        c.request("GET", path)
        return json.loads(c.getresponse().read())
    finally:
        c.close()


def _until(pred, what: str, deadline_s: float = 180):
    end = time.monotonic() + deadline_s
    while time.monotonic() < end:
        out = pred()
        if out:
            return out
        time.sleep(0.1)
    raise AssertionError(f"{what}: not within {deadline_s} s")


def test_abandoned_stream_stops_generating(srv, caplog):
    host, port, app = srv
    caplog.set_level(logging.INFO, logger="miita_edge.serve")
    model = app.state.registry.model_id
    c = http.client.HTTPConnection(host, port, timeout=120)
    c.connect()
    sock = c.sock
    c.request("POST", "/v1/completions", json.dumps({"model": model, "prompt": COUNTING, "max_tokens": 900,
                                                     "stream": True, "miita": {"newline_stop": False}}),
              {"Content-Type": "application/json"})
    resp = c.getresponse()
    assert resp.status == 200
    while not resp.readline().startswith(b"data:"):  # the first token arrived
        pass
    sock.shutdown(socket.SHUT_RDWR)  # the client goes away mid-answer
    resp.close()
    c.close()
    rec = _until(lambda: [r for r in caplog.records if "streamed answer stopped" in r.getMessage()],
                 "the abandoned answer never stopped")
    tokens = int(rec[0].getMessage().split("after ")[1].split()[0])
    assert 1 <= tokens < 900, rec[0].getMessage()
    # the worker is free again: a plain request is answered
    out = _post(host, port, "/v1/completions", {"model": model, "prompt": "Hi", "max_tokens": 2})
    assert out["usage"]["completion_tokens"] >= 1


def test_waited_teach_whose_client_left_commits_nothing(srv):
    host, port, _ = srv
    # 400 rows take well over the client's 3 s (about 25 ms a row on an idle 2-core machine): 60 rows, as
    # before, could finish first on a fast machine, and then there was nothing to cancel
    rows = _many_rows(400)
    with pytest.raises(TimeoutError):  # the client gives up waiting (socket timeout) and closes
        _post(host, port, "/v1/memories/mem/examples?wait=true", rows, timeout=3)
    jobs = _until(lambda: [j for j in _get(host, port, "/v1/memories/mem/jobs")["data"]
                           if j["state"] in ("done", "failed", "cancelled")], "the job never ended")
    assert jobs[0]["state"] == "cancelled" and jobs[0]["done"] < 400, jobs
    assert _get(host, port, "/v1/memories/mem")["version"] == 0


def _many_rows(n: int) -> list[dict]:
    base = demo_rows()
    return [{"input": f"{base[i % len(base)]['input']} (#{i})", "output": base[i % len(base)]["output"]}
            for i in range(n)]


def test_sigterm_stops_a_teaching_streaming_server(tmp_path):
    from miita_edge.memory.store import Store

    srv = Server("--memory", f"mem={tmp_path / 'mem'}", log=tmp_path / "server.log")
    try:
        st, job = srv.request("POST", "/v1/memories/mem/examples", _many_rows(400))  # minutes of decoding
        assert st == 202 and job["state"] in ("queued", "running"), job
        where = f"/v1/memories/mem/jobs/{job['id']}"
        _until(lambda: srv.get(where)[1]["done"] >= 8, "the job never decoded a batch")
        # answers are served between the job's batches
        st, ans = srv.request("POST", "/v1/chat/completions", {"model": "mem", "max_tokens": 4, "messages": [
            {"role": "user", "content": "my parcel never arrived"}]})
        assert st == 200 and ans["miita"]["version"] == 0
        running = srv.get(where)[1]
        assert running["state"] == "running" and running["done"] < 400, running
        # a stream in flight, then SIGTERM
        ended = threading.Event()

        def stream():
            c = http.client.HTTPConnection("127.0.0.1", srv.port, timeout=120)
            c.request("POST", "/v1/completions", json.dumps({"model": "mem", "prompt": COUNTING, "max_tokens": 900,
                                                             "stream": True, "miita": {"newline_stop": False}}),
                      {"Content-Type": "application/json", **srv.headers()})
            try:
                c.getresponse().read()
            except (OSError, http.client.HTTPException):
                pass
            finally:
                c.close()
                ended.set()

        th = threading.Thread(target=stream)
        th.start()
        time.sleep(1.0)  # let the stream reach the worker's queue or start
        srv.proc.terminate()
        rc = srv.proc.wait(60)  # the 400-row job alone is minutes of decoding: it did not run to its end
        th.join(60)
        assert ended.is_set()
        assert rc in (0, -15), rc  # uvicorn re-raises the signal once it has shut down cleanly
        assert not Store(tmp_path / "mem").exists() or Store(tmp_path / "mem").read().version == 0
    finally:
        srv.stop()
