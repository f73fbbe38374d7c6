"""Messages -> the prompt the model reads, and the text the memory key is pooled over.

The key text in chat mode is the **last user turn's content**, rendered with the memory's own
template (``template.render_prompt``) exactly as ``teach``/``ingest`` renders an example's
``input``: the key (eq. 1) is mean-pooled over that prompt's tokens, so an example taught with
``{"input": X}`` is found again from a chat whose last user message is X, whatever came before.
Earlier turns and system messages do not enter the key or the adapted prompt.

A GGUF with its own ``tokenizer.chat_template`` has the whole conversation rendered by that
template when the request is not adapted (the frozen model); adapted requests keep the memory
template on the last user turn, because MIITA reads the key and the answer-start state from one
prompt pass, and that prompt must be the one the taught keys came from. The embedded base model
(Gemma-3-270M) has no chat template: every chat request uses the template on the last user turn.
"""
from __future__ import annotations

from ..errors import InputError


def message_text(content) -> str:
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    parts = []
    for part in content:  # [{"type": "text", "text": ...}, ...]
        if isinstance(part, dict) and part.get("type") == "text" and isinstance(part.get("text"), str):
            parts.append(part["text"])
        else:
            raise InputError("messages: only text content parts are supported")
    return "".join(parts)


def last_user_text(messages) -> str:
    for m in reversed(messages):
        if m.role == "user":
            text = message_text(m.content)
            if not text.strip():
                raise InputError("messages: the last user message is empty")
            return text
    raise InputError("messages: no user message")


def render_chat_template(template: str, messages, bos: str = "", eos: str = "") -> str:
    """The conversation rendered by a GGUF's Jinja chat template (sandboxed), ready for the answer."""
    from jinja2.sandbox import ImmutableSandboxedEnvironment

    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True)

    def raise_exception(msg):
        raise InputError(f"chat template: {msg}")

    env.globals["raise_exception"] = raise_exception
    msgs = [{"role": m.role, "content": message_text(m.content)} for m in messages]
    return env.from_string(template).render(messages=msgs, bos_token=bos, eos_token=eos,
                                            add_generation_prompt=True)
