"""Reading supervised JSONL streams, all-or-nothing, with one-line errors.

A stream is a JSON Lines file (UTF-8, one JSON object per line):
``{"input": str, "output": str, "task": str?, ...extra fields ignored}``.

Why so strict: a memory is built from the *whole* stream and its byte budget
is a fraction of the whole stream (paper section 4: "1% of the full training
stream"), so a file that is half read would silently change both the memory
and its budget. :func:`read_examples` therefore validates every line before it
returns anything, and the first bad line raises :class:`InputError` whose
message names the file, the 1-based line and the field, e.g.::

    data.jsonl:17: field "output" is missing

Choices made here (none is in the paper):

* Lines are split on ``\\n`` bytes only (``\\r\\n`` is accepted); JSON escapes
  newlines inside strings, so a raw U+2028 or ``\\r`` inside a string is
  content, not a line break.
* A UTF-8 byte-order mark at the start of the file is ignored.
* Whitespace-only lines are skipped (``Example.line`` still counts them).
* ``output`` must not be empty or whitespace-only: it is the supervision the
  correction direction (eq. 2) is computed from. ``input`` may be empty.
* ``task`` is optional; if present it must be a string or null.
* Strings with unpaired surrogate escapes (``"\\ud800"``) are refused: they
  cannot be encoded as UTF-8, so they could not be tokenised or counted.
* Invalid UTF-8 is reported by 1-based byte offset within its line.
* A row with a duplicate key (``{"input": "a", "input": "b", ...}``) is refused: JSON readers
  disagree on which value wins (first, last, error), so the row is ambiguous. Duplicates inside
  nested extra fields are not checked (those fields are ignored).
* A lone ``\r`` is not a line break (the row after it is reported as extra data on the same
  line, with a hint).
"""
from __future__ import annotations

import json
import os
from dataclasses import dataclass
from typing import Iterable

from .errors import InputError

__all__ = ["Example", "read_examples", "stream_bytes"]


@dataclass(frozen=True)
class Example:
    """One supervised experience ``(x, y)`` of the stream.

    ``line`` is the 1-based source line, so later stages (memory writing,
    evaluation) can point the user back at the row that caused something.
    """

    input: str
    output: str
    task: str | None = None
    line: int = 0


def _type_name(v: object) -> str:
    """JSON-ish name of a decoded value, for messages ("got int", "got null")."""
    if v is None:
        return "null"
    if isinstance(v, bool):
        return "bool"
    return {dict: "object", list: "array", str: "string", int: "int", float: "float"}.get(type(v), type(v).__name__)


class _DuplicateKeys(dict):
    """A decoded object in which some key occurs twice; ``duplicate`` names the first such key."""

    duplicate: str = ""


def _object(pairs: list[tuple[str, object]]) -> dict:
    """json ``object_pairs_hook``: a plain dict, or a :class:`_DuplicateKeys` when a key repeats
    (only the row object itself is refused for it; nested extra fields are ignored anyway)."""
    row = dict(pairs)
    if len(row) == len(pairs):
        return row
    seen: set[str] = set()
    dup = next(k for k, _ in pairs if k in seen or seen.add(k))
    out = _DuplicateKeys(row)
    out.duplicate = dup
    return out


def _check_encodable(where: str, name: str, s: str) -> None:
    try:
        s.encode("utf-8")
    except UnicodeEncodeError as e:
        bad = s[e.start]
        raise InputError(
            f'{where} field "{name}" contains an unpaired surrogate escape (\\u{ord(bad):04x})') from None


def _read_bytes(path: str | os.PathLike) -> tuple[str, bytes]:
    name = os.fspath(path)
    if isinstance(name, bytes):
        name = os.fsdecode(name)
    if os.path.isdir(name):
        raise InputError(f"{name}: is a directory, expected a JSONL file")
    try:
        with open(name, "rb") as fh:
            return name, fh.read()
    except FileNotFoundError:
        raise InputError(f"{name}: no such file") from None
    except OSError as e:
        raise InputError(f"{name}: cannot read ({e.strerror or e})") from None


def read_examples(path: str | os.PathLike) -> list[Example]:
    """Parse and validate a whole JSONL stream; raise InputError on the first bad line.

    Returns the examples in file order. Nothing is returned unless every
    line is valid, so callers never act on a partial stream.
    """
    name, data = _read_bytes(path)
    if data.startswith(b"\xef\xbb\xbf"):
        data = data[3:]
    out: list[Example] = []
    for lineno, raw in enumerate(data.split(b"\n"), start=1):
        if raw.endswith(b"\r"):
            raw = raw[:-1]
        where = f"{name}:{lineno}:"
        try:
            text = raw.decode("utf-8")
        except UnicodeDecodeError as e:
            raise InputError(f"{where} invalid UTF-8 at byte {e.start + 1}") from None
        if not text.strip():
            continue
        try:
            row = json.loads(text, object_pairs_hook=_object)
        except json.JSONDecodeError as e:
            hint = ""
            if e.msg == "Extra data" and "\r" in text[:e.pos]:
                hint = "; a lone CR is not a line break: end lines with LF or CRLF"
            raise InputError(f"{where} not valid JSON ({e.msg} at column {e.colno}{hint})") from None
        except RecursionError:
            raise InputError(f"{where} not valid JSON (nested too deeply)") from None
        except ValueError as e:  # e.g. an integer with more digits than Python allows
            raise InputError(f"{where} not valid JSON ({str(e).splitlines()[0].split('; use sys.')[0]})") from None
        if not isinstance(row, dict):
            raise InputError(f"{where} expected a JSON object, got {_type_name(row)}")
        if isinstance(row, _DuplicateKeys):
            raise InputError(f'{where} duplicate key "{row.duplicate}" (refused: JSON readers disagree '
                             f'on which value wins)')
        for field in ("input", "output"):
            if field not in row:
                raise InputError(f'{where} field "{field}" is missing')
            v = row[field]
            if not isinstance(v, str):
                raise InputError(f'{where} field "{field}" must be a string, got {_type_name(v)}')
            _check_encodable(where, field, v)
        if not row["output"].strip():
            raise InputError(f'{where} field "output" is empty (nothing to learn from)')
        task = row.get("task")
        if task is not None:
            if not isinstance(task, str):
                raise InputError(f'{where} field "task" must be a string or null, got {_type_name(task)}')
            _check_encodable(where, "task", task)
        out.append(Example(input=row["input"], output=row["output"], task=task, line=lineno))
    if not out:
        raise InputError(f"{name}: file is empty (no examples)")
    return out


def stream_bytes(examples: Iterable[Example]) -> int:
    """UTF-8 bytes of every input plus every output.

    This is the base of a fractional budget ("1% of the training stream"):
    the supervised text itself, not the JSON framing or extra fields, so the
    budget does not depend on how a file happens to be formatted.
    """
    return sum(len(e.input.encode("utf-8")) + len(e.output.encode("utf-8")) for e in examples)
