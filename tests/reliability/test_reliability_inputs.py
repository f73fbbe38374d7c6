"""Short version of the inputs reliability campaign, plus its regressions.

tests/reliability/reliability_inputs.py fuzzes 10,000 JSONL files through the real ``ingest``; here a few
hundred of its rejections run without the model (a file is refused before the model loads), a
few accepted files run through the real model, and the checker is shown to catch planted
failures. The regression tests pin what the full campaign found (see docs/reliability.md).
"""
from __future__ import annotations

import json
import random
import sys
from pathlib import Path

import numpy as np
import pytest

import reliability_inputs as campaign  # tests/reliability/reliability_inputs.py


def _fake_memory(mem: Path) -> None:
    """A committed store with the manifest fields the checker reads; no model needed, because
    every rejection here happens before ``ingest`` opens the model or the memory."""
    from miita_edge.memory.store import Store

    with Store(mem).writer() as w:
        w.commit({"counts": np.arange(3, dtype=np.int32)}, {"examples": 3, "skipped": 0})


def _reject_cases(tmp_path, count, seed=11):
    files = tmp_path / "files"
    files.mkdir()
    cases = campaign.generate(count, seed, files, long_lines=0)
    return [c for c in cases if c.expect == "reject"]


def test_fuzzed_rejections_are_one_line_and_leave_the_memory_unchanged(tmp_path):
    cases = _reject_cases(tmp_path, 340)
    assert len(cases) >= 280
    mem = tmp_path / "mem"
    _fake_memory(mem)
    table = campaign.campaign(cases, mem, campaign.run_inprocess)
    failures = {k: t.examples for k, t in table.items() if t.failures}
    assert not failures, failures
    assert sum(t.rejected for t in table.values()) == len(cases)
    assert len(table) >= 20  # many mutation kinds, not one


def test_a_subprocess_sample_exits_2_with_one_line(tmp_path):
    cases = _reject_cases(tmp_path, 200, seed=12)
    sample = campaign.stratified_sample(cases, 12, seed=0)
    mem = tmp_path / "mem"
    _fake_memory(mem)
    table = campaign.campaign(sample, mem, campaign.run_subprocess, lock_content=False)
    assert not {k: t.examples for k, t in table.items() if t.failures}
    assert sum(t.rejected for t in table.values()) == len(sample)


# --------------------------------------------------------------------------- the checker can fail

def _one_case(tmp_path, kind="missing_field"):
    files = tmp_path / "files"
    files.mkdir(exist_ok=True)
    rng = random.Random(3)
    gen = {"missing_field": campaign.g_missing_field, "valid": campaign.g_valid}[kind]
    return gen(rng, files, 0)


@pytest.mark.parametrize("planted", ["traceback", "changes_memory", "two_lines", "no_line", "exit_1", "accepts"])
def test_the_checker_flags_a_planted_failure(tmp_path, planted):
    case = _one_case(tmp_path)
    mem = tmp_path / "mem"
    _fake_memory(mem)

    def fake_main(argv):
        path = argv[1]
        if planted == "traceback":
            raise KeyError("boom")
        if planted == "changes_memory":
            (mem / "CURRENT.tmp").write_text("v00000009\n")
        if planted == "accepts":
            print(json.dumps({"examples": 1, "skipped": 0, "version": 1}))
            return 0
        msg = {"two_lines": f"{path}:{case.line}: bad\nmore", "no_line": f"{path}: bad"}.get(planted,
                                                                                           f"{path}:{case.line}: bad")
        print(f"miita-edge: error: {msg}", file=sys.stderr)
        return 1 if planted == "exit_1" else 2

    table = campaign.campaign([case], mem, lambda p, m: campaign.run_inprocess(p, m, main=fake_main))
    assert sum(t.failures for t in table.values()) == 1, planted


def test_the_checker_flags_an_accept_that_does_not_advance_the_memory(tmp_path):
    case = _one_case(tmp_path, "valid")
    mem = tmp_path / "mem"
    _fake_memory(mem)

    def fake_main(argv):  # claims success but commits nothing
        print(json.dumps({"examples": case.rows, "skipped": 0, "version": 2}))
        return 0

    table = campaign.campaign([case], mem, lambda p, m: campaign.run_inprocess(p, m, main=fake_main))
    assert sum(t.failures for t in table.values()) == 1


# --------------------------------------------------------------------------- regressions (findings)

def test_regression_duplicate_keys_are_refused_with_the_line(tmp_path):
    """Finding 1: {"input": "a", "input": "b", ...} was accepted, the last value silently winning."""
    from miita_edge.errors import InputError
    from miita_edge.streams import read_examples

    p = tmp_path / "d.jsonl"
    p.write_text('{"input": "a", "output": "b"}\n{"input": "a", "output": "b", "input": "c"}\n')
    with pytest.raises(InputError, match=r'd\.jsonl:2: duplicate key "input"'):
        read_examples(p)
    # duplicates inside an ignored nested field are not the row's business
    p.write_text('{"input": "a", "output": "b", "meta": {"k": 1, "k": 2}}\n')
    assert [e.input for e in read_examples(p)] == ["a"]


def test_regression_a_file_name_with_a_newline_gives_one_line(tmp_path, capsys):
    """Finding 2: the error quoted the file name raw, so a name with a newline (or an escape
    sequence) broke the one-line error."""
    from miita_edge.cli import main

    p = tmp_path / "bad\nname\x1b[31m.jsonl"
    p.write_text('{"input": "a"}\n')
    assert main(["ingest", str(p), "--memory", str(tmp_path / "mem")]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "\x1b" not in err
    assert "bad\\nname\\x1b[31m.jsonl:1: field \"output\" is missing" in err


def test_regression_lone_cr_and_huge_int_messages(tmp_path):
    """Finding 3 (messages): a lone CR between rows now says why; the huge-integer message no
    longer tells the user to call sys.set_int_max_str_digits."""
    from miita_edge.errors import InputError
    from miita_edge.streams import read_examples

    p = tmp_path / "cr.jsonl"
    p.write_bytes(b'{"input": "a", "output": "b"}\r{"input": "c", "output": "d"}\n')
    with pytest.raises(InputError, match=r"cr\.jsonl:1: .*a lone CR is not a line break"):
        read_examples(p)
    p.write_text('{"input": "a", "output": "b", "n": ' + "9" * 5000 + "}\n")
    with pytest.raises(InputError) as ei:
        read_examples(p)
    assert "sys." not in str(ei.value) and "cr.jsonl:1: not valid JSON" in str(ei.value)


@pytest.mark.model
def test_accepted_files_through_the_real_model(tmp_path, engine, monkeypatch):
    """A few accepted files (CRLF, BOM, blank lines, escaped NUL...) through the real ingest, and
    finding 4: a row longer than the model's context is refused naming the file and its line
    (it used to say only "sequence of N tokens exceeds the context of 4096")."""
    import miita_edge.miita as miita_mod

    original = miita_mod.Miita.__init__
    shared = engine

    def init(self, model=None, memory=None, preset=None, template=None, engine=None, engine_config=None, **kw):
        original(self, model, memory, preset, template, engine=shared, engine_config=engine_config, **kw)

    monkeypatch.setattr(miita_mod.Miita, "__init__", init)
    files = tmp_path / "files"
    files.mkdir()
    rng = random.Random(5)
    gens = [campaign.g_crlf, campaign.g_bom_start, campaign.g_combo_accept, campaign.g_escaped_nul, campaign.g_unicode]
    cases = [g(random.Random(rng.getrandbits(32)), files, i) for i, g in enumerate(gens)]
    for c in cases:  # keep it fast: one row each
        lines = [ln for ln in Path(c.path).read_bytes().splitlines(keepends=True) if b'"output"' in ln][:1]
        Path(c.path).write_bytes(b"".join(lines))
        c.rows = 1
    long_row = {"input": "word " * (engine.config.n_ctx + 50), "output": "x"}
    too_long = files / "long.jsonl"
    too_long.write_text('{"input": "short", "output": "fine"}\n' + json.dumps(long_row) + "\n")
    cases.append(campaign.Case("context_overflow", str(too_long), "reject", line=2))
    mem = tmp_path / "mem"
    campaign.seed_memory(mem, campaign.run_inprocess)
    table = campaign.campaign(cases, mem, campaign.run_inprocess)
    assert not {k: t.examples for k, t in table.items() if t.failures}
    assert sum(t.accepted for t in table.values()) == len(gens)
    assert table["context_overflow"].rejected == 1
