"""The ledger of reads: every benchmark run that scores test or report rows says what it read and why.

Why: a setting chosen on rows that are then reported gives an optimistic number, and which rows
were read for what is otherwise only prose in the docs. ``miita-edge bench --split test`` (or
``report``: training rows held out of report runs only, ``splits.report_positions``) needs
``--purpose report|explore`` and ``--why TEXT`` and appends one line per finished run to a JSONL
ledger (the repository's ``docs/results/ledger.jsonl`` when run inside a checkout;
docs/evaluation.md, "The ledger of reads"). Exploration defaults to dev rows, which are never
recorded: they never conflict.

An entry (one JSON object per line): ``time`` (UTC ISO, or null where unknown), ``benchmark``,
``split``, ``rows`` ({stage: [first, last]}, the 1-based rows of each stage's evaluated rows the
run scored, as ``result.json``'s ``rows_used``), ``method``, ``preset`` and ``version`` (the miita
preset's name and version; null for other methods), ``default_version`` (the package's default
preset version when the run was made: what decides taint), ``commit`` (of the checkout, or null),
``cpu``, ``model``, ``order_seed``, ``data`` (the data directory as given) and ``data_sha256`` (of
the file the rows came from: ``test.jsonl``, or ``train.jsonl`` for dev and report rows; null where unknown),
``purpose`` (``report`` or ``explore``), ``why`` (free text), ``out`` (the result directory) and
``row_ids`` (the sorted, de-duplicated :func:`row_id` of every row scored, from ``result.json``;
absent or null in entries written before it existed).

Rows are matched by content, not by name: :func:`row_id` is the first 12 hex digits of a salted
sha256 of a row's input and stored output (before a canned-reply benchmark replaces the output),
without its stage, benchmark or file. So ``banking77`` and ``banking77-replies`` reading the same
``test.jsonl`` rows, or a dozen-intent draw (``bench/replies_subset.py``) asking Banking77 test
rows under its own file, stages and row numbers, read the same ids.

The conflict rule (:func:`conflicts`): a ``report`` entry that reports version V conflicts with
an ``explore`` entry, both on a recorded split (``test`` or ``report``), whose ``default_version`` is below V and that read a
row of it: those rows were read while an earlier default was current, so they could have chosen V.
Where both entries have ``row_ids``, "read a row of it" means the ids intersect, whatever the
benchmark's name or data file. Where either lacks them (entries from before), it falls back to
the windows: the same benchmark, the same data (equal ``data_sha256``, or either unknown) and rows
that overlap in a stage of the same name. Explore entries read under V itself or later do not
taint V's report.
The version a report reports (:func:`reported_version`) is its ``version`` for the default preset
(``miita-default``, ``miita-default@N`` and the default's variants) and its ``default_version``
for every other method (frozen, baselines, the paper preset), which is reported beside the
default it ran under. Backfilled reads from before version 1 carry ``default_version`` 0.

Everything here is pure except :func:`append` (one ``write`` of one line on a file opened for
appending, then ``fsync``), :func:`read_ledger`, the small look-ups of the environment
(:func:`default_ledger_path`, :func:`checkout_commit`, :func:`data_sha256`) and the bench
command's edge (:func:`ledger_for`, :func:`record_read`).
"""
from __future__ import annotations

import json
import os
import re
import subprocess
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path
from typing import Any, Iterable, Mapping

from ..errors import InputError
from .splits import RECORDED_SPLITS, SPLITS, salted_digest

__all__ = ["ENV", "LedgerError", "PURPOSES", "REPO_LEDGER", "Conflict", "add_ledger_arguments", "append", "check",
           "check_purpose", "checkout_commit", "conflicts", "conflicts_of", "data_sha256", "default_ledger_path",
           "find_checkout", "ledger_for", "make_entry", "package_checkout", "parse_entry", "read_ledger",
           "record_read", "reported_version", "ROW_SALT", "row_id", "row_ids_of"]

PURPOSES = ("report", "explore")
ENV = "MIITA_EDGE_LEDGER"
#: the ledger of a checkout, relative to its root
REPO_LEDGER = Path("docs") / "results" / "ledger.jsonl"
#: presets whose version is the method's own (a miita method); any other preset name in a
#: result's ``method_settings`` (``semantic-mem``) is a baseline's version, not a preset's
MIITA_PRESETS = ("default", "paper")
#: the salt of :func:`row_id` (its own, so ids say nothing about the dev rule's hashes)
ROW_SALT = "miita-edge ledger row v1"
ROW_ID_HEX = 12
_ROW_ID = re.compile(r"[0-9a-f]{%d}" % ROW_ID_HEX)
REQUIRED = ("time", "benchmark", "split", "rows", "method", "preset", "version", "default_version", "commit",
            "purpose", "why", "out")


class LedgerError(InputError):
    """A ledger line that cannot be read; the message names the file and the line."""


# ---------------------------------------------------------------------------- the command line's rule
def check_purpose(split: str, purpose: str | None, why: str | None) -> None:
    """A run on test rows must say why (one-line InputError otherwise); a dev run needs no purpose
    and takes none, since it is not recorded."""
    if split in RECORDED_SPLITS:
        if purpose not in PURPOSES or why is None or not why.strip():
            raise InputError(f"--split {split} scores {split} rows, and every such read goes to the ledger: give "
                             "--purpose report|explore and --why TEXT (explore on dev rows: --split dev, the default)")
    elif purpose is not None or why is not None:
        raise InputError(f"--purpose and --why describe a read of test or report rows; --split {split} is not recorded")


# ---------------------------------------------------------------------------- rows by content
def row_id(x: str, y: str) -> str:
    """A row's id in the ledger: the first 12 hex digits of sha256 over ``ROW_SALT``, the input
    and the stored output, each UTF-8 and prefixed by its byte length (8 bytes, little-endian), as
    the dev rule's ``splits.row_hash`` but without the stage, so the same row read under another
    stage, benchmark or file has the same id. 48 bits: among a few thousand rows a chance
    collision is below one in ten million."""
    return salted_digest(ROW_SALT, x, y).hex()[:ROW_ID_HEX]


def row_ids_of(stages) -> list[str]:
    """The sorted, de-duplicated row ids of the evaluated rows of ``stages`` (``benchmarks.Stage``;
    each item's ``row_id``, computed as its row was read)."""
    return sorted({it.row_id for s in stages for it in s.test})


# ---------------------------------------------------------------------------- entries
def preset_of(result: Mapping[str, Any]) -> tuple[str | None, int | None]:
    """(preset name, version) of a miita method's result (``method_settings``); (None, None) for
    the frozen model and the baselines."""
    s = result.get("method_settings") or {}
    if s.get("preset") in MIITA_PRESETS and isinstance(s.get("version"), int):
        return s["preset"], s["version"]
    return None, None


def make_entry(result: Mapping[str, Any], *, purpose: str, why: str, default_version: int,
               commit: str | None = None, time: str | None = None, sha256: str | None = None) -> dict[str, Any]:
    """The ledger entry of one finished run (its ``result.json`` dict)."""
    preset, version = preset_of(result)
    return {"time": time if time is not None else datetime.now(timezone.utc).isoformat(timespec="seconds"),
            "benchmark": result["benchmark"], "split": result["split"],
            "rows": {k: [int(v[0]), int(v[1])] for k, v in result["rows_used"].items()},
            "method": result["method"], "preset": preset, "version": version, "default_version": default_version,
            "commit": commit if commit is not None else result.get("commit"),
            "cpu": (result.get("machine") or {}).get("cpu"), "model": result.get("model"),
            "order_seed": result.get("order_seed"), "data": result.get("data_dir"), "data_sha256": sha256,
            "purpose": purpose, "why": why, "out": result.get("out_dir"),
            "row_ids": None if result.get("row_ids") is None else sorted(set(result["row_ids"]))}


def _is_int(v) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


def _entry_problem(e: Any) -> str | None:
    """What is wrong with a parsed line, or None."""
    if not isinstance(e, dict):
        return "not a JSON object"
    missing = [k for k in REQUIRED if k not in e]
    if missing:
        return f"missing {', '.join(missing)}"
    if e["purpose"] not in PURPOSES:
        return f"purpose {e['purpose']!r} is not one of {', '.join(PURPOSES)}"
    if e["split"] not in SPLITS:
        return f"split {e['split']!r} is not one of {', '.join(SPLITS)}"
    if not isinstance(e["why"], str) or not e["why"].strip():
        return "why must be a non-empty string"
    if not isinstance(e["benchmark"], str) or not isinstance(e["method"], str):
        return "benchmark and method must be strings"
    if not _is_int(e["default_version"]) or e["default_version"] < 0:
        return f"default_version {e['default_version']!r} is not an integer >= 0"
    if e["version"] is not None and not _is_int(e["version"]):
        return f"version {e['version']!r} is not an integer or null"
    rows = e["rows"]
    if not isinstance(rows, dict) or not rows:
        return "rows must be a non-empty object {stage: [first, last]}"
    for stage, w in rows.items():
        if not (isinstance(w, list) and len(w) == 2 and all(_is_int(x) for x in w) and 1 <= w[0] <= w[1]):
            return f"rows of stage {stage!r} must be [first, last] with 1 <= first <= last, got {w!r}"
    ids = e.get("row_ids")
    if ids is not None:
        if not isinstance(ids, list) or not ids or not all(isinstance(i, str) and _ROW_ID.fullmatch(i) for i in ids):
            return f"row_ids must be null or a non-empty list of {ROW_ID_HEX}-digit lower-case hex strings"
        if any(a >= b for a, b in zip(ids, ids[1:])):
            return "row_ids must be sorted and without repeats"
    return None


def parse_entry(text: str, where: str) -> dict[str, Any]:
    """One ledger line, checked; a bad one is a LedgerError naming ``where`` (``FILE:LINE``)."""
    try:
        e = json.loads(text)
    except json.JSONDecodeError as exc:
        raise LedgerError(f"{where}: not JSON ({exc.msg} at column {exc.colno})") from None
    problem = _entry_problem(e)
    if problem:
        raise LedgerError(f"{where}: {problem}")
    return e


def read_ledger(path: str | os.PathLike) -> list[dict[str, Any]]:
    """Every entry of a ledger file, in order (a missing file is an empty ledger; blank lines are
    skipped); each entry gets ``_line``, its 1-based line number."""
    p = Path(path)
    if not p.exists():
        return []
    out = []
    for i, line in enumerate(p.read_text("utf-8").splitlines(), 1):
        if line.strip():
            e = parse_entry(line, f"{p}:{i}")
            e["_line"] = i
            out.append(e)
    return out


def append(path: str | os.PathLike, entry: Mapping[str, Any]) -> Path:
    """Append one entry as one line: the file is opened for appending and the line written by one
    ``write``, then flushed to disk, so concurrent runs never interleave within a line."""
    problem = _entry_problem(dict(entry))
    if problem:
        raise InputError(f"ledger entry: {problem}")
    p = Path(path).expanduser()
    p.parent.mkdir(parents=True, exist_ok=True)
    data = (json.dumps({k: v for k, v in entry.items() if not k.startswith("_")}, ensure_ascii=False,
                       allow_nan=False) + "\n").encode("utf-8")
    fd = os.open(p, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    try:
        n = os.write(fd, data)
        if n != len(data):
            raise OSError(f"{p}: wrote {n} of {len(data)} bytes of a ledger line")
        os.fsync(fd)
    finally:
        os.close(fd)
    return p


# ---------------------------------------------------------------------------- the conflict rule
def reported_version(entry: Mapping[str, Any]) -> int:
    """The default preset version a report entry reports: its own version for the default preset,
    else the default version it ran under (frozen, baselines and the paper preset are reported
    beside that default)."""
    if entry.get("preset") == "default" and _is_int(entry.get("version")):
        return entry["version"]
    return entry["default_version"]


def overlap(a: Mapping[str, list[int]], b: Mapping[str, list[int]]) -> dict[str, list[int]]:
    """{stage: [first, last]} of the rows two entries both read (stages of the same name)."""
    out = {}
    for stage, (lo, hi) in a.items():
        if stage in b:
            lo2, hi2 = b[stage]
            if max(lo, lo2) <= min(hi, hi2):
                out[stage] = [max(lo, lo2), min(hi, hi2)]
    return out


@dataclass(frozen=True)
class Conflict:
    """A report whose rows an earlier default's exploration read: ``shared`` rows by content
    (None where the windows decided), ``stages`` the overlapping windows of stages of the same
    name (may be empty when the ids decided: the same rows under other names)."""
    report: Mapping[str, Any]
    explore: Mapping[str, Any]
    stages: dict[str, list[int]]
    shared: int | None = None

    def describe(self) -> str:
        r, e = self.report, self.explore
        where = ", ".join(f"{s} {lo}-{hi}" for s, (lo, hi) in list(self.stages.items())[:3])
        more = f" and {len(self.stages) - 3} more stages" if len(self.stages) > 3 else ""
        if self.shared is not None:
            where = f"{self.shared} rows by content ({e['benchmark']}" + (f"; {where}{more})" if where else ")")
            more = ""
        who = f"line {r['_line']}" if "_line" in r else "this run"
        return (f"{who}: {r['benchmark']} {r['method']} reports default v{reported_version(r)} on test rows that "
                f"line {e.get('_line', '?')} ({e['method']}, {e['why'][:60]}) read to explore under default "
                f"v{e['default_version']}: {where}{more}")


def _same_data(a: Mapping[str, Any], b: Mapping[str, Any]) -> bool:
    x, y = a.get("data_sha256"), b.get("data_sha256")
    return x is None or y is None or x == y


def conflicts_of(report: Mapping[str, Any], entries: Iterable[Mapping[str, Any]]) -> list[Conflict]:
    """The explore entries among ``entries`` that the rule (module docstring) forbids ``report``:
    shared row ids where both have them, else the same benchmark's overlapping windows."""
    if report["purpose"] != "report" or report["split"] not in RECORDED_SPLITS:
        return []
    v = reported_version(report)
    mine = None if report.get("row_ids") is None else set(report["row_ids"])
    out = []
    for e in entries:
        if e["purpose"] != "explore" or e["split"] not in RECORDED_SPLITS or e["default_version"] >= v:
            continue
        if mine is not None and e.get("row_ids") is not None:
            shared = mine.intersection(e["row_ids"])
            if shared:
                same = e["benchmark"] == report["benchmark"]
                out.append(Conflict(report, e, overlap(report["rows"], e["rows"]) if same else {}, len(shared)))
        elif e["benchmark"] == report["benchmark"] and _same_data(report, e):
            both = overlap(report["rows"], e["rows"])
            if both:
                out.append(Conflict(report, e, both))
    return out


def conflicts(entries: Iterable[Mapping[str, Any]]) -> list[Conflict]:
    """Every (report, explore) pair the rule forbids, reports in ledger order."""
    entries = list(entries)
    return [c for r in entries for c in conflicts_of(r, entries)]


def check(path: str | os.PathLike) -> list[str]:
    """One line per conflict in the ledger at ``path`` (none: an empty list)."""
    return [f"{path}: {c.describe()}" for c in conflicts(read_ledger(path))]


# ---------------------------------------------------------------------------- where, and which commit
def _project_name(pyproject: Path) -> str | None:
    """``[project] name`` of a pyproject.toml (read by a small pattern, so Python 3.10 needs no
    TOML parser), or None."""
    try:
        text = pyproject.read_text("utf-8")
    except (OSError, UnicodeDecodeError):
        return None
    m = re.search(r"^\[project\]\s*$(.*?)(?=^\[|\Z)", text, re.M | re.S)
    n = m and re.search(r"^\s*name\s*=\s*[\"']([^\"']+)[\"']", m.group(1), re.M)
    return n.group(1) if n else None


def find_checkout(start: str | os.PathLike) -> Path | None:
    """The nearest directory at or above ``start`` with a pyproject.toml naming project miita-edge."""
    d = Path(start).resolve()
    for c in (d, *d.parents):
        if (c / "pyproject.toml").is_file() and _project_name(c / "pyproject.toml") == "miita-edge":
            return c
    return None


def default_ledger_path(env: Mapping[str, str] | None = None, cwd: str | os.PathLike | None = None) -> Path:
    """``$MIITA_EDGE_LEDGER``; else the ledger of the miita-edge checkout that contains ``cwd``
    (``docs/results/ledger.jsonl``); else ``ledger.jsonl`` in the user's miita-edge cache
    directory (``~/.cache/miita-edge`` on Linux)."""
    env = os.environ if env is None else env
    if env.get(ENV, "").strip():
        return Path(env[ENV]).expanduser()
    root = find_checkout(Path.cwd() if cwd is None else cwd)
    if root is not None:
        return root / REPO_LEDGER
    from ..runtime.fingerprint import cache_dir

    return cache_dir() / "ledger.jsonl"


def package_checkout() -> Path | None:
    """The checkout this package runs from (``python/miita_edge`` under it), or None for an
    installed copy."""
    root = Path(__file__).resolve().parents[3]
    return root if find_checkout(root) == root else None


def checkout_commit(root: Path | None = None) -> str | None:
    """``git rev-parse HEAD`` of the checkout the package runs from (or ``root``); None where
    there is none or git cannot say."""
    root = package_checkout() if root is None else root
    if root is None:
        return None
    try:
        p = subprocess.run(["git", "-C", str(root), "rev-parse", "HEAD"], capture_output=True, text=True, timeout=10)
    except (OSError, subprocess.SubprocessError):
        return None
    out = p.stdout.strip()
    return out if p.returncode == 0 and re.fullmatch(r"[0-9a-f]{40,64}", out) else None


def data_sha256(data_dir: str | os.PathLike | None, split: str) -> str | None:
    """sha256 of the file a split's rows come from (``test.jsonl``; ``train.jsonl`` for dev and report), or None."""
    if data_dir is None:
        return None
    from ..runtime.gguf_model import file_sha256

    f = Path(data_dir).expanduser() / ("test.jsonl" if split == "test" else "train.jsonl")
    try:
        return file_sha256(f)
    except OSError:
        return None


# ---------------------------------------------------------------------------- the bench command's edge
def add_ledger_arguments(p) -> None:
    """``--purpose``, ``--why`` and ``--ledger`` of ``miita-edge bench``."""
    p.add_argument("--purpose", choices=PURPOSES, help="with --split test or report (required there): report = the "
                   "numbers of an adopted version, explore = reading test rows to explore or choose")
    p.add_argument("--why", metavar="TEXT", help="with --split test or report (required there): why the rows are read; "
                   "recorded in the ledger with what was read")
    p.add_argument("--ledger", metavar="FILE", help=f"the ledger a --split test or report run appends to (default: ${ENV}, "
                   "else docs/results/ledger.jsonl of the miita-edge checkout containing the current directory, "
                   "else ledger.jsonl in the user cache directory, ~/.cache/miita-edge)")


def ledger_for(split: str, given: str | None) -> Path | None:
    """The ledger a run of ``split`` appends to (None for dev rows), checked writable before the
    run, so that hours of scoring never end in a read that cannot be recorded."""
    if split not in RECORDED_SPLITS:
        return None
    p = Path(given).expanduser() if given else default_ledger_path()
    try:
        p.parent.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise InputError(f"ledger {p}: cannot create its directory ({exc.strerror})") from None
    if not os.access(p.parent, os.W_OK) or (p.exists() and not os.access(p, os.W_OK)):
        raise InputError(f"ledger {p}: not writable")
    return p


def record_read(result: Mapping[str, Any], purpose: str, why: str, path: Path) -> tuple[str, list[str]]:
    """Append a finished run's entry; (the line saying where it went, warnings: the conflicts the
    new entry makes, or why the ledger could not be checked)."""
    from ..method.presets import get_preset

    entry = make_entry(result, purpose=purpose, why=why, default_version=get_preset("default").version,
                       sha256=data_sha256(result.get("data_dir"), result["split"]))
    p = append(path, entry)
    n = sum(hi - lo + 1 for lo, hi in entry["rows"].values())
    note = f"ledger: recorded the read of {n} test rows ({purpose}) in {p}"
    try:
        warn = [f"ledger: {c.describe()}" for c in conflicts_of(entry, read_ledger(p))]
    except LedgerError as exc:
        warn = [f"ledger: the entry was recorded, but the ledger cannot be checked: {exc}"]
    return note, warn
