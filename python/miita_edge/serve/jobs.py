"""Teach jobs: a teach that runs beside the answers, can be polled, and can be cancelled.

Why: a teach of thousands of rows is most of an hour of decoding on a CPU. As one worker job it
held the only llama.cpp context that long (every answer queued behind it), ran on after its client
had gone and held up the server's shutdown. As a job it decodes ``Settings.teach_batch`` examples
per worker job, each queued behind whatever arrived meanwhile, so an answer waits for at most one
batch; it commits once, at the end, with one ``Miita.ingest`` of all its rows (``teach.py``): a
cancelled, failed or interrupted job commits nothing, a finished one commits exactly what a
synchronous teach of the same rows commits. States: ``queued`` -> ``running`` (``done`` of
``total`` examples decoded) -> ``done`` | ``failed`` | ``cancelled``.

Everything here runs on the event loop, except the counters a batch updates on the worker
(``done``, the move to ``running``), which polls only read.
"""
from __future__ import annotations

import asyncio
import time
import uuid
from dataclasses import dataclass, field

from ..streams import Example
from .errors import APIError, as_api_error, bounded
from .teach import RowCache, commit_rows, decode_batch

FINISHED = ("done", "failed", "cancelled")
KEEP_FINISHED = 100  # finished jobs remembered for polling (the oldest are forgotten first)


@dataclass(eq=False)
class TeachJob:
    memory: str
    total: int
    id: str = field(default_factory=lambda: "teachjob-" + uuid.uuid4().hex[:24])
    state: str = "queued"
    done: int = 0
    created: float = field(default_factory=time.time)
    started: float | None = None
    finished: float | None = None
    committing: bool = False
    result: dict | None = None
    error: APIError | None = None
    task: asyncio.Task | None = None

    def mark_running(self) -> None:
        self.state, self.started = "running", time.time()

    def end(self, state: str, error: BaseException | None = None) -> None:
        self.state, self.finished = state, time.time()
        if error is not None:
            self.error = as_api_error(error)

    def to_json(self) -> dict:
        return {"id": self.id, "object": "memory.teach_job", "memory": self.memory, "state": self.state,
                "done": self.done, "total": self.total, "created": self.created, "started": self.started,
                "finished": self.finished, "result": self.result,
                "error": None if self.error is None else self.error.body()["error"]}


async def run_teach(r, job: TeachJob, rows: list[Example], budget: str | None) -> None:
    """The job's driver (an asyncio task): decode batch by batch, then commit; never raises."""
    cache = RowCache()
    step = max(1, r.settings.teach_batch)
    try:
        for i in range(0, len(rows), step):
            await r.run(decode_batch, r, job, cache, rows[i:i + step])
        job.committing = True  # from here on a cancel waits for the commit (all or nothing)
        m, rep = await r.run(commit_rows, r, job.memory, cache, rows, budget)
        job.done = job.total
        job.result = dict(rep.to_json(), memory=job.memory, version=m.version)
        job.end("done")
    except asyncio.CancelledError:  # DELETE, or the server stopping: nothing was committed
        if job.committing:  # only the event loop's own teardown cancels a commit: it may have landed
            job.end("failed", APIError(500, "the server stopped while this job committed: the memory holds all "
                                       "of its examples or none (GET the memory's version)", "job_interrupted"))
        else:
            job.end("cancelled")
    except Exception as exc:  # noqa: BLE001 -- kept on the job, answered to whoever polls or waits
        # the server stopping refuses a batch or the commit before it starts: nothing was committed
        stopped = isinstance(exc, APIError) and exc.code == "shutting_down"
        job.end("cancelled" if stopped else "failed", None if stopped else exc)


class Jobs:
    """The server's teach jobs: the running ones and the last ``KEEP_FINISHED`` finished ones."""

    def __init__(self, max_active: int):
        self.max_active = max_active
        self._jobs: dict[str, TeachJob] = {}

    def active(self) -> list[TeachJob]:
        return [j for j in self._jobs.values() if j.state not in FINISHED]

    def start(self, r, name: str, rows: list[Example], budget: str | None) -> TeachJob:
        if len(self.active()) >= self.max_active:
            raise APIError(429, f"{self.max_active} teach jobs are already queued or running, the most this server "
                           f"runs at once: wait for one to finish", "too_many_jobs")
        job = TeachJob(name, len(rows))
        job.task = asyncio.get_running_loop().create_task(run_teach(r, job, rows, budget))
        self._jobs[job.id] = job
        self._forget_old()
        return job

    def _forget_old(self) -> None:
        done = [j for j in self._jobs.values() if j.state in FINISHED]
        for j in done[:max(0, len(done) - KEEP_FINISHED)]:
            del self._jobs[j.id]

    def of(self, name: str) -> list[TeachJob]:
        return [j for j in self._jobs.values() if j.memory == name]

    def get(self, name: str, job_id: str) -> TeachJob:
        job = self._jobs.get(job_id)
        if job is None or job.memory != name:
            raise APIError(404, f"teach job {bounded(job_id)} not found on memory {bounded(name)} (finished jobs "
                           f"are kept for the last {KEEP_FINISHED})", "job_not_found")
        return job

    def cancel(self, job: TeachJob) -> bool:
        """Stop ``job`` unless it is committing; returns whether it was still queued or running."""
        if job.state in FINISHED or job.task is None:
            return False
        if not job.committing:
            job.task.cancel()
        return True

    async def stop_all(self) -> None:
        """Cancel every job that is not committing, and wait for all of them to end."""
        tasks = [j.task for j in self.active() if j.task is not None]
        for j in self.active():
            self.cancel(j)
        if tasks:
            await asyncio.gather(*tasks, return_exceptions=True)
