"""Request schemas: what OpenAI clients send (the official ``openai`` client v1+, Open WebUI), plus
the ``miita`` field. These are the models the handlers validate with, so the OpenAPI schema at
``/openapi.json`` is the contract (docs/serving.md, "Supported and refused parameters")."""
from __future__ import annotations

from typing import Annotated, Any, Literal, Optional, Union

from pydantic import BaseModel, ConfigDict, Discriminator, Field, Tag, field_validator

MAX_STOPS, MAX_STOP_CHARS = 16, 256
Num = Annotated[float, Field(allow_inf_nan=False)]


class MiitaOptions(BaseModel):
    model_config = ConfigDict(extra="forbid")
    adapt: bool = Field(default=True, description="false: answer without the memory (the frozen model)")
    newline_stop: bool = Field(default=True, description="false: no end-of-answer newline stop; only the "
                               "request's own `stop` strings end the answer")
    background: Optional[bool] = Field(default=None, description="true/false: say whether this is a "
                                       "background task (title, tags...); null: recognise Open WebUI's")


class _Common(BaseModel):
    model_config = ConfigDict(extra="ignore")  # the client may send fields we do not use (user, ...)
    model: str = Field(max_length=256)
    max_tokens: Optional[int] = Field(default=None, description="-1 or null: the server's default")
    max_completion_tokens: Optional[int] = Field(default=None, description="-1 or null: the server's default")
    temperature: Optional[Num] = Field(default=None, ge=0.0, le=2.0)
    top_p: Optional[Num] = Field(default=None, ge=0.0, le=1.0, description="0: greedy")
    seed: Optional[int] = Field(default=None, description="negative (-1): a random seed")
    stop: Optional[Union[str, list[str]]] = Field(default=None, description="added to the newline stop")
    stream: Optional[bool] = False
    stream_options: Optional[dict[str, Any]] = None
    n: Optional[int] = Field(default=1, ge=1, le=8)
    frequency_penalty: Optional[Num] = Field(default=None, ge=-2.0, le=2.0)
    presence_penalty: Optional[Num] = Field(default=None, ge=-2.0, le=2.0)
    logit_bias: Optional[dict[str, Num]] = None
    user: Optional[str] = None
    miita: MiitaOptions = Field(default_factory=MiitaOptions)

    @field_validator("max_tokens", "max_completion_tokens")
    @classmethod
    def _max_tokens(cls, v):
        if v is not None and v != -1 and v < 1:
            raise ValueError("must be >= 1 (or -1 or null for the default)")
        return v

    @field_validator("stop")
    @classmethod
    def _bounded_stop(cls, v):
        stops = [v] if isinstance(v, str) else (v or [])
        if len(stops) > MAX_STOPS or any(len(s) > MAX_STOP_CHARS for s in stops):
            raise ValueError(f"at most {MAX_STOPS} stop strings of at most {MAX_STOP_CHARS} characters")
        return v


class Message(BaseModel):
    model_config = ConfigDict(extra="ignore")  # name, tool_calls, tool_call_id: read, not used
    role: str = Field(max_length=32, description="system, developer, user, assistant, tool")
    content: Union[str, list[dict[str, Any]], None] = None


class ChatRequest(_Common):
    messages: list[Message] = Field(min_length=1)
    logprobs: Optional[bool] = False
    top_logprobs: Optional[int] = Field(default=None, ge=0, le=20)
    response_format: Optional[dict[str, Any]] = None
    tools: Optional[list[dict[str, Any]]] = None
    tool_choice: Optional[Union[str, dict[str, Any]]] = None
    parallel_tool_calls: Optional[bool] = None
    functions: Optional[list[dict[str, Any]]] = None
    function_call: Optional[Union[str, dict[str, Any]]] = None


class CompletionRequest(_Common):
    prompt: Union[str, list[str]]
    logprobs: Optional[int] = Field(default=None, ge=0, le=5)
    echo: Optional[bool] = False
    suffix: Optional[str] = None
    best_of: Optional[int] = Field(default=None, ge=1)


Name = Annotated[str, Field(pattern=r"^[A-Za-z0-9][A-Za-z0-9._-]{0,63}$")]


class CreateMemory(BaseModel):
    model_config = ConfigDict(extra="forbid")
    name: Name
    budget: str = Field(default="64KiB", max_length=64)
    template: str = Field(default="plain", max_length=64)
    preset: Literal["default", "paper"] = "default"


class Forget(BaseModel):
    model_config = ConfigDict(extra="forbid")
    output: str = Field(min_length=1)


class ExampleIn(BaseModel):
    model_config = ConfigDict(extra="ignore")
    input: str = Field(description="the query, as a chat's last user message would say it")
    output: str = Field(description="the answer the memory should give")

    @field_validator("input", "output")
    @classmethod
    def _not_blank(cls, v: str) -> str:
        if not v.strip():
            raise ValueError("not a non-empty string")
        return v


class TeachObject(BaseModel):
    model_config = ConfigDict(extra="forbid")
    examples: list[ExampleIn] = Field(min_length=1)
    budget: Optional[str] = Field(default=None, max_length=64, description="e.g. '64KiB', '1%' or 'none'")


def _teach_shape(v) -> str:
    return "list" if isinstance(v, list) else "object"


# The teach body: a bare list of examples, or {"examples": [...], "budget": ...}
TeachBody = Annotated[Union[Annotated[list[ExampleIn], Field(min_length=1), Tag("list")],
                            Annotated[TeachObject, Tag("object")]], Discriminator(_teach_shape)]
