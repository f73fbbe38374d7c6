"""The memory API: list, create, info, teach (``POST .../examples``, a job: ``.../jobs``), forget
(``DELETE .../examples``)."""
from __future__ import annotations

import asyncio
from typing import Optional

from fastapi import APIRouter, Depends, Path, Query, Request
from fastapi.responses import JSONResponse

from ..memory.budget import as_budget
from ..streams import Example
from .errors import APIError
from .memories import info, shutting_down
from .responses import ERRORS, ForgetReport, MemoryInfo, MemoryList, TeachJobList, TeachJobOut, TeachReport
from .guard import StrictJSONRoute
from .security import auth, registry
from .settings import TEACH_WAIT_ROWS
from .types import CreateMemory, ExampleIn, Forget, TeachBody, TeachObject

router = APIRouter(dependencies=[Depends(auth)], responses=ERRORS, route_class=StrictJSONRoute)
FORGET_COUNTS = ("version", "removed_prototypes", "removed_anchors", "removed_examples", "prototypes", "anchors",
                 "bytes")
MemoryName = Path(max_length=256, description="a served memory's name")


@router.get("/v1/memories", response_model=MemoryList)
async def list_memories(request: Request):
    r = registry(request)
    return {"object": "list", "data": [{"name": n, "model": f"{r.model_id}:{n}"} for n in r.dirs]}


@router.post("/v1/memories", response_model=MemoryInfo)
async def create_memory(request: Request, body: CreateMemory):
    r = registry(request)
    return await r.run(r.create, body.name, body.budget, body.template, body.preset)


@router.get("/v1/memories/{name}", response_model=MemoryInfo)
async def memory_info(request: Request, name: str = MemoryName):
    r = registry(request)
    r.known(name)
    return await r.run(lambda: info(name, r.memory(name)))


JobId = Path(max_length=64, description="a teach job's id")
WAIT = Query(None, description="true: answer the teach report when the job ends; false: answer 202 and "
             f"the job at once; default: wait for at most {TEACH_WAIT_ROWS} examples")
TEACH_JOB = {202: {"model": TeachJobOut, "description": "the teach runs as a job: poll the Location header"}}


@router.post("/v1/memories/{name}/examples", response_model=TeachReport, responses=TEACH_JOB)
async def teach(request: Request, body: TeachBody, name: str = MemoryName, wait: Optional[bool] = WAIT):
    """Teach: a JSON list of ``{input, output}``, or ``{"examples": [...], "budget": "64KiB"}``;
    applied atomically under the memory's budget, by a teach job (docs/serving.md, "Teach jobs")."""
    r = registry(request)
    r.known(name)
    rows: list[ExampleIn] = body.examples if isinstance(body, TeachObject) else body
    limit = r.settings.max_teach_rows
    if len(rows) > limit:
        raise APIError(413, f"{len(rows)} examples in one teach; this server takes at most {limit} per request "
                       f"(--max-teach-rows): send them in several requests", "too_many_examples", "examples")
    budget = body.budget if isinstance(body, TeachObject) else None
    if budget is not None:
        as_budget(budget)  # a bad budget is refused now, not after decoding every row
        r.check_budget(budget)
    examples = [Example(row.input, row.output, line=i) for i, row in enumerate(rows)]
    job = r.jobs.start(r, name, examples, budget)
    if not (len(rows) <= r.settings.teach_wait_rows if wait is None else wait):
        return JSONResponse(TeachJobOut(**job.to_json()).model_dump(), status_code=202,
                            headers={"Location": f"/v1/memories/{name}/jobs/{job.id}"})
    await _wait(request, r, job)
    if job.state == "done":
        return job.result
    if job.error is not None:
        raise job.error  # the error a synchronous teach gave: 422 budget_exceeded, 400 invalid_input...
    if r.closing.is_set():
        raise shutting_down()
    raise APIError(409, f"teach job {job.id} was cancelled: nothing was committed", "job_cancelled")


async def _wait(request: Request, r, job) -> None:
    """Until ``job`` ends; a client that goes away cancels it (nobody would read its report)."""
    while not job.task.done():
        await asyncio.wait({job.task}, timeout=0.25)
        if not job.task.done() and await request.is_disconnected():
            r.jobs.cancel(job)
            return


@router.get("/v1/memories/{name}/jobs", response_model=TeachJobList)
async def list_jobs(request: Request, name: str = MemoryName):
    r = registry(request)
    r.known(name)
    return {"object": "list", "data": [j.to_json() for j in r.jobs.of(name)]}


@router.get("/v1/memories/{name}/jobs/{job_id}", response_model=TeachJobOut)
async def get_job(request: Request, name: str = MemoryName, job_id: str = JobId):
    r = registry(request)
    r.known(name)
    return r.jobs.get(name, job_id).to_json()


@router.delete("/v1/memories/{name}/jobs/{job_id}", response_model=TeachJobOut)
async def cancel_job(request: Request, name: str = MemoryName, job_id: str = JobId):
    """Cancel: the job ends ``cancelled`` and commits nothing, unless it was already committing (it
    then ends ``done``); answers the job once it has ended."""
    r = registry(request)
    r.known(name)
    job = r.jobs.get(name, job_id)
    if not r.jobs.cancel(job):
        raise APIError(409, f"teach job {job.id} already ended ({job.state})", "job_finished")
    await asyncio.wait({job.task})
    return job.to_json()


@router.delete("/v1/memories/{name}/examples", response_model=ForgetReport)
async def forget(request: Request, body: Forget, name: str = MemoryName):
    """Forget: remove everything that teaches the answer ``output``."""
    r = registry(request)
    r.known(name)
    m, out = await r.run(r.write, name, lambda m: m.forget(body.output))
    return {"memory": name, **{k: int(out[k]) for k in FORGET_COUNTS}}
