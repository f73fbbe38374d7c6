"""``miita-edge serve`` runs with OMP_WAIT_POLICY=PASSIVE unless the user set a libgomp wait
setting: the re-run's arguments and environment, and no re-run when either variable is set."""
from __future__ import annotations

import os
import sys

import pytest

from miita_edge.serve import openmp


@pytest.fixture
def execs(monkeypatch):
    calls = []
    monkeypatch.setattr(openmp.os, "execv", lambda exe, argv: calls.append((exe, argv, dict(os.environ))))
    for v in openmp.VARS:
        monkeypatch.delenv(v, raising=False)
    return calls


def test_reexec_sets_passive_once(execs, monkeypatch):
    openmp.reexec_passive(["-m", "miita_edge.cli", "serve", "--port", "9"])
    assert len(execs) == 1
    exe, argv, env = execs[0]
    assert exe == sys.executable and argv == [sys.executable, "-m", "miita_edge.cli", "serve", "--port", "9"]
    assert env["OMP_WAIT_POLICY"] == "PASSIVE"
    openmp.reexec_passive(["x"])  # the re-run sees the variable: no second exec
    assert len(execs) == 1


@pytest.mark.parametrize("var,value", [("OMP_WAIT_POLICY", "ACTIVE"), ("GOMP_SPINCOUNT", "1000")])
def test_users_choice_is_kept(execs, monkeypatch, var, value):
    monkeypatch.setenv(var, value)
    openmp.reexec_passive(["x"])
    assert execs == [] and os.environ[var] == value


def test_cli_passes_in_process_argv(execs, monkeypatch):
    """main(argv) called in process re-runs with that argv, not the host program's sys.argv."""
    from miita_edge import cli

    monkeypatch.setattr(sys, "argv", ["pytest", "-q"])

    class Stop(Exception):
        pass

    def stop(exe, argv):
        execs.append((exe, argv, dict(os.environ)))
        raise Stop

    monkeypatch.setattr(openmp.os, "execv", stop)
    with pytest.raises(Stop):
        cli.main(["serve", "--port", "9", "--threads", "1"])
    assert execs[-1][1] == [sys.executable, "-m", "miita_edge.cli", "serve", "--port", "9", "--threads", "1"]


def test_bad_arguments_fail_before_any_rerun(execs, capsys):
    from miita_edge import cli

    assert cli.main(["serve", "--port", "0"]) == 2
    assert cli.main(["serve", "--allow-origin", "evil.example/*"]) == 2
    assert execs == []
    err = capsys.readouterr().err
    assert "--port in 1..65535" in err and "--allow-origin" in err
