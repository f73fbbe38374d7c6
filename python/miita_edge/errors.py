"""Exceptions that carry a one-line, user-facing message.

Why a small hierarchy: the CLI turns every ``MiitaError`` into a single line on
stderr and a non-zero exit code, while anything else is a bug and keeps its
traceback. Each subclass names the layer that refused the input.
"""
from __future__ import annotations


class MiitaError(Exception):
    """Base class: ``str(err)`` is a complete one-line message for the user."""

    exit_code: int = 2


class InputError(MiitaError):
    """Bad user input: a data file, a flag value, a template name."""


class StoreError(MiitaError):
    """A memory directory that cannot be opened, is corrupt, or belongs to another model."""


class ModelError(MiitaError):
    """A GGUF that is missing, unreadable, or of an architecture we cannot steer exactly."""


class AbiError(MiitaError):
    """The native extension and the loaded llama.cpp/ggml libraries do not match."""


class BudgetError(MiitaError):
    """A byte budget that cannot hold even the smallest valid memory."""


class StoreConflict(StoreError):
    """The memory is busy: another writer holds its lock, or it moved on since it was opened.

    A distinct type because callers treat it differently from corruption: the server answers
    409 and its worker retries, where any other ``StoreError`` is final. ``locked`` says which
    case: a live writer (wait, then retry) or a newer commit (reopen, then retry at once).
    """

    def __init__(self, message: str, *, locked: bool = False):
        super().__init__(message)
        self.locked = locked


class ContextOverflow(ModelError):
    """A prompt (plus what it asks to generate) does not fit the model's context window.

    A distinct type so that the CLI can name the example and the server can answer
    ``context_length_exceeded`` without reading the message.
    """
