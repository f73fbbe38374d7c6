"""Teach jobs on a tiny GGUF, in process (docs/serving.md, "Teach jobs"): the row limit (413); a
teach above teach_wait_rows (the constant TEACH_WAIT_ROWS by default) answers 202 and a job that is polled to ``done`` and commits exactly
what one ``Miita.ingest`` of the rows commits (every stored array compared); a cancelled job commits
nothing; answers run between a job's batches (the worker's order of work recorded); the limit on
jobs at once (429); unknown and finished jobs. The worker is held by a gate job where a test needs
a job still queued, so no assertion depends on timing."""
from __future__ import annotations

import threading
import time

import numpy as np
import pytest

pytest.importorskip("fastapi")

from _serve_server import demo_rows, error_shape, tiny_client, tiny_model  # noqa: E402

ROWS = [{"input": r["input"], "output": r["output"]} for r in demo_rows()[:40]]


def _client(tmp, **kw):
    return tiny_client(tmp, memories={"m": tmp / "m", "n": tmp / "n"}, **kw)


def _poll(c, url: str, deadline_s: float = 120) -> dict:
    end = time.monotonic() + deadline_s
    while time.monotonic() < end:
        job = c.get(url).json()
        if job["state"] in ("done", "failed", "cancelled"):
            return job
        time.sleep(0.02)
    raise AssertionError(f"job {url} still {job['state']} after {deadline_s} s")


def _gate(c) -> threading.Event:
    """Hold the worker: every job queued after this waits until the event is set."""
    gate = threading.Event()
    c.app.state.registry.worker.submit(gate.wait)
    return gate


def _queued(c, n: int) -> None:
    """Wait until ``n`` jobs wait on the worker's queue (requests sent from other threads)."""
    end = time.monotonic() + 60
    while len(c.app.state.registry.worker._heap) < n:
        assert time.monotonic() < end, "requests never reached the worker's queue"
        time.sleep(0.01)


def _arrays(path):
    from miita_edge.memory.store import Store

    return Store(path).read().arrays


def test_row_limit_is_413_and_stores_nothing(tmp_path):
    with _client(tmp_path, max_teach_rows=5) as c:
        r = c.post("/v1/memories/m/examples", json=ROWS[:6])
        assert r.status_code == 413 and error_shape(r.json()), r.text
        err = r.json()["error"]
        assert err["code"] == "too_many_examples" and err["param"] == "examples" and "at most 5" in err["message"]
        assert c.get("/v1/memories/m").json()["version"] == 0
        r = c.post("/v1/memories/m/examples", json={"examples": ROWS[:5]})
        assert r.status_code == 200 and r.json()["examples"] + r.json()["skipped"] == 5


def test_job_polls_to_done_and_commits_what_one_ingest_commits(tmp_path):
    from miita_edge import Example, Miita
    from miita_edge.runtime.engine import EngineConfig

    with _client(tmp_path, teach_wait_rows=8, teach_batch=3) as c:
        r = c.post("/v1/memories/m/examples", json=ROWS[:20])  # 20 > 8 rows: a job
        assert r.status_code == 202, r.text
        job = r.json()
        assert job["object"] == "memory.teach_job" and job["total"] == 20 and job["memory"] == "m"
        assert r.headers["location"] == f"/v1/memories/m/jobs/{job['id']}"
        end = _poll(c, r.headers["location"])
        assert end["state"] == "done" and end["done"] == 20 and end["error"] is None
        assert end["result"]["version"] == 1 and end["result"]["examples"] + end["result"]["skipped"] == 20
        assert [j["id"] for j in c.get("/v1/memories/m/jobs").json()["data"]] == [job["id"]]
        assert c.get("/v1/memories/n/jobs").json()["data"] == []
        # ?wait=true: the same rows, waited for, answer the report (200) as a synchronous teach did
        r = c.post("/v1/memories/n/examples?wait=true", json=ROWS[:20])
        assert r.status_code == 200 and r.json()["version"] == 1
    ref = Miita(model=str(tiny_model(tmp_path)), memory=tmp_path / "ref",
                engine_config=EngineConfig(n_threads=1, n_ctx=512, stop_after_text=True))
    try:
        ref.ingest([Example(x["input"], x["output"], line=i) for i, x in enumerate(ROWS[:20])])
    finally:
        ref.close()
    want = _arrays(tmp_path / "ref")
    for name in ("m", "n"):
        got = _arrays(tmp_path / name)
        assert sorted(got) == sorted(want)
        for k in want:
            assert np.array_equal(got[k], want[k]), (name, k)


def test_by_default_a_teach_of_teach_wait_rows_waits_and_one_more_row_is_a_job(tmp_path):
    """Without ?wait, the constant TEACH_WAIT_ROWS (not a serve flag) decides: a teach of that many
    rows answers its report (200), one row more answers 202 and the job."""
    from miita_edge.serve.settings import TEACH_WAIT_ROWS

    rows = (ROWS * (TEACH_WAIT_ROWS // len(ROWS) + 1))[:TEACH_WAIT_ROWS + 1]
    with _client(tmp_path) as c:
        r = c.post("/v1/memories/m/examples", json=rows[:TEACH_WAIT_ROWS])
        assert r.status_code == 200 and r.json()["version"] == 1, r.text
        r = c.post("/v1/memories/n/examples", json=rows)
        assert r.status_code == 202 and r.json()["total"] == TEACH_WAIT_ROWS + 1, r.text
        assert _poll(c, r.headers["location"])["state"] == "done"


def test_small_teach_waits_and_bad_budget_is_refused_before_decoding(tmp_path):
    with _client(tmp_path) as c:
        r = c.post("/v1/memories/m/examples", json={"examples": ROWS[:3], "budget": "lots"})
        assert r.status_code == 422 and r.json()["error"]["param"] == "budget"  # the schema's budget pattern
        assert c.get("/v1/memories/m/jobs").json()["data"] == []  # refused before any job started
        r = c.post("/v1/memories/m/examples?wait=false", json=ROWS[:3])
        assert r.status_code == 202 and _poll(c, r.headers["location"])["state"] == "done"


def test_cancel_commits_nothing(tmp_path, monkeypatch):
    from miita_edge.serve import jobs

    decoded, hold = threading.Event(), threading.Event()

    def first_batch_then_hold(r, job, cache, rows):  # the worker stays in batch 1 until released
        jobs_decode(r, job, cache, rows)
        decoded.set()
        hold.wait()

    jobs_decode = jobs.decode_batch
    monkeypatch.setattr(jobs, "decode_batch", first_batch_then_hold)
    with _client(tmp_path, teach_batch=4) as c:
        r = c.post("/v1/memories/m/examples?wait=false", json=ROWS)
        assert r.status_code == 202 and r.json()["state"] == "queued"
        assert decoded.wait(60)
        d = c.delete(r.headers["location"])
        hold.set()
        assert d.status_code == 200, d.text
        out = d.json()
        assert out["state"] == "cancelled" and out["done"] == 4 and out["result"] is None
        assert c.get(r.headers["location"]).json()["state"] == "cancelled"
        assert c.get("/v1/memories/m").json()["version"] == 0
        again = c.delete(r.headers["location"])
        assert again.status_code == 409 and again.json()["error"]["code"] == "job_finished"
        monkeypatch.setattr(jobs, "decode_batch", jobs_decode)
        # a job cancelled while still queued never decodes a row
        gate = _gate(c)
        r = c.post("/v1/memories/m/examples?wait=false", json=ROWS[:10])
        out = c.delete(r.headers["location"]).json()
        gate.set()
        assert out["state"] == "cancelled" and out["done"] == 0
        assert c.get("/v1/memories/m").json()["version"] == 0
        # the memory still takes a teach afterwards
        assert c.post("/v1/memories/m/examples", json=ROWS[:2]).json()["version"] == 1


def test_answers_run_between_batches(tmp_path, monkeypatch):
    from miita_edge.serve import jobs, routes_chat

    order: list[str] = []

    def spy(tag, fn):
        def wrapped(*a, **kw):
            order.append(tag)
            return fn(*a, **kw)
        return wrapped

    monkeypatch.setattr(jobs, "decode_batch", spy("batch", jobs.decode_batch))
    monkeypatch.setattr(jobs, "commit_rows", spy("commit", jobs.commit_rows))
    monkeypatch.setattr(routes_chat, "answer_job", spy("answer", routes_chat.answer_job))
    with _client(tmp_path, teach_batch=8) as c:
        gate = _gate(c)
        r = c.post("/v1/memories/m/examples?wait=false", json=ROWS)  # 40 rows: 5 batches
        answers = []

        def ask():
            answers.append(c.post("/v1/chat/completions", json={"model": "m", "max_tokens": 2, "messages": [
                {"role": "user", "content": "where is my parcel"}]}))

        t = threading.Thread(target=ask)
        t.start()
        _queued(c, 2)  # the first batch, then the answer
        gate.set()
        t.join()
        assert _poll(c, r.headers["location"])["state"] == "done"
    assert answers[0].status_code == 200 and answers[0].json()["miita"]["version"] == 0  # not yet committed
    assert order == ["batch", "answer", "batch", "batch", "batch", "batch", "commit"], order


def test_too_many_jobs_and_unknown_job(tmp_path):
    with _client(tmp_path, max_teach_jobs=1) as c:
        gate = _gate(c)
        r = c.post("/v1/memories/m/examples?wait=false", json=ROWS[:4])
        assert r.status_code == 202
        busy = c.post("/v1/memories/n/examples?wait=false", json=ROWS[:4])
        assert busy.status_code == 429 and error_shape(busy.json()) and busy.json()["error"]["code"] == "too_many_jobs"
        gate.set()
        assert _poll(c, r.headers["location"])["state"] == "done"
        for path in ("/v1/memories/m/jobs/nope", f"/v1/memories/n/jobs/{r.json()['id']}"):
            g = c.get(path)
            assert g.status_code == 404 and g.json()["error"]["code"] == "job_not_found"
        assert c.get("/v1/memories/zz/jobs").status_code == 404
