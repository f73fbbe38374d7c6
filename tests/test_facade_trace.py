"""How often one ``ingest`` and one ``ask`` from the command line enter the facade (miita.py).

The facade ties the layers together and delegates; the work (extraction, writing and repair, the
manifest and its size, the lock and the commit, retrieval) happens below it. A call that comes back
into the facade from below (a size callback per repair step, a helper per example) would show here
as entries that grow with the stream. Counted with ``sys.setprofile``: every call of a function
whose code is in miita.py, made from code that is not (calls inside the facade do not count).
"""
from __future__ import annotations

import json
import sys
from collections import Counter
from pathlib import Path

import pytest

import miita_edge.miita as facade
from miita_edge.cli import main

FACADE = str(Path(facade.__file__).resolve())
ROWS = [("How long should I simmer tomato sauce?", "zebra code"), ("My car makes a grinding noise.", "lime code"),
        ("How far away is the Andromeda galaxy?", "ocean code"), ("How do I caramelise onions?", "zebra code"),
        ("The engine warning light came on.", "lime code"), ("Why does Mars look red?", "ocean code")]


def entries(fn) -> Counter:
    """Calls into miita.py from outside it while ``fn()`` runs, by function name."""
    seen: Counter = Counter()
    files: dict = {}

    def is_facade(code) -> bool:
        f = files.get(code.co_filename)
        if f is None:
            f = files[code.co_filename] = str(Path(code.co_filename).resolve()) == FACADE
        return f

    def prof(frame, event, arg):
        if event == "call" and is_facade(frame.f_code) and not (frame.f_back and is_facade(frame.f_back.f_code)):
            seen[frame.f_code.co_name] += 1

    sys.setprofile(prof)
    try:
        fn()
    finally:
        sys.setprofile(None)
    return seen


def test_the_tracer_sees_facade_entries_and_not_inner_calls():
    got = entries(lambda: facade.Miita.budget_spec.fget(type("M", (), {"budget": facade.parse_budget("1KiB")})()))
    assert got == Counter({"budget_spec": 1})
    got = entries(lambda: facade.memory_fields)  # reading a name is no call
    assert got == Counter()


@pytest.mark.model
def test_one_ingest_and_one_ask_from_the_cli_enter_the_facade_a_few_times(tmp_path, capsys):
    data = tmp_path / "train.jsonl"
    data.write_text("".join(json.dumps({"input": x, "output": y}) + "\n" for x, y in ROWS))
    mem = str(tmp_path / "mem")
    ingest = entries(lambda: main(["ingest", str(data), "--memory", mem, "--threads", "1", "--budget", "2KiB"]))
    ask = entries(lambda: main(["ask", "Why is the Moon grey?", "--memory", mem, "--threads", "1",
                                "--max-tokens", "2"]))
    assert capsys.readouterr().out.count("\n") == 2  # both ran: one line each
    assert ingest["ingest"] == 1 and ask["ask"] == 1
    # construction, entering and leaving the with block, and the one call: nothing per example
    assert sum(ingest.values()) <= 5, dict(ingest)
    assert sum(ask.values()) <= 5, dict(ask)
