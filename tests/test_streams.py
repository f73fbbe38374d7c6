"""Tests of streams.py: valid files parse, every bad input is one clear line."""
from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from miita_edge.errors import InputError
from miita_edge.streams import Example, read_examples, stream_bytes


def write(tmp_path: Path, content: str | bytes, name: str = "data.jsonl") -> Path:
    p = tmp_path / name
    p.write_bytes(content.encode("utf-8") if isinstance(content, str) else content)
    return p


def err(path: Path) -> str:
    with pytest.raises(InputError) as ei:
        read_examples(path)
    msg = str(ei.value)
    assert "\n" not in msg and msg.startswith(str(path))
    return msg


def test_reads_rows_with_extra_fields_blank_lines_and_crlf(tmp_path):
    p = write(tmp_path,
              '{"task": "t1", "input": "a", "output": "b", "label": 3}\r\n'
              "\n   \n"
              '{"input": "über \\u2028 x", "output": "ç", "extra": [1, 2]}\n')
    ex = read_examples(p)
    assert ex == [Example("a", "b", "t1", 1), Example("über \u2028 x", "ç", None, 4)]
    assert stream_bytes(ex) == 1 + 1 + len("über \u2028 x".encode()) + 2


def test_bom_and_missing_final_newline_and_pathlike(tmp_path):
    p = write(tmp_path, b'\xef\xbb\xbf{"input": "x", "output": "y"}')
    assert read_examples(p) == [Example("x", "y", None, 1)]
    assert read_examples(str(p)) == read_examples(p)


@pytest.mark.parametrize("content,expected", [
    ('{"input": "a", "output": "b"}\n{"input": "a"}\n', ':2: field "output" is missing'),
    ('{"output": "b"}\n', ':1: field "input" is missing'),
    ('{"input": 5, "output": "b"}\n', ':1: field "input" must be a string, got int'),
    ('{"input": "a", "output": null}\n', ':1: field "output" must be a string, got null'),
    ('{"input": "a", "output": ["b"]}\n', ':1: field "output" must be a string, got array'),
    ('{"input": "a", "output": true}\n', ':1: field "output" must be a string, got bool'),
    ('{"input": "a", "output": "  "}\n', ':1: field "output" is empty'),
    ('{"input": "a", "output": "b", "task": 7}\n', ':1: field "task" must be a string or null, got int'),
    ('["a", "b"]\n', ':1: expected a JSON object, got array'),
    ('"text"\n', ':1: expected a JSON object, got string'),
    ('\n\n{"input": "a" "output": "b"}\n', ":3: not valid JSON (Expecting ',' delimiter at column 15)"),
    ('{"input": "a", "output": "b"}\n{"input": "a", "output": "b"\n', ":2: not valid JSON ("),
    ('{"input": "a\\ud800", "output": "b"}\n', ':1: field "input" contains an unpaired surrogate escape (\\ud800)'),
    ('{"input": "a", "output": "b", "n": ' + "1" * 5000 + "}\n", ":1: not valid JSON (Exceeds the limit"),
])
def test_bad_rows_name_file_line_and_field(tmp_path, content, expected):
    p = write(tmp_path, content)
    assert err(p).startswith(f"{p}{expected}")


def test_invalid_utf8_reports_line_and_byte(tmp_path):
    p = write(tmp_path, b'{"input": "a", "output": "b"}\n{"in\xffput": "a", "output": "b"}\n')
    assert err(p) == f"{p}:2: invalid UTF-8 at byte 5"


def test_empty_and_blank_only_files(tmp_path):
    for content in ("", "\n \n\t\n"):
        p = write(tmp_path, content)
        assert err(p) == f"{p}: file is empty (no examples)"


def test_missing_file_and_directory(tmp_path):
    assert err(tmp_path / "nope.jsonl") == f"{tmp_path / 'nope.jsonl'}: no such file"
    d = tmp_path / "dir.jsonl"
    d.mkdir()
    assert err(d) == f"{d}: is a directory, expected a JSONL file"


@pytest.mark.skipif(sys.platform == "win32" or os.geteuid() == 0, reason="root can read anything")
def test_unreadable_file(tmp_path):
    p = write(tmp_path, '{"input": "a", "output": "b"}\n')
    p.chmod(0)
    assert err(p).startswith(f"{p}: cannot read (")


def test_all_or_nothing_error_after_many_good_rows(tmp_path):
    good = "".join(json.dumps({"input": f"q{i}", "output": "a"}) + "\n" for i in range(1000))
    p = write(tmp_path, good + '{"input": "q"}\n')
    assert err(p) == f'{p}:1001: field "output" is missing'


@settings(max_examples=100, deadline=None)
@given(st.lists(st.tuples(st.text(), st.text().filter(lambda s: s.strip()),
                          st.one_of(st.none(), st.text()), st.integers(0, 2)), min_size=1, max_size=20))
def test_round_trip_arbitrary_text(tmp_path_factory, rows):
    rows = [r for r in rows if all(_encodable(x) for x in r[:3] if x is not None)]
    if not rows:
        return
    lines, expected, n = [], [], 0
    for inp, out, task, blanks in rows:
        lines += [""] * blanks
        n += blanks
        obj = {"input": inp, "output": out} if task is None else {"task": task, "input": inp, "output": out}
        lines.append(json.dumps(obj, ensure_ascii=bool(blanks % 2)))
        n += 1
        expected.append(Example(inp, out, task, n))
    p = write(tmp_path_factory.mktemp("s"), "\n".join(lines) + "\n")
    got = read_examples(p)
    assert got == expected
    assert stream_bytes(got) == sum(len(e.input.encode()) + len(e.output.encode()) for e in expected)


def _encodable(s: str) -> bool:
    try:
        s.encode("utf-8")
        return True
    except UnicodeEncodeError:
        return False


def test_real_streams_if_present():
    root = Path("/work/shared/data")
    files = sorted(root.glob("*/train.jsonl")) if root.is_dir() else []
    if not files:
        pytest.skip("shared data not present")
    for f in files:
        ex = read_examples(f)
        n = sum(1 for line in f.read_bytes().split(b"\n") if line.strip())
        assert len(ex) == n and all(e.task for e in ex)
        assert stream_bytes(ex) > 0
