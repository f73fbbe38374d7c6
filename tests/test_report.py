"""Tests for miita_edge.evaluation.report: JSON (atomic), Markdown and PNG heatmap writers."""

from __future__ import annotations

import json
import struct
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from miita_edge.evaluation.cl_matrix import CLMatrix
from miita_edge.evaluation.report import cell_labels, write_heatmap, write_json, write_markdown

PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"
STAGES = ["banking77_task1", "banking77_task2", "banking77_task3"]
A3 = [
    [80.0, 10.0, 5.0],
    [60.0, 70.0, 20.0],
    [50.0, 65.0, 90.0],
]


def _result(matrix: Any = None, **extra: Any) -> dict[str, Any]:
    r: dict[str, Any] = {
        "benchmark": "banking77",
        "method": "miita",
        "model": "gemma-3-270m-q4_k_m",
        "metric": "accuracy",
        "stage_names": STAGES,
        "matrix": CLMatrix(np.array(A3)) if matrix is None else matrix,
        "baseline": [30.0, 8.0, 15.0],
        "wall_time_s": 1234.56,
        "memory_bytes": 30750,
        "budget_bytes": 30800,
        "budget_spec": "1%",
    }
    r.update(extra)
    return r


def _png_size(data: bytes) -> tuple[int, int]:
    """Width and height from the IHDR chunk, which must directly follow the signature."""
    assert data[:8] == PNG_SIGNATURE
    length, ctype = struct.unpack(">I4s", data[8:16])
    assert ctype == b"IHDR" and length == 13
    return struct.unpack(">II", data[16:24])


# ---- JSON -----------------------------------------------------------------------------------


def test_write_json_round_trip_and_no_temp_left(tmp_path: Path) -> None:
    m = CLMatrix(np.array(A3))
    m.A[0, 2] = np.nan
    out = tmp_path / "sub" / "result.json"  # parent created on demand
    write_json(_result(m, op=np.float64(68.5), n_examples=np.int64(660)), out)
    back = json.loads(out.read_text(encoding="utf-8"))
    assert back["matrix"]["A"][0][2] is None
    assert CLMatrix.from_dict(back["matrix"]) == m
    assert back["op"] == 68.5 and back["n_examples"] == 660
    assert back["stage_names"] == STAGES
    assert [p.name for p in out.parent.iterdir()] == ["result.json"]


def test_write_json_failure_keeps_previous_file(tmp_path: Path) -> None:
    out = tmp_path / "result.json"
    write_json({"version": 1}, out)
    with pytest.raises(TypeError):
        write_json({"version": 2, "bad": object()}, out)
    with pytest.raises(ValueError):
        write_json({"version": 3, "op": float("nan")}, out)  # strict JSON has no NaN
    assert json.loads(out.read_text()) == {"version": 1}
    assert [p.name for p in tmp_path.iterdir()] == ["result.json"]


def test_write_json_overwrites(tmp_path: Path) -> None:
    out = tmp_path / "r.json"
    write_json({"v": 1}, out)
    write_json({"v": 2, "stage": "北京"}, out)
    assert json.loads(out.read_text(encoding="utf-8")) == {"v": 2, "stage": "北京"}


# ---- Markdown -------------------------------------------------------------------------------


def test_markdown_contains_matrix_metrics_and_resources(tmp_path: Path) -> None:
    out = tmp_path / "report.md"
    write_markdown(_result(), out)
    md = out.read_text(encoding="utf-8")
    for name in STAGES:
        assert name in md
    # matrix rows, in order
    assert "| 0: banking77_task1 | 80.00 | 10.00 | 5.00 |" in md
    assert "| 2: banking77_task3 | 50.00 | 65.00 | 90.00 |" in md
    assert "| untrained (baseline) | 30.00 | 8.00 | 15.00 |" in md
    # OP = 205/3 = 68.33; BWT = -17.5; FWT = 3.5 (see test_cl_matrix)
    assert "| OP | 68.33 |" in md
    assert "| BWT | -17.50 |" in md
    assert "| FWT | 3.50 |" in md
    assert "1234.6 s" in md
    assert "30750 B" in md and "30800 B" in md and "`1%`" in md
    assert "99.8%" in md  # 30750 / 30800 = 0.99838


def test_markdown_partial_run_and_missing_optional_fields(tmp_path: Path) -> None:
    m = CLMatrix.empty(3)
    m.set(0, 0, 77.25)
    result = {"stage_names": STAGES, "matrix": m.to_dict()}  # dict form, no extras
    out = tmp_path / "partial.md"
    write_markdown(result, out)
    md = out.read_text(encoding="utf-8")
    assert "| 0: banking77_task1 | 77.25 |  |  |" in md  # unknown cells are blank
    assert "nan" not in md.lower()
    assert "| OP | n/a (cells not computed) |" in md
    assert "| FWT | n/a (no baseline) |" in md


def test_markdown_escapes_pipes_and_checks_names(tmp_path: Path) -> None:
    m = CLMatrix(np.array([[1.0, 2.0], [3.0, 4.0]]))
    out = tmp_path / "r.md"
    write_markdown({"stage_names": ["a|b", "c"], "matrix": m}, out)
    assert "a\\|b" in out.read_text(encoding="utf-8")
    with pytest.raises(ValueError):
        write_markdown({"stage_names": ["only one"], "matrix": m}, out)


# ---- heatmap --------------------------------------------------------------------------------


def test_cell_labels_blank_for_nan() -> None:
    a = np.array([[83.333, np.nan], [0.0, 100.0]])
    assert cell_labels(a) == [["83.3", ""], ["0.0", "100.0"]]


@pytest.mark.parametrize("T", [1, 3, 15])
def test_heatmap_is_valid_png(tmp_path: Path, T: int) -> None:
    rng = np.random.default_rng(T)
    a = rng.uniform(0, 100, size=(T, T))
    a[np.triu_indices(T, k=1)] = np.nan  # a run that skipped future stages
    names = [f"task{i}_some_long_stage_name" for i in range(T)]
    out = tmp_path / f"heat{T}.png"
    write_heatmap(CLMatrix(a), names, out, title=f"T={T}")
    data = out.read_bytes()
    assert len(data) > 0
    assert data[:8] == PNG_SIGNATURE
    w, h = _png_size(data)
    assert w > 100 and h > 100
    assert [p.name for p in tmp_path.iterdir()] == [out.name]


def test_heatmap_rejects_wrong_number_of_names(tmp_path: Path) -> None:
    with pytest.raises(ValueError):
        write_heatmap(CLMatrix(np.array(A3)), STAGES[:2], tmp_path / "x.png", title="bad")
    assert not (tmp_path / "x.png").exists()


def test_heatmap_nan_cells_render_white(tmp_path: Path) -> None:
    """The NaN cell is white; the known cells (score 0 -> viridis(0), dark purple) are not."""
    from matplotlib import image

    a = np.array([[0.0, np.nan], [0.0, 0.0]])
    out = tmp_path / "h.png"
    write_heatmap(CLMatrix(a), ["s0", "s1"], out, title="")
    img = image.imread(out)[..., :3]
    purple = np.all(np.abs(img - np.array([0.267, 0.005, 0.329])) < 0.05, axis=-1)
    # The colour bar also contains viridis(0), but only in a short strip; keep the rows and
    # columns that are purple over a long run, i.e. those crossing the matrix image.
    col_counts, row_counts = purple.sum(axis=0), purple.sum(axis=1)
    cols = np.nonzero(col_counts > 0.25 * col_counts.max())[0]
    rows = np.nonzero(row_counts > 0.25 * row_counts.max())[0]
    top, bottom, left, right = rows.min(), rows.max(), cols.min(), cols.max()
    cell_h, cell_w = (bottom - top + 1) / 2, (right - left + 1) / 2
    assert cell_w > 50 and abs(cell_w - cell_h) < 0.1 * cell_w  # square cells were found

    def at(t: int, tau: int) -> np.ndarray:
        # sample near a cell's top-left corner, away from the centred annotation text
        return img[int(top + (t + 0.15) * cell_h), int(left + (tau + 0.15) * cell_w)]

    assert np.allclose(at(0, 1), 1.0, atol=0.02)  # NaN -> white
    for t, tau in [(0, 0), (1, 0), (1, 1)]:
        assert purple[int(top + (t + 0.15) * cell_h), int(left + (tau + 0.15) * cell_w)]
        assert not np.allclose(at(t, tau), 1.0, atol=0.02)
