"""Write the results of one continual-learning run: JSON (machine), Markdown (people), PNG heatmap.

A *result* is a plain dict, so a run can be written before it is complete and read back
without this package. Keys (only ``stage_names`` and ``matrix`` are required):

=================  ==========================================================================
``stage_names``    list of T stage names, in training order (e.g. ``meta.json`` ``stage_order``)
``matrix``         a :class:`~miita_edge.cl_matrix.CLMatrix` or its ``to_dict()``
``baseline``       per-stage scores of the untrained model (enables FWT and a baseline row)
``benchmark``      e.g. ``"banking77"``;  ``method``, ``model``: free text
``metric``         ``"accuracy"`` | ``"exact_match"`` | ``"rougeL"`` (scores are 0..100)
``wall_time_s``    wall-clock seconds for the whole run
``memory_bytes``   persisted bytes of the memory at the end of the run (DESIGN.md §5)
``budget_bytes``   the memory budget C_mem in bytes;  ``budget_spec``: as given, e.g. ``"1%"``
=================  ==========================================================================

The Markdown report recomputes OP/BWT/FWT from the matrix instead of reading them from the dict:
the matrix is the single source of truth, so the table and its summary cannot disagree.

Every writer publishes its file atomically (temporary file in the same directory, then
``os.replace``), so a crash or a concurrent reader never sees a half-written result, and
creates missing parent directories.
"""

from __future__ import annotations

import contextlib
import io
import json
import math
import os
import tempfile
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from .cl_matrix import CLMatrix

__all__ = ["cell_labels", "write_heatmap", "write_json", "write_markdown"]

PathLike = str | os.PathLike[str]


# --------------------------------------------------------------------------------------------
# Atomic file publication
# --------------------------------------------------------------------------------------------


def _atomic_write_bytes(path: PathLike, data: bytes) -> None:
    """Write ``data`` to ``path`` so that readers see either the file as it was or the whole new one.

    The temporary file lives in the destination directory because ``os.replace`` is only
    atomic within one file system.
    """
    dest = Path(path)
    dest.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=dest.parent, prefix=f".{dest.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        os.chmod(tmp, 0o644)  # mkstemp creates 0600; results are meant to be shared
        os.replace(tmp, dest)
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp)
        raise


# --------------------------------------------------------------------------------------------
# JSON
# --------------------------------------------------------------------------------------------


def _json_default(obj: Any) -> Any:
    """Serialise the non-JSON types a run naturally produces."""
    if isinstance(obj, CLMatrix):
        return obj.to_dict()
    if isinstance(obj, np.ndarray):
        return obj.tolist()
    if isinstance(obj, np.generic):
        return obj.item()
    if isinstance(obj, Path):
        return str(obj)
    raise TypeError(f"cannot serialise {type(obj).__name__} to JSON")


def write_json(result: Mapping[str, Any], path: PathLike) -> None:
    """Write ``result`` as strict JSON (UTF-8, indented), atomically.

    NaN is rejected (strict JSON has none) except inside a ``CLMatrix``, whose unknown cells are
    written as ``null``. Serialisation happens before the file is touched, so an unserialisable
    result leaves any file already there intact.
    """
    text = json.dumps(result, default=_json_default, allow_nan=False, indent=2, ensure_ascii=False)
    _atomic_write_bytes(path, (text + "\n").encode("utf-8"))


# --------------------------------------------------------------------------------------------
# Markdown
# --------------------------------------------------------------------------------------------


def _matrix_of(result: Mapping[str, Any]) -> CLMatrix:
    m = result["matrix"]
    return m if isinstance(m, CLMatrix) else CLMatrix.from_dict(m)


def _stage_names(result_or_names: Any, T: int) -> list[str]:
    names = [str(n) for n in result_or_names]
    if len(names) != T:
        raise ValueError(f"{len(names)} stage names for a {T}×{T} matrix")
    return names


def _md_escape(text: str) -> str:
    """Keep a cell from splitting the Markdown table."""
    return text.replace("|", "\\|").replace("\n", " ")


def _fmt_score(v: float | None) -> str:
    return "" if v is None or math.isnan(v) else f"{v:.2f}"


def _fmt_bytes(n: Any) -> str:
    if n is None:
        return "—"
    n = int(n)
    return f"{n} B ({n / 1024:.1f} KiB)"


def _metric_or_reason(fn: Any, *args: Any) -> str:
    """Format a summary metric, or say why it is missing (a partial run is reportable too)."""
    try:
        v = fn(*args)
    except ValueError:
        return "n/a (cells not computed)"
    return "n/a (T = 1)" if v is None else f"{v:.2f}"


def write_markdown(result: Mapping[str, Any], path: PathLike) -> None:
    """Write a Markdown report: the A matrix with stage names, then OP/BWT/FWT, time and memory.

    Rows are "after learning stage t", columns "test set of stage τ"; unknown cells are blank.
    Scores are printed with two decimals.
    """
    m = _matrix_of(result)
    names = _stage_names(result["stage_names"], m.T)
    cols = [_md_escape(n) for n in names]
    baseline = result.get("baseline")

    title = " — ".join(str(result[k]) for k in ("benchmark", "method") if result.get(k))
    lines = [f"# Continual-learning results{': ' + title if title else ''}", ""]
    facts = [
        f"{label}: `{result[key]}`"
        for key, label in (("model", "model"), ("metric", "metric"))
        if result.get(key)
    ]
    if facts:
        lines += [", ".join(facts) + " (scores 0..100)", ""]
    lines += [
        "A[t, τ] = score on the test set of stage τ (column) after learning stages 0..t (row).",
        "",
        "| after learning ↓ / test on → | " + " | ".join(cols) + " |",
        "|---|" + "---:|" * m.T,
    ]
    for t in range(m.T):
        cells = [_fmt_score(float(v)) for v in m.A[t]]
        lines.append(f"| {t}: {cols[t]} | " + " | ".join(cells) + " |")
    if baseline is not None:
        b = [float(x) for x in baseline]
        if len(b) != m.T:
            raise ValueError(f"baseline has {len(b)} entries for T={m.T}")
        lines.append("| untrained (baseline) | " + " | ".join(_fmt_score(x) for x in b) + " |")
    lines.append("")

    fwt = "n/a (no baseline)" if baseline is None else _metric_or_reason(m.fwt, baseline)
    wall = result.get("wall_time_s")
    mem, budget = result.get("memory_bytes"), result.get("budget_bytes")
    budget_txt = _fmt_bytes(budget)
    if budget is not None and result.get("budget_spec"):
        budget_txt += f", given as `{result['budget_spec']}`"
    rows = [
        ("OP", _metric_or_reason(m.op)),
        ("BWT", _metric_or_reason(m.bwt)),
        ("FWT", fwt),
        ("wall time", "—" if wall is None else f"{float(wall):.1f} s"),
        ("memory", _fmt_bytes(mem)),
        ("budget", budget_txt),
    ]
    if mem is not None and budget:
        rows.append(("memory / budget", f"{100.0 * int(mem) / int(budget):.1f}%"))
    lines += ["| summary | value |", "|---|---:|"]
    lines += [f"| {k} | {v} |" for k, v in rows]
    lines.append("")
    _atomic_write_bytes(path, "\n".join(lines).encode("utf-8"))


# --------------------------------------------------------------------------------------------
# Heatmap
# --------------------------------------------------------------------------------------------


def cell_labels(A: np.ndarray, fmt: str = "{:.1f}") -> list[list[str]]:
    """Text for each heatmap cell: the formatted score, or ``""`` for an unknown (NaN) cell."""
    return [["" if math.isnan(v) else fmt.format(v) for v in row] for row in np.asarray(A).tolist()]


def write_heatmap(
    matrix: CLMatrix,
    stage_names: Sequence[str],
    path: PathLike,
    title: str,
    *,
    vmin: float = 0.0,
    vmax: float = 100.0,
) -> None:
    """Write the A matrix as an annotated PNG heatmap; unknown cells are left blank (white).

    The colour scale is fixed (default 0..100) rather than fitted to the data so heatmaps of
    different methods on one benchmark can be compared by eye. Uses the Agg canvas directly
    (no pyplot): no global backend switch, no display needed, safe in worker threads.
    """
    from matplotlib import colormaps
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    names = _stage_names(stage_names, matrix.T)
    T = matrix.T
    A = matrix.A
    cmap = colormaps["viridis"].with_extremes(bad="white")

    fig = Figure(figsize=(max(4.5, 0.65 * T + 3.0), max(3.5, 0.55 * T + 2.5)), dpi=120)
    FigureCanvasAgg(fig)
    ax = fig.add_subplot()
    im = ax.imshow(np.ma.masked_invalid(A), cmap=cmap, vmin=vmin, vmax=vmax, aspect="equal")
    fig.colorbar(im, ax=ax, fraction=0.046, pad=0.04)

    fontsize = min(10.0, max(5.0, 110.0 / T))
    labels = cell_labels(A)
    for t in range(T):
        for tau in range(T):
            if not labels[t][tau]:
                continue
            shade = (A[t, tau] - vmin) / (vmax - vmin) if vmax > vmin else 0.0
            ax.text(
                tau, t, labels[t][tau], ha="center", va="center", fontsize=fontsize,
                color="black" if shade > 0.6 else "white",
            )

    ax.set_xticks(range(T), labels=names, rotation=60, ha="right", fontsize=fontsize)
    ax.set_yticks(range(T), labels=[f"{t}: {n}" for t, n in enumerate(names)], fontsize=fontsize)
    ax.set_xlabel("test set of stage τ")
    ax.set_ylabel("after learning stage t")
    ax.set_title(title)

    buf = io.BytesIO()
    fig.savefig(buf, format="png", bbox_inches="tight")
    _atomic_write_bytes(path, buf.getvalue())
