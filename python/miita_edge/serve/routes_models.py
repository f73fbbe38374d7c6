"""``GET /v1/models``: the model (frozen) and each memory, as model ids; ``GET /v1/models/{model}``:
one of them (the ``openai`` client's ``models.retrieve``)."""
from __future__ import annotations

from fastapi import APIRouter, Depends, Path, Request

from .responses import ERRORS, ModelCard, ModelList
from .security import auth, registry

router = APIRouter(dependencies=[Depends(auth)], responses=ERRORS)


@router.get("/v1/models", response_model=ModelList)
async def models(request: Request):
    return {"object": "list", "data": [{"id": i} for i in registry(request).model_ids()]}


@router.get("/v1/models/{model}", response_model=ModelCard)
async def model(request: Request, model: str = Path(max_length=256, description="a model id from /v1/models")):
    """The card of a served model id (404 ``model_not_found`` otherwise); ``X:NAME`` and ``NAME``
    name a memory as in a request's ``model``, and the card carries its canonical id."""
    r = registry(request)
    name = r.resolve(model)
    return {"id": r.model_id if name is None else f"{r.model_id}:{name}"}
