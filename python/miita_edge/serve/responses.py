"""Response schemas: every route's answer and error, declared for ``/openapi.json``."""
from __future__ import annotations

from typing import Any, Literal, Optional

from pydantic import BaseModel, ConfigDict, Field


class ErrorDetail(BaseModel):
    message: str
    type: str
    param: Optional[str] = None
    code: Optional[str] = None


class ErrorBody(BaseModel):
    error: ErrorDetail


ERRORS = {s: {"model": ErrorBody, "description": d} for s, d in (
    (400, "bad request (malformed JSON, an unsupported parameter, bad input)"), (401, "missing or wrong API key"),
    (403, "Origin not allowed; an unlimited budget without --allow-unlimited-budget"),
    (404, "unknown model or memory"), (408, "the body did not arrive in time"), (409, "conflict"),
    (413, "body over --max-body, or a teach over --max-teach-rows"), (415, "body not application/json"),
    (421, "Host not allowed"), (422, "wrong schema"), (429, "too many teach jobs at once"), (500, "server error"),
    (503, "the server is shutting down"))}
SSE = {200: {"content": {"text/event-stream": {"schema": {"type": "string"}}},
             "description": "with stream: true, chunks as server-sent events, then [DONE]"}}


class Usage(BaseModel):
    prompt_tokens: int
    completion_tokens: int
    total_tokens: int


class Steer(BaseModel):
    prototype: int
    answer: Optional[str]
    weight: float
    score: float
    count: int


class MiitaExt(BaseModel):
    """What steered the answer, or why nothing did (docs/serving.md, "The miita extension object")."""
    memory: Optional[str]
    version: Optional[int]
    adapted: bool
    reason: Optional[str] = None
    task: Optional[str] = Field(default=None, description="the background task recognised, if any")
    steered_by: Optional[list[Steer]] = None
    alphas: Optional[list[float]] = None
    eta: Optional[float] = None


class TopLogprob(BaseModel):
    token: str
    logprob: float
    bytes: list[int]


class TokenLogprob(TopLogprob):
    top_logprobs: list[TopLogprob]


class ChatLogprobs(BaseModel):
    content: list[TokenLogprob]
    refusal: Optional[Any] = None


class ChatMessageOut(BaseModel):
    role: Literal["assistant"]
    content: str


class _Choice(BaseModel):
    index: int
    finish_reason: Literal["stop", "length"]


class ChatChoice(_Choice):
    message: ChatMessageOut
    logprobs: Optional[ChatLogprobs] = None


class _Answer(BaseModel):
    id: str
    created: int
    model: str
    usage: Usage
    miita: MiitaExt


class ChatCompletion(_Answer):
    object: Literal["chat.completion"]
    choices: list[ChatChoice]


class CompletionLogprobs(BaseModel):
    tokens: list[str]
    token_logprobs: list[float]
    top_logprobs: list[dict[str, float]]
    text_offset: list[int]


class CompletionChoice(_Choice):
    text: str
    logprobs: Optional[CompletionLogprobs] = None


class Completion(_Answer):
    object: Literal["text_completion"]
    choices: list[CompletionChoice]


class ModelCard(BaseModel):
    id: str
    object: Literal["model"] = "model"
    created: int = 0
    owned_by: str = "miita-edge"


class ModelList(BaseModel):
    object: Literal["list"] = "list"
    data: list[ModelCard]


class MemoryRef(BaseModel):
    name: str
    model: str


class MemoryList(BaseModel):
    object: Literal["list"] = "list"
    data: list[MemoryRef]


class MemoryInfo(BaseModel):
    """What ``miita-edge info`` prints, as JSON (counts, bytes against the budget, model, settings)."""
    model_config = ConfigDict(extra="allow")
    name: str
    memory: str
    version: int
    examples: int
    prototypes: int


class TeachReport(BaseModel):
    """The ingest report (``IngestReport.to_json``) and the version committed."""
    model_config = ConfigDict(extra="allow")
    memory: str
    version: int
    examples: int


class TeachJobOut(BaseModel):
    """A teach job (docs/serving.md, "Teach jobs"): ``done`` of ``total`` examples decoded; ``result``
    is the teach report once ``state`` is ``done``, ``error`` the error once it is ``failed``."""
    id: str
    object: Literal["memory.teach_job"] = "memory.teach_job"
    memory: str
    state: Literal["queued", "running", "done", "failed", "cancelled"]
    done: int
    total: int
    created: float
    started: Optional[float] = None
    finished: Optional[float] = None
    result: Optional[TeachReport] = None
    error: Optional[ErrorDetail] = None


class TeachJobList(BaseModel):
    object: Literal["list"] = "list"
    data: list[TeachJobOut]


class ForgetReport(BaseModel):
    """Counts only: what was removed, what is left, the version committed. The forgotten answer is
    not echoed back (the client has it; a response never repeats stored text it did not ask for)."""
    memory: str
    version: int
    removed_prototypes: int
    removed_anchors: int
    removed_examples: int
    prototypes: int
    anchors: int
    bytes: int
