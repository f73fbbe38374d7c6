"""Request schemas: what the official ``openai`` client (v1+) sends, plus the ``miita`` field."""
from __future__ import annotations

from typing import Literal, Optional, Union

from pydantic import BaseModel, ConfigDict, Field


class MiitaOptions(BaseModel):
    model_config = ConfigDict(extra="forbid")
    adapt: bool = True


class _Common(BaseModel):
    model_config = ConfigDict(extra="ignore")  # the client may send fields we do not use (user, n=1, ...)
    model: str
    max_tokens: Optional[int] = Field(default=None, ge=1)
    max_completion_tokens: Optional[int] = Field(default=None, ge=1)
    temperature: Optional[float] = Field(default=None, ge=0.0, le=2.0)
    top_p: Optional[float] = Field(default=None, gt=0.0, le=1.0)
    seed: Optional[int] = None
    stop: Optional[Union[str, list[str]]] = None
    stream: bool = False
    miita: MiitaOptions = Field(default_factory=MiitaOptions)


class Message(BaseModel):
    model_config = ConfigDict(extra="ignore")
    role: Literal["system", "user", "assistant", "developer", "tool"]
    content: Union[str, list[dict], None] = None


class ChatRequest(_Common):
    messages: list[Message] = Field(min_length=1)


class CompletionRequest(_Common):
    prompt: Union[str, list[str]]


class CreateMemory(BaseModel):
    model_config = ConfigDict(extra="forbid")
    name: str = Field(pattern=r"^[A-Za-z0-9][A-Za-z0-9._-]{0,63}$")
    budget: str = "64KiB"
    template: str = "plain"
    preset: Literal["default", "paper"] = "default"


class Forget(BaseModel):
    model_config = ConfigDict(extra="forbid")
    output: str = Field(min_length=1)
