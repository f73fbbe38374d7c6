"""The memory API: list, create, info, teach (``POST .../examples``), forget (``DELETE .../examples``)."""
from __future__ import annotations

from fastapi import APIRouter, Depends, Path, Request

from ..streams import Example
from .memories import info
from .responses import ERRORS, ForgetReport, MemoryInfo, MemoryList, TeachReport
from .guard import StrictJSONRoute
from .security import auth, registry
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


@router.post("/v1/memories/{name}/examples", response_model=TeachReport)
async def teach(request: Request, body: TeachBody, name: str = MemoryName):
    """Teach: a JSON list of ``{input, output}``, or ``{"examples": [...], "budget": "64KiB"}``;
    applied atomically under the memory's budget."""
    r = registry(request)
    r.known(name)
    rows: list[ExampleIn] = body.examples if isinstance(body, TeachObject) else body
    budget = body.budget if isinstance(body, TeachObject) else None
    if budget is not None:
        r.check_budget(budget)
    examples = [Example(row.input, row.output, line=i) for i, row in enumerate(rows)]
    m, rep = await r.run(r.write, name, lambda m: m.ingest(examples, budget=budget, progress=False))
    out = rep.to_json()
    out.update(memory=name, version=m.version)
    return out


@router.delete("/v1/memories/{name}/examples", response_model=ForgetReport)
async def forget(request: Request, body: Forget, name: str = MemoryName):
    """Forget: remove everything that teaches the answer ``output``."""
    r = registry(request)
    r.known(name)
    m, out = await r.run(r.write, name, lambda m: m.forget(body.output))
    return {"memory": name, **{k: int(out[k]) for k in FORGET_COUNTS}}
