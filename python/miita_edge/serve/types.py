"""Request schemas: what OpenAI clients send (the official ``openai`` client v1+, Open WebUI), plus
the ``miita`` field. These are the models the handlers validate with, so the OpenAPI schema at
``/openapi.json`` is the contract (docs/serving.md, "Supported and refused parameters").

The schema states every limit the server enforces, so a request the schema allows is accepted
(tests/test_serve_schemathesis.py). Where this server parses more than it accepts, so as to refuse
with a 400 that names the option (a deprecated role, an image part, a penalty other than 0), the
published schema (``WithJsonSchema``) lists only what is accepted. What no schema can say is left
to the handler: a conversation's last user message must have text; the prompt and ``max_tokens``
must fit the context; a teach must fit the memory's budget."""
from __future__ import annotations

from typing import Annotated, Any, Literal, Optional, Union

from pydantic import BaseModel, BeforeValidator, ConfigDict, Discriminator, Field, Tag, WithJsonSchema, field_validator

from ..method.templates import TEMPLATES

MAX_STOPS, MAX_STOP_CHARS = 16, 256
Num = Annotated[float, Field(allow_inf_nan=False)]


def _integral(v):
    """JSON's 6.0 is the integer 6 (JSON Schema says so); strings and booleans stay refused."""
    return int(v) if isinstance(v, float) and v.is_integer() else v


def integer(**limits):
    """An int field with ``limits`` (ge, le) that takes JSON's integral floats too."""
    return Annotated[int, Field(**limits), BeforeValidator(_integral)]


Int = integer()
StopText = Annotated[str, Field(max_length=MAX_STOP_CHARS)]
ROLES = ("system", "developer", "user", "assistant", "tool")
TEXT = r"\S"  # a string with some non-blank character (JSON Schema patterns search, unanchored)
# max_tokens: >= 1, or -1 / null for the server's default
MaxTokens = Annotated[Optional[Union[Annotated[int, Field(ge=1)], Literal[-1]]], BeforeValidator(_integral)]
# what the option accepts (the handler refuses the rest with a 400 naming it)
ZERO = WithJsonSchema({"anyOf": [{"type": "number", "const": 0}, {"type": "null"}]})
NONE_AUTO = WithJsonSchema({"anyOf": [{"type": "string", "enum": ["none", "auto"]}, {"type": "null"}]})
TEXT_PART = {"type": "object", "properties": {"type": {"type": "string", "const": "text"}, "text": {"type": "string"}},
             "required": ["type", "text"]}
CONTENT = WithJsonSchema({"anyOf": [{"type": "string"}, {"type": "array", "items": TEXT_PART}, {"type": "null"}]})
# a budget as memory.budget parses it and a memory can hold: a size of at least one byte in B, KB,
# MB, GB, KiB, MiB or GiB (any case), a share of the stream above 0%, or none/inf/unlimited
_AT_LEAST_1 = r"[0-9]*[1-9][0-9]*(?:\.[0-9]*)?"
_ABOVE_0 = r"[0-9]*\.[0-9]*[1-9][0-9]*"
BUDGET_PATTERN = (rf"^(?:{_AT_LEAST_1}[ \t]*(?:[bB]|[kKmMgG][iI]?[bB])?|(?:{_AT_LEAST_1}|{_ABOVE_0})[ \t]*%"
                  r"|[nN][oO][nN][eE]|[iI][nN][fF]|[uU][nN][lL][iI][mM][iI][tT][eE][dD])$")
Budget = Annotated[str, Field(max_length=64, pattern=BUDGET_PATTERN,
                              description="a size (4096, 64KiB, 1.5MB), a share of the stream (1%), or none "
                                          "(unlimited: only with --allow-unlimited-budget)")]
TemplateName = Literal[tuple(sorted(TEMPLATES))]  # type: ignore[valid-type]


class MiitaOptions(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True)
    adapt: bool = Field(default=True, description="false: answer without the memory (the frozen model)")
    newline_stop: bool = Field(default=True, description="false: no end-of-answer newline stop; only the "
                               "request's own `stop` strings end the answer")
    background: Optional[bool] = Field(default=None, description="true/false: say whether this is a "
                                       "background task (title, tags...); null: recognise Open WebUI's")


class _Common(BaseModel):
    model_config = ConfigDict(extra="ignore", strict=True)  # the client may send fields we do not use (user, ...)
    model: str = Field(max_length=256, examples=["miita-edge"])
    max_tokens: MaxTokens = Field(default=None, description="-1 or null: the server's default")
    max_completion_tokens: MaxTokens = Field(default=None, description="-1 or null: the server's default")
    temperature: Optional[Num] = Field(default=None, ge=0.0, le=2.0)
    top_p: Optional[Num] = Field(default=None, ge=0.0, le=1.0, description="0: greedy")
    seed: Optional[Int] = Field(default=None, description="negative (-1): a random seed")
    stop: Optional[Union[StopText, Annotated[list[StopText], Field(max_length=MAX_STOPS)]]] = Field(
        default=None, description="added to the newline stop")
    stream: Optional[bool] = False
    stream_options: Optional[dict[str, Any]] = None
    n: Optional[integer(ge=1, le=8)] = 1
    frequency_penalty: Annotated[Optional[Num], ZERO] = Field(default=None, ge=-2.0, le=2.0)
    presence_penalty: Annotated[Optional[Num], ZERO] = Field(default=None, ge=-2.0, le=2.0)
    logit_bias: Annotated[Optional[dict[str, Num]],
                          WithJsonSchema({"anyOf": [{"type": "object", "maxProperties": 0}, {"type": "null"}]})] = None
    user: Optional[str] = None
    miita: MiitaOptions = Field(default_factory=MiitaOptions)


class Message(BaseModel):
    model_config = ConfigDict(extra="ignore", strict=True)  # name, tool_calls, tool_call_id: read, not used
    role: str = Field(max_length=32, json_schema_extra={"enum": list(ROLES)})
    content: Annotated[Union[str, list[dict[str, Any]], None], CONTENT] = None


class ChatRequest(_Common):
    messages: list[Message] = Field(min_length=1)
    logprobs: Optional[bool] = False
    top_logprobs: Optional[integer(ge=0, le=20)] = None
    response_format: Annotated[Optional[dict[str, Any]], WithJsonSchema({"anyOf": [
        {"type": "object", "properties": {"type": {"type": "string", "const": "text"}}}, {"type": "null"}]})] = None
    tools: Optional[list[dict[str, Any]]] = None
    tool_choice: Annotated[Optional[Union[str, dict[str, Any]]], NONE_AUTO] = None
    parallel_tool_calls: Optional[bool] = None
    functions: Optional[list[dict[str, Any]]] = None
    function_call: Annotated[Optional[Union[str, dict[str, Any]]], NONE_AUTO] = None


class CompletionRequest(_Common):
    prompt: Union[Annotated[str, Field(pattern=TEXT)],
                  Annotated[list[Annotated[str, Field(pattern=TEXT)]], Field(min_length=1, max_length=1)]] = Field(
        description="one string with some text (or a list of exactly one)")
    logprobs: Optional[integer(ge=0, le=5)] = None
    echo: Annotated[Optional[bool], WithJsonSchema({"anyOf": [{"const": False}, {"type": "null"}]})] = False
    suffix: Annotated[Optional[str], WithJsonSchema({"anyOf": [{"const": ""}, {"type": "null"}]})] = None
    best_of: Annotated[Optional[integer(ge=1)], WithJsonSchema({"anyOf": [{"const": 1}, {"type": "null"}]})] = None


Name = Annotated[str, Field(pattern=r"^[A-Za-z0-9][A-Za-z0-9._-]{0,63}$")]


class CreateMemory(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True)
    name: Name
    budget: Budget = "64KiB"
    template: TemplateName = "plain"
    preset: Literal["default", "paper"] = "default"


def _not_blank(v: str) -> str:
    if not v.strip():
        raise ValueError("not a non-empty string")
    return v


class Forget(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True)
    output: str = Field(min_length=1, json_schema_extra={"pattern": TEXT})

    not_blank = field_validator("output")(_not_blank)


class ExampleIn(BaseModel):
    model_config = ConfigDict(extra="ignore", strict=True)
    input: str = Field(description="the query, as a chat's last user message would say it",
                       json_schema_extra={"pattern": TEXT})
    output: str = Field(description="the answer the memory should give", json_schema_extra={"pattern": TEXT})

    not_blank = field_validator("input", "output")(_not_blank)


class TeachObject(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True)
    examples: list[ExampleIn] = Field(min_length=1)
    budget: Optional[Budget] = None


def _teach_shape(v) -> str:
    return "list" if isinstance(v, list) else "object"


# The teach body: a bare list of examples, or {"examples": [...], "budget": ...}
TeachBody = Annotated[Union[Annotated[list[ExampleIn], Field(min_length=1), Tag("list")],
                            Annotated[TeachObject, Tag("object")]], Discriminator(_teach_shape)]
