"""Reliability campaign, inputs: fuzzed JSONL files against the real ``ingest``.

Target: every file is either *accepted* (exit 0, the memory advances by exactly one version and
its example count -- examples + skipped -- grows by the number of valid rows) or *rejected
cleanly* (exit 2, nothing on stdout, exactly one line on stderr that names the file and, for a
problem in a row, its 1-based line, and the memory directory byte-for-byte unchanged: a SHA-256
of every file in it is compared before and after). A traceback, any other exit code, an
exception escaping ``main`` or an outcome other than the one the mutation implies is a failure.

How: files are drawn from a grammar of valid rows (random key order, separators, escapes,
unicode, optional ``task``, extra fields) and one mutation kind per file (see ``KINDS``). Each
kind says what must happen: ``accept`` or ``reject`` and, for a rejection caused by a row, the
line the message must name. Every file is ingested in-process through
``miita_edge.cli.main(["ingest", FILE, "--memory", MEM, "--budget", "16KiB", "--json"])`` into
one existing memory -- the real CLI path, argument parsing, validation, extraction, budget
repair and the atomic commit -- with one change: ``Miita.__init__`` is wrapped so that every
``Miita`` of the process reuses one ``Engine`` (the model is loaded once, not 10,000 times).
Then a sample is run through the real process (``python -m miita_edge.cli ingest ...``) to
check what a user sees: the exit status, one stderr line, no traceback.

Duplicate keys (``{"input": "a", "input": "b", ...}``) are refused: JSON parsers disagree on
which one wins (first, last, error), so such a row means different things to different tools.

    python tests/reliability/reliability_inputs.py [--count 10000] [--seed 0] [--subprocess-sample 200]
                                       [--long-lines 10] [--keep DIR]

Exit status 0 when every file meets the target, 1 otherwise.
"""
from __future__ import annotations

import argparse
import contextlib
import hashlib
import io
import json
import os
import random
import shlex
import shutil
import subprocess
import sys
import tempfile
import time
import traceback
from dataclasses import dataclass, field
from pathlib import Path

from _campaign_env import child_env  # importing it puts the package on sys.path

BUDGET = "16KiB"

# --------------------------------------------------------------------------- grammar

WORDS = ["billing", "shipping", "refund", "card", "order", "late", "where", "is", "my", "parcel", "the",
         "número", "café", "naïve", "Grüße", "東京", "привет", "😀", "a\tb", "x\"y", "back\\slash", "2+2",
         "<tag>", "emoji 🚀", "ς", "\u2028", "line\nbreak", "ok"]
LABELS = ["billing desk", "shipping desk", "refund", "card issue", "yes", "no", "Paris", "四", "über"]
EXTRA_VALUES = [0, -1, 3.5, 1e300, True, False, None, "x", [], {}, [1, "a", None], {"k": {"j": [1, 2]}}]


def _text(rng: random.Random, n: tuple[int, int] = (1, 5)) -> str:
    return " ".join(rng.choice(WORDS) for _ in range(rng.randint(*n)))


def valid_row(rng: random.Random) -> dict:
    row = {"input": _text(rng), "output": rng.choice(LABELS)}
    r = rng.random()
    if r < 0.3:
        row["task"] = rng.choice(["t1", "banking", "qa", ""])
    elif r < 0.4:
        row["task"] = None
    if rng.random() < 0.3:
        row[rng.choice(["id", "meta", "source", "score"])] = rng.choice(EXTRA_VALUES)
    return row


def dump(row, rng: random.Random) -> str:
    """One JSON line with a random but valid surface: key order, separators, ASCII escapes."""
    if isinstance(row, dict) and rng.random() < 0.5:
        items = list(row.items())
        rng.shuffle(items)
        row = dict(items)
    seps = rng.choice([(",", ":"), (", ", ": "), (" , ", " : ")])
    return json.dumps(row, ensure_ascii=rng.random() < 0.5, separators=seps)


def encode_lines(lines: list[str], rng: random.Random | None = None, eol: str = "\n", final_eol: bool = True) -> bytes:
    body = eol.join(lines) + (eol if final_eol else "")
    return body.encode("utf-8")


@dataclass
class Case:
    """One generated input: where it is, what must happen, and why."""

    kind: str
    path: str
    expect: str  # "accept" | "reject"
    rows: int = 0  # valid rows, for an accepted file
    line: int | None = None  # 1-based line a rejection must name (None: the file only)
    note: str = ""


# Each generator gets (rng, directory, index) and returns a Case. ``_rows`` makes 1-3 valid rows
# and ``_reject_at`` swaps the text of one of them for a mutated line.

def _rows(rng, lo=1, hi=3):
    return [valid_row(rng) for _ in range(rng.randint(lo, hi))]


def _write(d: Path, idx: int, data: bytes, name: str | None = None) -> str:
    p = d / (name or f"f{idx:05d}.jsonl")
    p.write_bytes(data)
    return str(p)


def _reject_at(rng, d, idx, kind, bad_line: str | bytes, note=""):
    rows = _rows(rng)
    k = rng.randrange(len(rows) + 1)  # position of the bad line among the good ones
    lines: list[bytes] = [dump(r, rng).encode("utf-8") for r in rows]
    lines.insert(k, bad_line if isinstance(bad_line, bytes) else bad_line.encode("utf-8", "surrogatepass"))
    data = b"\n".join(lines) + (b"\n" if rng.random() < 0.8 else b"")
    return Case(kind, _write(d, idx, data), "reject", line=k + 1, note=note)


def _accept(rng, d, idx, kind, rows, data: bytes, note=""):
    return Case(kind, _write(d, idx, data), "accept", rows=rows, note=note)


def g_valid(rng, d, idx):
    rows = _rows(rng)
    return _accept(rng, d, idx, "valid", len(rows), encode_lines([dump(r, rng) for r in rows]))


def g_crlf(rng, d, idx):
    rows = _rows(rng)
    return _accept(rng, d, idx, "crlf", len(rows), encode_lines([dump(r, rng) for r in rows], eol="\r\n",
                                                                 final_eol=rng.random() < 0.7))


def g_bom_start(rng, d, idx):
    rows = _rows(rng)
    return _accept(rng, d, idx, "bom_start", len(rows), b"\xef\xbb\xbf" + encode_lines([dump(r, rng) for r in rows]))


def g_blank_lines(rng, d, idx):
    rows = _rows(rng)
    out = []
    for r in rows:
        for _ in range(rng.randint(0, 2)):
            out.append(rng.choice(["", " ", "\t", "  \t ", "\r"]))
        out.append(dump(r, rng))
    out += [""] * rng.randint(0, 3)
    return _accept(rng, d, idx, "blank_lines", len(rows), encode_lines(out))


def g_no_final_newline(rng, d, idx):
    rows = _rows(rng)
    return _accept(rng, d, idx, "no_final_newline", len(rows), encode_lines([dump(r, rng) for r in rows], final_eol=False))


def g_extra_nested(rng, d, idx):
    rows = _rows(rng)
    for r in rows:
        depth = rng.randint(2, 60)
        v: object = rng.choice(EXTRA_VALUES)
        for _ in range(depth):
            v = {"n": v} if rng.random() < 0.5 else [v]
        r[rng.choice(["meta", "extra", "context"])] = v
    return _accept(rng, d, idx, "extra_nested", len(rows), encode_lines([dump(r, rng) for r in rows]))


def g_escaped_nul(rng, d, idx):
    rows = _rows(rng)
    r = rng.choice(rows)
    f = rng.choice(["input", "output"])
    r[f] = r[f] + "\x00" + rng.choice(["", "tail"])
    return _accept(rng, d, idx, "escaped_nul", len(rows), encode_lines([json.dumps(r) for r in rows]),
                   note="\\u0000 inside a string is content")


def g_unicode(rng, d, idx):
    rows = _rows(rng)
    r = rng.choice(rows)
    r["input"] = r["input"] + rng.choice(["\U0001F600", "\u00e9\u0301", "\u200b", "\ufeff", "\U00010348", "\x7f"])
    return _accept(rng, d, idx, "unicode", len(rows), encode_lines([dump(r, rng) for r in rows]),
                   note="paired surrogate escapes, ZWSP, BOM inside a string")


def g_empty_input(rng, d, idx):
    rows = _rows(rng)
    rng.choice(rows)["input"] = rng.choice(["", " ", "\n"])
    return _accept(rng, d, idx, "empty_input", len(rows), encode_lines([dump(r, rng) for r in rows]))


def g_huge_number_extra(rng, d, idx):
    rows = _rows(rng)
    lines = [dump(r, rng) for r in rows]
    k = rng.randrange(len(lines))
    num = rng.choice(["1e999", "-1e999", "9" * 4000, "1" + "0" * 300 + ".5", "NaN", "Infinity", "-0.0"])
    lines[k] = lines[k][:-1] + f', "big": {num}}}'
    return _accept(rng, d, idx, "huge_number_extra", len(rows), encode_lines(lines),
                   note="extra fields are ignored")


def g_combo_accept(rng, d, idx):
    rows = _rows(rng)
    out = []
    for r in rows:
        if rng.random() < 0.5:
            out.append(rng.choice(["", " \t"]))
        out.append(dump(r, rng))
    data = encode_lines(out, eol=rng.choice(["\n", "\r\n"]), final_eol=rng.random() < 0.5)
    if rng.random() < 0.5:
        data = b"\xef\xbb\xbf" + data
    return _accept(rng, d, idx, "combo_accept", len(rows), data)


INVALID_UTF8 = [b"\xff", b"\xfe", b"\xc3\x28", b"\xc0\xaf", b"\xe0\x80\xaf", b"\xed\xa0\x80", b"\xf8\x88\x80\x80\x80",
                b"\xe2\x82", b"\x80", b"\xf4\x90\x80\x80"]


def g_invalid_utf8(rng, d, idx):
    row = dump(valid_row(rng), rng).encode("utf-8")
    pos = row.index(b'"input"') + len(b'"input"')
    pos = row.index(b'"', pos + 1) + 1  # inside the input string
    bad = rng.choice(INVALID_UTF8)
    where = rng.random()
    if where < 0.7:
        line = row[:pos] + bad + row[pos:]
    elif where < 0.85:
        line = bad + row
    else:
        line = row + bad
    return _reject_at(rng, d, idx, "invalid_utf8", line)


def g_raw_nul(rng, d, idx):
    row = dump(valid_row(rng), rng).encode("utf-8")
    p = rng.randrange(len(row) + 1)
    return _reject_at(rng, d, idx, "raw_nul", row[:p] + b"\x00" + row[p:])


WRONG_VALUES = [0, 1, -7, 3.25, 1e308, True, False, None, [], ["a"], {}, {"text": "a"}, [[["deep"]]]]


def g_wrong_type(rng, d, idx):
    row = valid_row(rng)
    f = rng.choice(["input", "output", "task"])
    choices = [v for v in WRONG_VALUES if not (f == "task" and v is None)]
    row[f] = rng.choice(choices)
    return _reject_at(rng, d, idx, f"wrong_type_{f}", dump(row, rng))


def g_nested_object(rng, d, idx):
    row = valid_row(rng)
    f = rng.choice(["input", "output"])
    row[f] = {"text": row[f], "lang": "en"}
    return _reject_at(rng, d, idx, "nested_object", dump(row, rng))


def g_missing_field(rng, d, idx):
    row = valid_row(rng)
    for f in rng.sample(["input", "output"], rng.randint(1, 2)):
        del row[f]
    return _reject_at(rng, d, idx, "missing_field", dump(row, rng))


def g_empty_output(rng, d, idx):
    row = valid_row(rng)
    row["output"] = rng.choice(["", " ", "\t", "\n", " \r\n ", "\u00a0", "\u3000", "\u2028"])
    return _reject_at(rng, d, idx, "empty_output", dump(row, rng))


def g_duplicate_key(rng, d, idx):
    row = valid_row(rng)
    f = rng.choice(["input", "output", "task"])
    row.setdefault(f, "t")  # the key must be there once already to be duplicated
    other = rng.choice(["b", "other value", row.get(f) or "x"])
    text = dump(row, rng)
    line = text[:-1] + ("," if len(row) else "") + f" {json.dumps(f)}: {json.dumps(other)}}}"
    return _reject_at(rng, d, idx, "duplicate_key", line, note="refused: parsers disagree which wins")


def g_bom_mid(rng, d, idx):
    rows = _rows(rng, 2, 3)
    lines = [dump(r, rng).encode("utf-8") for r in rows]
    k = rng.randrange(1, len(lines))
    lines[k] = b"\xef\xbb\xbf" + lines[k]
    data = b"\n".join(lines) + b"\n"
    if rng.random() < 0.3:
        data = b"\xef\xbb\xbf" + data
    return Case("bom_mid", _write(d, idx, data), "reject", line=k + 1)


def g_bom_twice(rng, d, idx):
    rows = _rows(rng)
    data = b"\xef\xbb\xbf\xef\xbb\xbf" + encode_lines([dump(r, rng) for r in rows])
    return Case("bom_twice", _write(d, idx, data), "reject", line=1)


def g_lone_cr(rng, d, idx):
    rows = _rows(rng, 2, 3)
    lines = [dump(r, rng) for r in rows]
    k = rng.randrange(len(lines) - 1)  # rows k and k+1 are joined by a lone CR
    joined = lines[:k] + [lines[k] + "\r" + lines[k + 1]] + lines[k + 2:]
    return Case("lone_cr", _write(d, idx, encode_lines(joined)), "reject", line=k + 1)


def g_trailing_garbage(rng, d, idx):
    row = dump(valid_row(rng), rng)
    return _reject_at(rng, d, idx, "trailing_garbage", row + rng.choice([",", " x", "}", "]", " {}", "\x01", "#c"]))


def g_truncated(rng, d, idx):
    row = dump(valid_row(rng), rng)
    cut = rng.randrange(1, len(row) - 1)
    return _reject_at(rng, d, idx, "truncated_json", row[:cut])


def g_huge_int_field(rng, d, idx):
    row = dump(valid_row(rng), rng)
    return _reject_at(rng, d, idx, "huge_int", row[:-1] + ', "n": ' + "7" * rng.randint(4400, 20000) + "}")


def g_deep_nesting(rng, d, idx):
    n = rng.randint(50_000, 200_000)
    row = dump(valid_row(rng), rng)
    return _reject_at(rng, d, idx, "deep_nesting", row[:-1] + ', "deep": ' + "[" * n + "]" * n + "}")


def g_unpaired_surrogate(rng, d, idx):
    row = valid_row(rng)
    f = rng.choice(["input", "output", "task"])
    esc = rng.choice(["\\ud800", "\\udfff", "\\ud83d", "\\ude00x", "a\\udc00b"])
    base = json.dumps({**row, f: "@@"})
    return _reject_at(rng, d, idx, "unpaired_surrogate", base.replace('"@@"', f'"{esc}"'))


def g_non_object(rng, d, idx):
    return _reject_at(rng, d, idx, "non_object", rng.choice(
        ["[]", '["input", "output"]', '"a string"', "42", "-3.5", "null", "true", "false",
         json.dumps([valid_row(rng)])]))


def g_not_json(rng, d, idx):
    return _reject_at(rng, d, idx, "not_json", rng.choice(
        ["input=a output=b", "{'input': 'a', 'output': 'b'}", "{input: \"a\", output: \"b\"}", "{", "}", ",",
         '{"input": "a" "output": "b"}', '{"input": "a", "output": "b",}', "<html>", "\x1b[31m"]))


def g_raw_control_in_string(rng, d, idx):
    row = dump(valid_row(rng), rng)
    p = row.index('"', row.index('"input"') + 7) + 1
    return _reject_at(rng, d, idx, "raw_control", row[:p] + rng.choice(["\t", "\x01", "\x1f", "\r"]) + row[p:])


def g_empty_file(rng, d, idx):
    data = rng.choice([b"", b"\n", b"\n\n \n", b"\xef\xbb\xbf", b"\xef\xbb\xbf\r\n", b"   \t\r\n"])
    return Case("empty_file", _write(d, idx, data), "reject")


def g_directory(rng, d, idx):
    p = d / f"f{idx:05d}.jsonl"
    p.mkdir()
    if rng.random() < 0.5:
        (p / "inner.jsonl").write_text('{"input":"a","output":"b"}\n')
    return Case("directory", str(p), "reject")


def g_missing_file(rng, d, idx):
    return Case("missing_file", str(d / f"missing-{idx:05d}.jsonl"), "reject")


def g_binary(rng, d, idx):
    data = bytes(rng.randrange(256) for _ in range(rng.randint(1, 400)))
    if not data.strip():
        data = b"\x00"
    return Case("binary_garbage", _write(d, idx, data), "reject", line=-1)  # some line, not known in advance


def g_odd_name(rng, d, idx):
    name = rng.choice(["with space.jsonl", "ünïcødé.jsonl", "new\nline.jsonl", "tab\there.jsonl", "semi;colon.jsonl",
                       "quote'\".jsonl", "cr\rname.jsonl", "esc\x1b[31m.jsonl"])
    name = f"{idx:05d}-{name}"
    row = valid_row(rng)
    del row["output"]
    data = (dump(row, rng) + "\n").encode()
    return Case("odd_filename", _write(d, idx, data, name=name), "reject", line=1,
                note="the message must stay on one line")


def g_long_line(rng, d, idx, variant=0):
    """A long line. ``variant`` 0-2: ~10 MB -- valid JSON with a huge input (longer than any
    context), a huge extra field, or 10 MB of non-JSON; 3-4: an input of ~3,000 tokens (fits the
    default 4,096-token context) or ~6,000 (does not). Slow (tokenising 10 MB, decoding 3,000
    tokens), so only a few per campaign."""
    size = 10 * 1024 * 1024
    variant %= 5
    row = valid_row(rng)
    if variant == 3:
        row["input"] = " ".join(rng.choice(["word", "alpha", "beta", "gamma"]) for _ in range(3000))
        return _accept(rng, d, idx, "long_row_ctx", 1, (json.dumps(row) + "\n").encode(), note="~3,000 tokens")
    if variant == 4:
        row["input"] = " ".join(rng.choice(["word", "alpha", "beta", "gamma"]) for _ in range(6000))
        return _reject_at(rng, d, idx, "long_row_ctx", json.dumps(row), note="~6,000 tokens > context")
    if variant == 0:
        row["input"] = ("lorem ipsum " * (size // 12 + 1))[:size]
        return _reject_at(rng, d, idx, "long_line_10mb", json.dumps(row), note="input longer than the context")
    if variant == 1:
        row["blob"] = "z" * size
        rows = [row]
        return _accept(rng, d, idx, "long_line_10mb", 1, (json.dumps(row) + "\n").encode(), note="10 MB extra field")
    return _reject_at(rng, d, idx, "long_line_10mb", "x" * size, note="10 MB of non-JSON")


# (generator, weight). Accepted files cost a model pass per row (~0.1-0.3 s); rejections ~1 ms.
KINDS = [
    (g_valid, 2), (g_crlf, 1), (g_bom_start, 1), (g_blank_lines, 1), (g_no_final_newline, 1), (g_extra_nested, 1),
    (g_escaped_nul, 1), (g_unicode, 1), (g_empty_input, 1), (g_huge_number_extra, 1), (g_combo_accept, 2),
    (g_invalid_utf8, 10), (g_raw_nul, 8), (g_wrong_type, 12), (g_nested_object, 5), (g_missing_field, 6),
    (g_empty_output, 6), (g_duplicate_key, 6), (g_bom_mid, 4), (g_bom_twice, 2), (g_lone_cr, 4),
    (g_trailing_garbage, 5), (g_truncated, 5), (g_huge_int_field, 2), (g_deep_nesting, 2),
    (g_unpaired_surrogate, 5), (g_non_object, 5), (g_not_json, 5), (g_raw_control_in_string, 3),
    (g_empty_file, 3), (g_directory, 2), (g_missing_file, 2), (g_binary, 3), (g_odd_name, 3),
]


def generate(count: int, seed: int, directory: Path, long_lines: int) -> list[Case]:
    """``count`` cases (``long_lines`` of them 10 MB lines), deterministic for a seed."""
    rng = random.Random(seed)
    gens = [g for g, _ in KINDS]
    weights = [w for _, w in KINDS]
    long_lines = min(long_lines, count)
    long_at = sorted(rng.sample(range(count), long_lines)) if long_lines else []
    variant = {i: j for j, i in enumerate(long_at)}  # the three variants in turn
    cases = []
    for i in range(count):
        sub = random.Random(rng.getrandbits(64))
        if i in variant:
            cases.append(g_long_line(sub, directory, i, variant[i]))
        else:
            cases.append(rng.choices(gens, weights)[0](sub, directory, i))
    return cases


# --------------------------------------------------------------------------- checking

def digest_dir(path: Path, lock_content: bool = True) -> dict[str, str]:
    """SHA-256 of every file under ``path`` (relative name -> digest; directories as 'dir').
    ``lock_content=False``: the writer's ``.lock`` holds the pid of the last process that took
    the lock, so across processes only its presence is compared."""
    out: dict[str, str] = {}
    for root, dirs, files in os.walk(path):
        for dname in dirs:
            out[os.path.relpath(os.path.join(root, dname), path) + "/"] = "dir"
        for fname in files:
            full = os.path.join(root, fname)
            rel = os.path.relpath(full, path)
            if rel == ".lock" and not lock_content:
                out[rel] = "present"
                continue
            with open(full, "rb") as fh:
                out[rel] = hashlib.sha256(fh.read()).hexdigest()
    return out


def memory_counts(mem: Path) -> tuple[int, int]:
    """(version, examples + skipped) of the committed memory, verifying every CRC."""
    from miita_edge.memory.meta import expand
    from miita_edge.memory.store import Store

    snap = Store(mem).read()
    meta = expand(snap.manifest, snap.arrays)  # the memory's fields in the long form (format 1 or 2)
    return snap.version, int(meta["examples"]) + int(meta["skipped"])


@dataclass
class Outcome:
    rc: object  # int, or a string describing an escaped exception
    stdout: str
    stderr: str
    seconds: float


def check(case: Case, out: Outcome, before: dict, after: dict, counts_before, counts_after) -> tuple[str, str]:
    """('accepted' | 'rejected' | 'failure', why). Pure: the self-test feeds it planted failures."""
    err = out.stderr
    if "Traceback" in err or "Traceback" in out.stdout:
        last = (err.strip().splitlines() or ["?"])[-1]
        return "failure", f"traceback ({last[:160]})"
    if out.rc == 0:
        if case.expect != "accept":
            return "failure", "accepted a file that must be rejected"
        if err.strip():
            return "failure", f"stderr on success: {err.strip()[:120]!r}"
        v0, n0 = counts_before
        v1, n1 = counts_after
        if v1 != v0 + 1:
            return "failure", f"version {v0} -> {v1}, expected +1"
        if n1 - n0 != case.rows:
            return "failure", f"example count grew by {n1 - n0}, expected {case.rows}"
        try:
            rep = json.loads(out.stdout)
        except ValueError:
            return "failure", f"stdout is not one JSON object: {out.stdout[:120]!r}"
        if rep.get("version") != v1 or rep.get("examples", 0) + rep.get("skipped", 0) != case.rows:
            return "failure", f"report disagrees with the memory: {out.stdout[:160]!r}"
        return "accepted", ""
    if out.rc == 2:
        if case.expect != "reject":
            return "failure", f"rejected a valid file: {err.strip()[:200]!r}"
        if out.stdout.strip():
            return "failure", f"stdout on rejection: {out.stdout[:120]!r}"
        if not err.endswith("\n") or err.count("\n") != 1:
            return "failure", f"stderr is not exactly one line: {err[:200]!r}"
        if after != before:
            changed = sorted(k for k in set(before) | set(after) if before.get(k) != after.get(k))
            return "failure", f"memory changed on rejection: {changed[:5]}"
        if counts_after != counts_before:
            return "failure", "memory version/count changed on rejection"
        shown = _shown_name(case.path)
        if shown not in err:
            return "failure", f"error does not name the file: {err.strip()[:200]!r}"
        if case.line is not None:
            if case.line == -1:
                if not any(f"{shown}:{n}:" in err for n in range(1, 10_000)):
                    return "failure", f"error names no line: {err.strip()[:200]!r}"
            elif f"{shown}:{case.line}:" not in err:
                return "failure", f"error does not name line {case.line}: {err.strip()[:200]!r}"
        return "rejected", ""
    return "failure", f"exit {out.rc!r}: {err.strip()[-300:]!r}"


def _shown_name(path: str) -> str:
    """How a file name appears in a one-line error: control characters escaped."""
    from miita_edge.cli import one_line

    return one_line(path)


# --------------------------------------------------------------------------- runners

def install_shared_engine():
    """Make every ``Miita`` in this process reuse one Engine (loaded now, once); return it."""
    import miita_edge.miita as miita_mod
    from miita_edge.runtime.engine import Engine, EngineConfig

    engine = Engine(None, EngineConfig())
    original = miita_mod.Miita.__init__

    def init(self, model=None, memory=None, preset=None, template=None, engine=None, engine_config=None):
        original(self, model, memory, preset, template, engine=shared, engine_config=engine_config)

    shared = engine
    miita_mod.Miita.__init__ = init
    return engine, lambda: setattr(miita_mod.Miita, "__init__", original)


def run_inprocess(path: str, mem: Path, main=None) -> Outcome:
    """``miita_edge.cli.main`` on one file, stdout/stderr captured; an escaping exception is
    recorded with its traceback (it would be one in the real process)."""
    if main is None:
        from miita_edge.cli import main
    out, err = io.StringIO(), io.StringIO()
    t0 = time.perf_counter()
    try:
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
            rc = main(["ingest", path, "--memory", str(mem), "--budget", BUDGET, "--json"])
    except SystemExit as exc:  # argparse
        rc = exc.code
    except BaseException:  # noqa: BLE001 - exactly what the campaign is looking for
        err.write(traceback.format_exc())
        rc = "exception"
    return Outcome(rc, out.getvalue(), err.getvalue(), time.perf_counter() - t0)


def run_subprocess(path: str, mem: Path) -> Outcome:
    env = child_env()
    t0 = time.perf_counter()
    p = subprocess.run([sys.executable, "-m", "miita_edge.cli", "ingest", path, "--memory", str(mem),
                        "--budget", BUDGET, "--json"], capture_output=True, env=env, timeout=600)
    return Outcome(p.returncode, p.stdout.decode("utf-8", "replace"), p.stderr.decode("utf-8", "replace"),
                   time.perf_counter() - t0)


def seed_memory(mem: Path, runner) -> None:
    """The existing memory every case is ingested into (3 rows, version 1)."""
    d = mem.parent / "seed.jsonl"
    d.write_text("".join(json.dumps({"input": f"seed message {i} about {w}", "output": w}) + "\n"
                         for i, w in enumerate(["billing", "shipping", "refund"])))
    out = runner(str(d), mem)
    if out.rc != 0:
        raise SystemExit(f"cannot create the seed memory: {out.stderr}")


@dataclass
class Tally:
    count: int = 0
    accepted: int = 0
    rejected: int = 0
    failures: int = 0
    seconds: float = 0.0
    examples: list = field(default_factory=list)


def campaign(cases: list[Case], mem: Path, runner, lock_content: bool = True, progress=None) -> dict[str, Tally]:
    table: dict[str, Tally] = {}
    counts = memory_counts(mem)
    for i, case in enumerate(cases):
        before = digest_dir(mem, lock_content)
        out = runner(case.path, mem)
        after = digest_dir(mem, lock_content)
        try:
            counts_after = memory_counts(mem)
        except Exception as exc:  # noqa: BLE001 - a memory that no longer opens is a failure
            counts_after = ("unreadable", str(exc))
        verdict, why = check(case, out, before, after, counts, counts_after)
        counts = counts_after if not isinstance(counts_after[0], str) else counts
        t = table.setdefault(case.kind, Tally())
        t.count += 1
        t.seconds += out.seconds
        if verdict == "accepted":
            t.accepted += 1
        elif verdict == "rejected":
            t.rejected += 1
        else:
            t.failures += 1
            if len(t.examples) < 3:
                t.examples.append(f"{case.path}: {why}")
        if progress and (i + 1) % progress == 0:
            print(f"  ... {i + 1}/{len(cases)} files", file=sys.stderr, flush=True)
    return table


def print_table(title: str, table: dict[str, Tally]) -> int:
    print(f"\n{title}")
    print(f"{'kind':22s} {'count':>6s} {'accepted':>9s} {'rejected':>9s} {'failures':>9s} {'seconds':>9s}")
    tot = Tally()
    for kind in sorted(table):
        t = table[kind]
        print(f"{kind:22s} {t.count:6d} {t.accepted:9d} {t.rejected:9d} {t.failures:9d} {t.seconds:9.1f}")
        for tot_f in ("count", "accepted", "rejected", "failures", "seconds"):
            setattr(tot, tot_f, getattr(tot, tot_f) + getattr(t, tot_f))
    print(f"{'TOTAL':22s} {tot.count:6d} {tot.accepted:9d} {tot.rejected:9d} {tot.failures:9d} {tot.seconds:9.1f}")
    for kind in sorted(table):
        for ex in table[kind].examples:
            print(f"  FAIL {kind}: {ex}")
    return tot.failures


def stratified_sample(cases: list[Case], n: int, seed: int, max_accepts: int = 12) -> list[Case]:
    """Up to ``n`` cases covering every kind, at most ``max_accepts`` accepted files (each loads
    the model in its own process) and no long line."""
    rng = random.Random(seed + 1)
    by_kind: dict[str, list[Case]] = {}
    for c in cases:
        if not c.kind.startswith("long_"):
            by_kind.setdefault(c.kind, []).append(c)
    picked, accepts = [], 0
    while len(picked) < n and any(by_kind.values()):
        for kind in sorted(by_kind):
            pool = by_kind[kind]
            if not pool or len(picked) >= n:
                continue
            c = pool.pop(rng.randrange(len(pool)))
            if c.expect == "accept":
                if accepts >= max_accepts:
                    continue
                accepts += 1
            picked.append(c)
    return picked


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--count", type=int, default=10_000, help="fuzzed files (default: 10000)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--long-lines", type=int, default=10, help="how many of them are long lines: ~10 MB ones and "
                    "rows of ~3,000 and ~6,000 tokens, in turn (default: 10)")
    ap.add_argument("--subprocess-sample", type=int, default=200,
                    help="files also run through the real CLI process (default: 200)")
    ap.add_argument("--keep", metavar="DIR", help="generate into DIR and keep it (default: a temporary directory)")
    args = ap.parse_args(argv)
    print("command:", shlex.join([sys.executable, *sys.argv]))
    work = Path(args.keep) if args.keep else Path(tempfile.mkdtemp(prefix="miita-rel-inputs-"))
    work.mkdir(parents=True, exist_ok=True)
    try:
        t0 = time.perf_counter()
        files = work / "files"
        if files.exists():
            shutil.rmtree(files)
        files.mkdir()
        cases = generate(args.count, args.seed, files, args.long_lines)
        print(f"generated {len(cases)} files in {time.perf_counter() - t0:.1f} s under {files}")
        t1 = time.perf_counter()
        engine, _restore = install_shared_engine()
        print(f"model loaded once in {time.perf_counter() - t1:.1f} s: {engine.info.path}")
        mem = work / "memory"
        if mem.exists():
            shutil.rmtree(mem)
        seed_memory(mem, run_inprocess)
        t2 = time.perf_counter()
        table = campaign(cases, mem, run_inprocess, progress=1000)
        wall = time.perf_counter() - t2
        fails = print_table(f"in-process: {len(cases)} files through miita_edge.cli.main, one memory, "
                            f"--budget {BUDGET} ({wall:.1f} s)", table)
        sfails = 0
        if args.subprocess_sample:
            sample = stratified_sample(cases, args.subprocess_sample, args.seed)
            t3 = time.perf_counter()
            stable = campaign(sample, mem, run_subprocess, lock_content=False)
            sfails = print_table(f"subprocess: {len(sample)} of them through `python -m miita_edge.cli ingest` "
                                 f"({time.perf_counter() - t3:.1f} s; .lock compared by presence: it holds the pid)",
                                 stable)
        v, n = memory_counts(mem)
        print(f"\nmemory after the campaign: version {v}, {n} examples, opens with every CRC verified")
        print(f"total {time.perf_counter() - t0:.1f} s; failures: in-process {fails}, subprocess {sfails}")
        ok = fails == 0 and sfails == 0
        print("TARGET MET" if ok else "TARGET MISSED")
        return 0 if ok else 1
    finally:
        if not args.keep:
            shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
