"""What every benchmark in bench/ prints around its figures: a header (command line, date, machine,
versions, commit) and target lines that say ``met`` or ``MISSED``.

A figure copied into docs/benchmarks.md is only worth what its provenance says, and the machines
these run on are shared and differ, so the header travels with every run. Targets are named and
can be overridden from the command line (``--target NAME=LIMIT``): an impossible limit shows that
a run really can print a miss, without editing the script.
"""
from __future__ import annotations

import argparse
import datetime
import importlib.util
import os
import platform
import shlex
import subprocess
import sys
from dataclasses import dataclass, field
from importlib import metadata
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def cpu_model() -> str:
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as fh:
            for line in fh:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def cores() -> str:
    usable = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    return f"{os.cpu_count()} cores ({usable} usable)"


def dist_version(name: str) -> str:
    try:
        return metadata.version(name)
    except metadata.PackageNotFoundError:
        return "not installed"


def git_commit(path: Path = ROOT) -> str:
    """Short hash of the checkout at ``path``, with ``+changes`` when tracked files differ from it."""
    try:
        head = subprocess.run(["git", "-C", str(path), "rev-parse", "--short", "HEAD"], capture_output=True,
                              text=True, timeout=10)
        if head.returncode != 0:
            return "unknown (not a git checkout)"
        dirty = subprocess.run(["git", "-C", str(path), "status", "--porcelain", "--untracked-files=no"],
                               capture_output=True, text=True, timeout=10).stdout.strip()
        return head.stdout.strip() + ("+changes" if dirty else "")
    except (OSError, subprocess.TimeoutExpired):
        return "unknown (no git)"


def package_origin() -> str:
    """Where ``import miita_edge`` resolves, without importing it: this checkout's sources or an install."""
    spec = importlib.util.find_spec("miita_edge")
    if spec is None or not spec.origin:
        return "miita_edge not importable"
    pkg = Path(spec.origin).resolve().parent
    if ROOT in pkg.parents:
        return f"this checkout ({pkg.relative_to(ROOT)}), commit {git_commit()}"
    return f"installed {dist_version('miita-edge')} at {pkg} (checkout of this script: commit {git_commit()})"


def command_line(argv: list[str] | None = None) -> str:
    script = Path(sys.argv[0]).resolve()
    try:
        shown = str(script.relative_to(ROOT))
    except ValueError:
        shown = str(script)
    args = sys.argv[1:] if argv is None else list(argv)
    return shlex.join(["python", shown, *args])


def header_lines(argv: list[str] | None = None) -> list[str]:
    import numpy

    load = " ".join(f"{x:.1f}" for x in os.getloadavg()) if hasattr(os, "getloadavg") else "?"
    now = datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC")
    return [f"# command: {command_line(argv)}",
            f"# date: {now}",
            f"# machine: {cpu_model()}, {cores()}, {platform.machine()}, load average {load}",
            f"# versions: python {platform.python_version()}, llama-cpp-python {dist_version('llama_cpp_python')}, "
            f"numpy {numpy.__version__}",
            f"# miita_edge: {package_origin()}"]


def print_header(argv: list[str] | None = None) -> None:
    print("\n".join(header_lines(argv)), flush=True)


# ----------------------------------------------------------------------------- targets
OPS = {"<=": lambda v, lim: v <= lim, ">=": lambda v, lim: v >= lim}


@dataclass
class Target:
    """One figure's goal: ``value OP limit`` (``unit`` only for printing)."""
    name: str
    op: str
    limit: float
    unit: str = ""
    what: str = ""


@dataclass
class Targets:
    """A script's named targets, their command-line overrides, and what each check said."""
    targets: dict[str, Target]
    results: list[tuple[str, float, bool]] = field(default_factory=list)

    @classmethod
    def from_args(cls, targets: list[Target], overrides: list[str], ap: argparse.ArgumentParser) -> Targets:
        by_name = {t.name: t for t in targets}
        for item in overrides:
            name, sep, value = item.partition("=")
            if not sep or name not in by_name:
                ap.error(f"--target {item!r}: expected NAME=LIMIT with NAME one of {', '.join(by_name)}")
            try:
                by_name[name].limit = float(value)
            except ValueError:
                ap.error(f"--target {item!r}: {value!r} is not a number")
        return cls(by_name)

    def check(self, name: str, value: float) -> str:
        """``target OP LIMIT: met`` or ``... MISSED``, recorded for the summary."""
        t = self.targets[name]
        ok = OPS[t.op](value, t.limit)
        self.results.append((name, value, ok))
        return f"target {t.op} {t.limit:g}{t.unit}: {'met' if ok else 'MISSED'}"

    def summary(self) -> str:
        missed = sorted({name for name, _, ok in self.results if not ok})
        met = sum(ok for _, _, ok in self.results)
        tail = f": {', '.join(missed)}" if missed else ""
        return f"# targets: {met} checks met, {len(self.results) - met} MISSED{tail}"

    @property
    def missed(self) -> bool:
        return any(not ok for _, _, ok in self.results)


def add_target_argument(ap: argparse.ArgumentParser, targets: list[Target]) -> None:
    listing = "; ".join(f"{t.name} ({t.what}: {t.op} {t.limit:g}{t.unit})" for t in targets).replace("%", "%%")
    ap.add_argument("--target", action="append", default=[], metavar="NAME=LIMIT",
                    help=f"override a target's limit (repeatable; an impossible one shows a MISSED line). "
                         f"Targets: {listing}")


def parse_with_targets(ap: argparse.ArgumentParser, wanted: list[Target],
                       argv: list[str] | None = None) -> tuple[argparse.Namespace, Targets]:
    """A script's arguments with ``--target`` added, its targets with the overrides applied, and
    the header printed: the three steps every benchmark takes before it measures."""
    add_target_argument(ap, wanted)
    args = ap.parse_args(argv)
    targets = Targets.from_args(wanted, args.target, ap)
    print_header(argv)
    return args, targets


def preset_for(script: str, candidate: str | None = None, version: int | None = None):
    """The preset a script runs: the default (None), the default with a candidate mechanism
    (``--with``), or an earlier version of it (``--version``). Resolved before any model loads, so a
    bad name is one line naming the script, not a traceback."""
    from miita_edge.errors import InputError
    if candidate and version is not None:
        raise SystemExit(f"{script}: --with and --version are one or the other")
    try:
        if candidate:
            from miita_edge.evaluation.ablation import with_candidate
            return with_candidate(candidate)
        if version is not None:
            from miita_edge.method.presets import preset_version
            return preset_version("default", version)
    except (InputError, KeyError, ValueError) as e:
        raise SystemExit(f"{script}: {e}") from None
    return None
