"""The ``miita-edge`` command line, run in-process through ``cli.main``.

Contract under test (cli.py docstring): every user error is ONE line on stderr
starting with "miita-edge: error:", exit code 2, and the memory on disk is
never touched by a failed command. Expectations are built independently of
the package: file bytes and sizes from the file system, budget arithmetic and
stream sizes from the rows written here, option lists by hand.
"""
from __future__ import annotations

import json
import math
import os
import shutil
import subprocess
import sys
from fractions import Fraction
from pathlib import Path

import numpy as np
import pytest

from miita_edge.cli import main

THREADS = ["--threads", "1"]  # robust on a busy 2-core box (spinning llama.cpp threads degrade badly)

# A small supervised stream: arbitrary labels for three clearly different topics.
BASE_ROWS = [
    {"input": "How long should I simmer tomato sauce for pasta?", "output": "zebra code", "task": "t"},
    {"input": "My car makes a grinding noise when I brake.", "output": "lime code"},
    {"input": "How far away is the Andromeda galaxy?", "output": "ocean code"},
    {"input": "What is the best way to caramelise onions?", "output": "zebra code"},
    {"input": "The engine warning light came on this morning.", "output": "lime code"},
    {"input": "Why does Mars look red through a telescope?", "output": "ocean code"},
    {"input": "Can I replace butter with olive oil in bread?", "output": "zebra code"},
    {"input": "The car battery keeps going flat overnight.", "output": "lime code"},
    {"input": "What causes a total eclipse of the Sun?", "output": "ocean code"},
    {"input": "How do I keep pancakes fluffy?", "output": "zebra code"},
    {"input": "Coolant is leaking under the front bumper.", "output": "lime code"},
    {"input": "How many moons does Jupiter have?", "output": "ocean code"},
]
MORE_ROWS = [
    {"input": "Should I salt the water before boiling potatoes?", "output": "zebra code"},
    {"input": "The gearbox crunches when I shift into second.", "output": "lime code"},
    {"input": "Why do comets grow a tail near the Sun?", "output": "ocean code"},
    {"input": "Which cheese melts best on a lasagne?", "output": "zebra code"},
    {"input": "Café crème brûlée: how long in the oven?", "output": "zebra code"},  # non-ASCII bytes
]
INFO_KEYS = {"memory", "examples", "skipped", "prototypes", "anchors", "bytes", "budget_bytes"}


# ----------------------------------------------------------------------------- helpers
def write_jsonl(path: Path, rows) -> Path:
    path.write_text("".join(json.dumps(r, ensure_ascii=False) + "\n" for r in rows), encoding="utf-8")
    return path


def utf8_bytes(rows) -> int:
    """Stream size computed here, independently of streams.stream_bytes."""
    return sum(len(r["input"].encode("utf-8")) + len(r["output"].encode("utf-8")) for r in rows)


def snapshot(root: Path) -> dict[str, bytes | None]:
    """Every file's bytes (and every directory, as None) under root, by relative path."""
    out: dict[str, bytes | None] = {}
    for dirpath, dirnames, filenames in os.walk(root):
        for d in dirnames:
            out[os.path.relpath(os.path.join(dirpath, d), root) + "/"] = None
        for f in filenames:
            p = os.path.join(dirpath, f)
            with open(p, "rb") as fh:
                out[os.path.relpath(p, root)] = fh.read()
    return out


def current_version_bytes(mem: Path) -> int:
    """Size of the version file that CURRENT names (store format 2: one file per version)."""
    name = (mem / "CURRENT").read_text("ascii").strip()
    vfile = mem / name
    assert vfile.is_file()
    return os.path.getsize(vfile)


def cli(capsys, *argv) -> tuple[int, str, str]:
    capsys.readouterr()  # drop anything printed before
    rc = main([str(a) for a in argv])
    out, err = capsys.readouterr()
    return rc, out, err


def cli_json(capsys, *argv) -> dict:
    rc, out, err = cli(capsys, *argv, "--json")
    assert rc == 0, err
    assert err == ""
    lines = out.splitlines()
    assert len(lines) == 1, out  # one JSON object
    return json.loads(lines[0])


def assert_one_error(rc: int, out: str, err: str, *needles: str) -> str:
    assert rc == 2
    assert out == ""
    lines = err.splitlines()
    assert len(lines) == 1, f"expected one stderr line, got:\n{err}"
    assert lines[0].startswith("miita-edge: error:"), lines[0]
    for n in needles:
        assert n in lines[0], (n, lines[0])
    return lines[0]


# ----------------------------------------------------------------------------- fixtures
@pytest.fixture(scope="module")
def base_memory(tmp_path_factory):
    """A valid memory built once by a good ingest; tests work on copies of it."""
    d = tmp_path_factory.mktemp("base")
    data = write_jsonl(d / "base.jsonl", BASE_ROWS)
    mem = d / "mem"
    rc = main(["ingest", str(data), "--memory", str(mem), *THREADS])
    assert rc == 0
    assert (mem / "CURRENT").is_file()
    return mem


@pytest.fixture
def memory(base_memory, tmp_path) -> Path:
    mem = tmp_path / "mem"
    shutil.copytree(base_memory, mem)
    return mem


# ----------------------------------------------------------------------------- --help
HELP_OPTIONS = {
    None: ["ingest", "ask", "info", "demo", "MIITA_EDGE_MODEL", "MIITA_EDGE_MEMORY"],
    "ingest": ["DATA.jsonl", "--budget", "--template", "--preset", "--progress", "--no-progress",
               "--ray", "--contexts", "--fast-keys", "--memory", "--model", "--threads", "--json", "--help"],
    "ask": ["text", "--no-adapt", "--trace", "--max-tokens", "--memory", "--model", "--threads", "--json", "--help"],
    "info": ["--memory", "--json", "--help"],
    "forget": ["--output", "--memory", "--model", "--threads", "--json", "--help"],
    "demo": ["--budget", "--memory", "--preset", "--model", "--threads", "--json", "--help"],
    "check-model": ["GGUF", "--quick", "--model", "--threads", "--json", "--help"],
    "serve": ["--model", "--memory", "--memory-root", "--host", "--port", "--api-key", "--threads", "--ctx",
              "--max-body", "--allow-origin", "--allow-host", "--max-memories", "--allow-unlimited-budget",
              "--max-teach-rows", "--help"],
}
#: Experiment knobs the user commands no longer offer (the benches set them through a preset), and
#: options merged into another: ``ingest --contexts N`` is the number of Ray workers with ``--ray``.
#: ``serve --teach-wait-rows`` is the constant TEACH_WAIT_ROWS; ``check-model --quick`` skips the
#: functional test (the self-test always runs: a few seconds).
NOT_OFFERED = {"ask": ["--eta", "--gate"], "check-model": ["--key-layer", "--no-self-test", "--no-functional"],
               "ingest": ["--ray-workers"], "serve": ["--teach-wait-rows"]}


@pytest.mark.parametrize("command", list(HELP_OPTIONS), ids=lambda c: c or "top")
def test_help_exits_0_and_mentions_every_option(command, capsys):
    argv = ([command] if command else []) + ["--help"]
    with pytest.raises(SystemExit) as ei:
        main(argv)
    assert ei.value.code == 0
    out, err = capsys.readouterr()
    assert err == ""
    missing = [o for o in HELP_OPTIONS[command] if o not in out]
    assert not missing, f"{command} --help does not mention {missing}:\n{out}"
    offered = [o for o in NOT_OFFERED.get(command, []) if o in out]
    assert not offered, f"{command} --help offers {offered}"


@pytest.mark.parametrize("argv", [["ask", "q", "--eta", "2"], ["ask", "q", "--gate", "gated"],
                                  ["check-model", "--key-layer", "3"], ["ingest", "x.jsonl", "--preset", "default@11"],
                                  ["demo", "--preset", "paper@1"]])
def test_experiment_options_are_not_user_options(argv, capsys):
    """Users pick the preset by name only (a memory keeps the version it was built with); eta, the
    gate and the key layer are the preset's."""
    with pytest.raises(SystemExit) as ei:
        main(argv)
    assert ei.value.code == 2
    err = capsys.readouterr().err
    assert "unrecognized arguments" in err or "invalid choice" in err, err


@pytest.mark.parametrize("argv, gone", [
    (["ingest", "x.jsonl", "--ray", "--ray-workers", "2"], "--ray-workers"),  # --contexts N with --ray
    (["serve", "--teach-wait-rows", "8"], "--teach-wait-rows"),                # the constant TEACH_WAIT_ROWS
    (["check-model", "--no-functional"], "--no-functional"),                   # --quick
    (["check-model", "--no-self-test"], "--no-self-test"),                     # the self-test always runs
])
def test_merged_options_are_refused_by_argparse(argv, gone, capsys):
    """An option merged into another (or made a constant) is gone, not an alias: argparse's own
    usage error, exit 2."""
    with pytest.raises(SystemExit) as ei:
        main(argv)
    assert ei.value.code == 2
    err = capsys.readouterr().err
    assert "unrecognized arguments: " + gone in err, err


def test_info_says_what_eta_multiplies_and_the_gate():
    """The ``info`` adaptation line is true for each preset: written from hand-made fields, and for
    today's presets the default's eta is in units of the model's logit push, ungated, relevance-gated."""
    from miita_edge.cli import adaptation_text
    from miita_edge.method.presets import default_preset, paper_preset

    push = {"aggregation": "prefix", "eta": 1.5, "eta_unit": "push", "gate": "ungated", "relevance_gate": True}
    assert adaptation_text(push) == ("prefix aggregation, eta=1.5 x the model's measured logit push, "
                                     "ungated (alpha = 1); steers only queries near what it was taught")
    hidden = {"aggregation": "paper", "eta": 0.2, "eta_unit": "hidden", "gate": "gated", "relevance_gate": False}
    assert adaptation_text(hidden) == "paper aggregation, eta=0.2 x ||h_q||, gated (alpha = max(0, cos(h_t, h_q)))"
    line = adaptation_text(default_preset().describe())
    assert "logit push" in line and "||h_q||" not in line and "ungated" in line and "steers only" in line, line
    line = adaptation_text(paper_preset().describe())
    assert "x ||h_q||" in line and "gated (alpha = max" in line and "steers only" not in line, line


# ----------------------------------------------------------------------------- bad input
BAD_FILES = {
    "malformed_json": (b'{"input": "a", "output": "b"}\n{"input": "c", "output": "d"}\n{"input": "e" "output": "f"}\n',
                       ":3:", "not valid JSON"),
    "missing_output": (b'{"input": "a", "output": "b"}\n\n{"input": "c"}\n', ":3:", 'field "output" is missing'),
    "invalid_utf8": (b'{"input": "a", "output": "b"}\n{"input": "caf\xe9", "output": "d"}\n', ":2:",
                     "invalid UTF-8"),
    "empty_file": (b"", None, "empty"),
}


@pytest.mark.model
@pytest.mark.parametrize("case", list(BAD_FILES))
def test_bad_data_file_is_one_line_and_leaves_memory_unchanged(case, memory, tmp_path, capsys):
    content, where, what = BAD_FILES[case]
    data = tmp_path / f"{case}.jsonl"
    data.write_bytes(content)
    before = snapshot(memory)
    rc, out, err = cli(capsys, "ingest", data, "--memory", memory, *THREADS)
    line = assert_one_error(rc, out, err, str(data), what)
    if where is not None:
        assert f"{data}{where}" in line
    assert snapshot(memory) == before


@pytest.mark.model
@pytest.mark.parametrize("flags,needles", [
    (["--template", "nope"], ["unknown template", "nope"]),
    (["--budget", "12 parsecs"], ['budget "12 parsecs"']),
    (["--budget", "0%"], ['budget "0%"']),
])
def test_bad_flag_is_one_line_and_leaves_memory_unchanged(flags, needles, memory, tmp_path, capsys):
    data = write_jsonl(tmp_path / "more.jsonl", MORE_ROWS)
    before = snapshot(memory)
    rc, out, err = cli(capsys, "ingest", data, "--memory", memory, *flags, *THREADS)
    assert_one_error(rc, out, err, *needles)
    assert snapshot(memory) == before


@pytest.mark.model
def test_budget_too_small_on_fresh_memory_commits_nothing_and_dir_stays_usable(tmp_path, capsys):
    data = write_jsonl(tmp_path / "base.jsonl", BASE_ROWS)
    mem = tmp_path / "fresh"
    # 100 bytes hold the file's framing in no store format, let alone a prototype
    rc, out, err = cli(capsys, "ingest", data, "--memory", mem, "--budget", "100", *THREADS)
    assert_one_error(rc, out, err, str(data), "line 1", "100 bytes")
    leftovers = sorted(p.name for p in mem.iterdir()) if mem.exists() else []
    assert "CURRENT" not in leftovers
    assert not [n for n in leftovers if n.startswith("v")], leftovers
    # The failed attempt must not poison the directory: a good ingest then works.
    rep = cli_json(capsys, "ingest", data, "--memory", mem, *THREADS)
    assert rep["examples"] == len(BASE_ROWS)
    assert (mem / "CURRENT").is_file()


@pytest.mark.model
def test_budget_too_small_on_existing_memory_leaves_it_unchanged(memory, tmp_path, capsys):
    data = write_jsonl(tmp_path / "more.jsonl", MORE_ROWS)
    before = snapshot(memory)
    rc, out, err = cli(capsys, "ingest", data, "--memory", memory, "--budget", "100", *THREADS)
    assert_one_error(rc, out, err, str(data), "line 1", "100 bytes")
    assert snapshot(memory) == before
    # and the memory still reports its own budget and content
    info = cli_json(capsys, "info", "--memory", memory)
    assert info["examples"] == len(BASE_ROWS) and info["budget"] == "64KiB"


@pytest.mark.model
def test_one_percent_budget_resolves_over_everything_ingested_including_this_file(memory, tmp_path, capsys):
    """1% of this tiny stream cannot hold a prototype; the error shows what 1% resolved to.

    A fraction resolves once per ingest call, against the stream as it will be after the call:
    every row of the first file plus every row of this one.
    """
    data = write_jsonl(tmp_path / "more.jsonl", MORE_ROWS)
    after_call = utf8_bytes(BASE_ROWS) + utf8_bytes(MORE_ROWS)
    expected = math.floor(Fraction(1, 100) * after_call)
    before = snapshot(memory)
    rc, out, err = cli(capsys, "ingest", data, "--memory", memory, "--budget", "1%", *THREADS)
    assert_one_error(rc, out, err, str(data), "line 1", f"budget 1% = {expected} bytes")
    assert snapshot(memory) == before

    fresh = tmp_path / "fresh"
    rc, out, err = cli(capsys, "ingest", data, "--memory", fresh, "--budget", "1%", *THREADS)
    expected = math.floor(Fraction(1, 100) * utf8_bytes(MORE_ROWS))
    assert_one_error(rc, out, err, str(data), "line 1", f"budget 1% = {expected} bytes")
    assert not (fresh / "CURRENT").exists()


@pytest.mark.model
def test_fractional_budget_on_a_fresh_memory_is_of_the_whole_file(tmp_path, capsys):
    """The README's use of a fractional budget on a new memory: it used to fail on the first line,
    because the fraction was taken of the stream so far (90% of row 1 alone is ~100 bytes, less
    than any one-prototype memory). Now it is of the whole file, and the memory fits it."""
    rows = [{"input": f"question {i}: " + "about the delivery of my parcel " * 3, "output": f"desk {i % 3}"}
            for i in range(16)]
    data = write_jsonl(tmp_path / "rows.jsonl", rows)
    pct = Fraction(90, 100)
    rep = cli_json(capsys, "ingest", data, "--memory", tmp_path / "new", "--budget", "90%", *THREADS)
    assert rep["budget_bytes"] == math.floor(pct * utf8_bytes(rows))
    assert rep["examples"] == len(rows) and rep["prototypes"] >= 1
    assert current_version_bytes(tmp_path / "new") == rep["bytes"] <= rep["budget_bytes"]
    # the old rule's first-line limit could not have held this memory's smallest state
    assert math.floor(pct * utf8_bytes(rows[:1])) < rep["bytes"] // 2


@pytest.mark.model
def test_percent_budget_that_fits_resolves_to_floor_of_stream_fraction(tmp_path, capsys):
    """A percentage large enough to hold a memory from the first row on (8000.5% of
    ~50-byte rows is ~4 KB per row; one prototype needs ~3 KB), checked across two files."""
    pct = Fraction("8000.5") / 100
    a = write_jsonl(tmp_path / "a.jsonl", BASE_ROWS)
    b = write_jsonl(tmp_path / "b.jsonl", MORE_ROWS)
    mem = tmp_path / "mem"
    rep = cli_json(capsys, "ingest", a, "--memory", mem, "--budget", "8000.5%", *THREADS)
    assert rep["budget_bytes"] == math.floor(pct * utf8_bytes(BASE_ROWS))
    assert rep["bytes"] <= rep["budget_bytes"]
    rep = cli_json(capsys, "ingest", b, "--memory", mem, *THREADS)  # keeps the memory's own budget
    total = utf8_bytes(BASE_ROWS) + utf8_bytes(MORE_ROWS)
    assert rep["budget_bytes"] == math.floor(pct * total)
    info = cli_json(capsys, "info", "--memory", mem)
    assert info["budget"] == "8000.5%"
    assert info["budget_bytes"] == math.floor(pct * total)
    assert info["stream_bytes"] == total
    assert current_version_bytes(mem) == info["bytes"] <= info["budget_bytes"]


@pytest.mark.model
def test_ask_without_memory_is_one_line_and_creates_nothing(tmp_path, capsys):
    mem = tmp_path / "nowhere"
    rc, out, err = cli(capsys, "ask", "How do I keep pancakes fluffy?", "--memory", mem, *THREADS)
    assert_one_error(rc, out, err, "no memory", str(mem))
    assert not mem.exists()


@pytest.mark.model
def test_ask_without_memory_as_a_process(tmp_path):
    """The real entry point: exit status 2, exactly one stderr line (no llama.cpp log noise)."""
    mem = tmp_path / "nowhere"
    r = subprocess.run([sys.executable, "-m", "miita_edge.cli", "ask", "--memory", str(mem), *THREADS],
                       input="How far away is the Andromeda galaxy?\n", capture_output=True, text=True,
                       timeout=300, env={**os.environ, "MIITA_EDGE_MEMORY": str(tmp_path / "unused")})
    assert_one_error(r.returncode, r.stdout, r.stderr, "no memory", str(mem))
    assert not mem.exists() and not (tmp_path / "unused").exists()


@pytest.mark.model
def test_memory_of_another_model_is_refused_and_left_unchanged(memory, tmp_path, capsys):
    from miita_edge.memory.meta import compact, expand
    from miita_edge.memory.store import Store

    st = Store(memory)
    with st.writer() as w:
        snap = st.read()
        arrays = {k: np.array(v) for k, v in snap.arrays.items()}
        fields = expand(snap.manifest, snap.arrays)  # the long form; the store keeps the compact one
        fields["fingerprint"] = {**fields["fingerprint"], "sha256": "0" * 64}
        w.commit(arrays, compact(fields))
    data = write_jsonl(tmp_path / "more.jsonl", MORE_ROWS)
    before = snapshot(memory)
    rc, out, err = cli(capsys, "ingest", data, "--memory", memory, *THREADS)
    assert_one_error(rc, out, err, str(memory), "another model", "000000000000")
    assert snapshot(memory) == before
    rc, out, err = cli(capsys, "ask", "How many moons does Jupiter have?", "--memory", memory, *THREADS)
    assert_one_error(rc, out, err, str(memory), "another model")
    assert snapshot(memory) == before


@pytest.mark.model
def test_a_format_3_memory_opens_by_its_96_bit_fingerprint_and_another_models_is_refused(memory, tmp_path, capsys,
                                                                                        monkeypatch):
    """Store format 3 keeps the sha256's first 96 bits: the model they begin is the memory's, any
    other is refused, by the same one-line error, and the memory is left as it was."""
    from miita_edge.memory import store_format
    from miita_edge.memory.meta import compact, expand
    from miita_edge.memory.store import Store

    monkeypatch.setattr(store_format, "FORMAT_VERSION", 3)
    st = Store(memory)
    snap = st.read()
    arrays = {k: np.array(v) for k, v in snap.arrays.items()}
    fields = expand(snap.manifest, snap.arrays)
    # a format-3 memory's fields hold 96 bits of the sha256; compact() takes 256 and keeps those 96
    fields["fingerprint"]["sha256"] = fields["fingerprint"]["sha256"].ljust(64, "0")
    with st.writer() as w:
        w.commit(arrays, compact(fields))
    assert Store(memory).read().format_version == 3 and len(Store(memory).read().manifest["f"][0]) == 16
    rc, out, err = cli(capsys, "ask", "How many moons does Jupiter have?", "--memory", memory, *THREADS)
    assert rc == 0, err
    sha = fields["fingerprint"]["sha256"]
    other = sha[:23] + ("0" if sha[23] != "0" else "1") + sha[24:]  # differs inside the 96 bits kept
    with st.writer() as w:
        w.commit(arrays, compact({**fields, "fingerprint": {**fields["fingerprint"], "sha256": other}}))
    before = snapshot(memory)
    rc, out, err = cli(capsys, "ask", "How many moons does Jupiter have?", "--memory", memory, *THREADS)
    assert_one_error(rc, out, err, str(memory), "another model", other[:12])
    assert snapshot(memory) == before


# ----------------------------------------------------------------------------- good paths
@pytest.mark.model
def test_info_json_keys_and_bytes_match_the_files(memory, capsys):
    info = cli_json(capsys, "info", "--memory", memory)
    assert INFO_KEYS <= set(info)
    assert info["memory"] == str(memory)
    assert info["examples"] == len(BASE_ROWS) and info["skipped"] == 0
    assert info["stream_bytes"] == utf8_bytes(BASE_ROWS)
    assert info["budget_bytes"] == 64 * 1024  # the default budget of a new memory
    assert info["bytes"] == current_version_bytes(memory)
    assert 1 <= info["prototypes"] <= len(BASE_ROWS) and info["anchors"] >= info["prototypes"]
    assert info["keys_whitened"] is False  # labels: a v10 memory keeps v9's keys


@pytest.mark.model
def test_ingest_json_and_a_second_file_continues_the_same_memory(tmp_path, capsys):
    a = write_jsonl(tmp_path / "a.jsonl", BASE_ROWS)
    b = write_jsonl(tmp_path / "b.jsonl", MORE_ROWS)
    mem = tmp_path / "mem"
    r1 = cli_json(capsys, "ingest", a, "--memory", mem, *THREADS)
    assert INFO_KEYS - {"memory"} <= set(r1)
    assert r1["examples"] == len(BASE_ROWS) and r1["skipped"] == 0
    assert r1["bytes"] == current_version_bytes(mem) <= r1["budget_bytes"] == 64 * 1024
    assert (mem / "CURRENT").read_text().strip() == "v00000001"

    r2 = cli_json(capsys, "ingest", b, "--memory", mem, *THREADS)
    assert r2["examples"] == len(MORE_ROWS)  # this call's rows
    assert r2["bytes"] == current_version_bytes(mem)
    assert (mem / "CURRENT").read_text().strip() == "v00000002"
    assert sorted(p.name for p in mem.iterdir() if p.name.startswith("v")) == ["v00000002"]
    info = cli_json(capsys, "info", "--memory", mem)
    assert info["examples"] == len(BASE_ROWS) + len(MORE_ROWS)
    assert info["stream_bytes"] == utf8_bytes(BASE_ROWS) + utf8_bytes(MORE_ROWS)
    assert info["anchors"] >= r1["anchors"]  # a continuation adds to the memory, it does not restart it
    assert (info["prototypes"], info["anchors"], info["bytes"]) == (r2["prototypes"], r2["anchors"], r2["bytes"])

    # text output names the same numbers
    rc, out, err = cli(capsys, "info", "--memory", mem)
    assert rc == 0 and f"{info['bytes']} of" in out and f"{info['examples']} examples" in out


@pytest.mark.model
def test_ask_json_fields_and_one_alpha_per_generated_token(memory, engine, capsys):
    row = BASE_ROWS[2]  # a training query: the memory should reproduce its label
    ans = cli_json(capsys, "ask", row["input"], "--memory", memory, *THREADS)
    assert {"text", "prototypes", "scores", "eta", "alphas"} <= set(ans)
    assert ans["adapted"] is True
    assert len(ans["prototypes"]) >= 1 and len(ans["scores"]) == len(ans["prototypes"])
    assert ans["eta"] > 0
    assert ans["text"].strip() == row["output"]
    assert ans["stop_reason"] == "stop"
    # The answer followed a stored prototype token by token, newline (the stop) included,
    # and every step was steered: one alpha per generated token.
    n_tokens = len(engine.tokenize(" " + row["output"] + "\n", add_bos=False))
    assert len(ans["alphas"]) == n_tokens
    assert all(a >= 0 for a in ans["alphas"])  # the default is ungated (alpha = 1); gated: max(0, cos)

    one = cli_json(capsys, "ask", row["input"], "--memory", memory, "--max-tokens", "1", *THREADS)
    assert one["stop_reason"] == "length" and len(one["alphas"]) == 1

    frozen = cli_json(capsys, "ask", row["input"], "--memory", memory, "--no-adapt", *THREADS)
    assert frozen["adapted"] is False
    assert (frozen["prototypes"], frozen["scores"], frozen["alphas"], frozen["eta"]) == ([], [], [], 0.0)

    rc, out, err = cli(capsys, "ask", row["input"], "--memory", memory, *THREADS)
    assert (rc, err) == (0, "") and out == ans["text"].strip() + "\n"


@pytest.mark.model
def test_ask_skips_the_blank_line_a_frozen_answer_opens_with(capsys, tmp_path):
    """The bundled Gemma opens its greedy reply to this query with a newline; a newline that ends
    the answer anywhere would print an empty line (measured: '' before, the sentence after)."""
    q = "My card was charged twice for one purchase."
    ans = cli_json(capsys, "ask", q, "--memory", str(tmp_path / "m"), "--no-adapt", "--max-tokens", "12", *THREADS)
    assert ans["text"].startswith("\n") and ans["text"].strip(), ans
    rc, out, err = cli(capsys, "ask", q, "--memory", str(tmp_path / "m"), "--no-adapt", "--max-tokens", "12", *THREADS)
    assert (rc, err) == (0, "") and out == ans["text"].strip() + "\n"
