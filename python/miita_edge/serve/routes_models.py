"""``GET /v1/models``: the model (frozen) and each memory, as model ids."""
from __future__ import annotations

from fastapi import APIRouter, Depends, Request

from .responses import ERRORS, ModelList
from .security import auth, registry

router = APIRouter(dependencies=[Depends(auth)], responses=ERRORS)


@router.get("/v1/models", response_model=ModelList)
async def models(request: Request):
    return {"object": "list", "data": [{"id": i} for i in registry(request).model_ids()]}
