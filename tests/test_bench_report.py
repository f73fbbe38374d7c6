"""bench/_report.py: the header every benchmark prints, and target lines that can say MISSED."""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "bench"))
import _report  # noqa: E402  (bench/_report.py, shared by the benchmark scripts)


def _targets():
    return [_report.Target("ratio", ">=", 0.98, "", "a ratio"), _report.Target("share", "<=", 3.0, "%", "a share")]


def test_a_target_says_met_or_missed_at_its_limit():
    goals = _report.Targets.from_args(_targets(), [], argparse.ArgumentParser())
    assert goals.check("ratio", 0.98).endswith(": met") and goals.check("ratio", 0.9799).endswith(": MISSED")
    assert goals.check("share", 3.0).endswith(": met") and goals.check("share", 3.01) == "target <= 3%: MISSED"
    assert goals.missed and goals.summary() == "# targets: 2 checks met, 2 MISSED: ratio, share"


def test_an_override_moves_the_limit_and_a_bad_one_is_refused(capsys):
    ap = argparse.ArgumentParser(prog="x")
    goals = _report.Targets.from_args(_targets(), ["share=0.5"], ap)
    assert goals.check("share", 1.0) == "target <= 0.5%: MISSED"
    for bad in ("nope=1", "share", "share=abc"):
        with pytest.raises(SystemExit) as exc:
            _report.Targets.from_args(_targets(), [bad], ap)
        assert exc.value.code == 2
        err = capsys.readouterr().err.strip().splitlines()
        assert err[-1].startswith("x: error: --target") and bad in err[-1]


def test_the_header_names_the_command_machine_and_versions(monkeypatch):
    monkeypatch.setattr(sys, "argv", [str(_report.ROOT / "bench" / "engine.py"), "--rounds", "1"])
    lines = _report.header_lines()
    text = "\n".join(lines)
    assert lines[0] == "# command: python bench/engine.py --rounds 1"
    assert "cores" in text and "llama-cpp-python" in text and "numpy" in text and "python " in text
    assert "commit" in lines[-1] or "not importable" in lines[-1]
