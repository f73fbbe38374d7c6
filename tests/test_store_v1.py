"""Format-1 memories (a version directory of .npy files, written before the compact format) still
open, are still checked, and the next commit turns them into the current format with nothing lost.

The fixtures in tests/data/store_v1 were written by the last format-1 miita-edge (their README
says how); every test works on a copy.
"""
from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

import numpy as np
import pytest

from miita_edge.errors import StoreError
from miita_edge.memory.store import FORMAT_VERSION, Store
from miita_edge.memory.store_format_v1 import encoded_size_v1

FIXTURES = Path(__file__).with_name("data") / "store_v1"


def copy_fixture(name: str, tmp_path: Path) -> Path:
    dst = tmp_path / name
    shutil.copytree(FIXTURES / name, dst)
    return dst


def expected_plain() -> tuple[dict, dict]:
    """The plain fixture's content, rebuilt the way its README made it."""
    rng = np.random.default_rng(14)
    arrays = {"keys": rng.standard_normal((5, 8)).astype(np.float32), "ids": np.arange(5, dtype=np.int32) * 7,
              "bits": rng.integers(0, 256, (3, 10), dtype=np.uint8), "empty": np.zeros((0, 4), np.float16),
              "scalar": np.array(2.5), "be": np.arange(4, dtype=">u2")}
    return arrays, {"n": 5, "nested": {"a": [1, 2, None]}, "text": "format 1 fixture"}


def same(a, b) -> bool:
    return a.dtype == b.dtype and a.shape == b.shape and np.ascontiguousarray(a).tobytes() == np.ascontiguousarray(b).tobytes()


def dir_bytes(d: Path) -> int:
    return sum(f.stat().st_size for f in d.iterdir())


def test_a_format_1_store_opens(tmp_path):
    root = copy_fixture("plain", tmp_path)
    snap = Store(root).read()
    arrays, manifest = expected_plain()
    assert snap.version == 2 and snap.format_version == 1
    assert snap.manifest == manifest
    assert set(snap.arrays) == set(arrays)
    for name, arr in arrays.items():
        assert same(snap.arrays[name], arr), name
        assert not snap.arrays[name].flags.writeable
    assert snap.bytes_on_disk == dir_bytes(root / "v00000002") == encoded_size_v1(arrays, manifest)


def test_the_next_commit_writes_the_current_format_with_nothing_lost(tmp_path):
    root = copy_fixture("plain", tmp_path)
    old = Store(root).read()
    with Store(root).writer() as w:
        snap = w.commit({k: np.array(v) for k, v in old.arrays.items()}, old.manifest)
    assert snap.version == 3 and snap.format_version == FORMAT_VERSION
    assert sorted(os.listdir(root)) == [".lock", "CURRENT", "v00000003"]  # the format-1 directory is gone
    assert (root / "v00000003").is_file()
    new = Store(root).read()
    arrays, manifest = expected_plain()
    assert new.manifest == manifest and set(new.arrays) == set(arrays)
    assert all(same(new.arrays[k], v) for k, v in arrays.items())
    assert new.bytes_on_disk < old.bytes_on_disk - 600  # six .npy headers and a JSON manifest less


def _npy(root: Path, name: str) -> Path:
    return root / "v00000002" / f"{name}.npy"


def _manifest(root: Path) -> Path:
    return root / "v00000002" / "manifest.json"


def _edit(root: Path, fn) -> None:
    doc = json.loads(_manifest(root).read_text())
    fn(doc)
    _manifest(root).write_text(json.dumps(doc))


def _flip_last_byte(p: Path) -> None:
    data = bytearray(p.read_bytes())
    data[-1] ^= 0x10
    p.write_bytes(bytes(data))


V1_DAMAGE = [
    ("truncated", lambda r: os.truncate(_npy(r, "keys"), 100), ["keys.npy", "truncated"]),
    ("flipped", lambda r: _flip_last_byte(_npy(r, "keys")), ["keys.npy", "CRC32"]),
    ("missing", lambda r: _npy(r, "ids").unlink(), ["ids.npy", "missing"]),
    ("garbage", lambda r: _manifest(r).write_bytes(b"\xff{"), ["manifest.json", "not valid JSON"]),
    ("newer", lambda r: _edit(r, lambda d: d.update(format_version=4)), ["format_version 4", "newer"]),
    ("shape", lambda r: _edit(r, lambda d: d["arrays"]["keys"].update(shape=[500, 8], bytes=128 + 500 * 32)),
     ["keys.npy", "truncated"]),
    ("dropped", lambda r: _edit(r, lambda d: d["arrays"].pop("ids")), ["does not list", "ids.npy"]),
    ("renamed", lambda r: _edit(r, lambda d: d.update(version="00000009")), ["does not match directory"]),
]


@pytest.mark.parametrize("damage,needles", [d[1:] for d in V1_DAMAGE], ids=[d[0] for d in V1_DAMAGE])
def test_a_damaged_format_1_store_is_a_one_line_error(tmp_path, damage, needles):
    root = copy_fixture("plain", tmp_path)
    damage(root)
    with pytest.raises(StoreError) as info:
        Store(root).read()
    msg = str(info.value)
    assert "\n" not in msg and str(root) in msg
    for needle in needles:
        assert needle in msg, msg


def test_a_newer_format_directory_is_never_overwritten(tmp_path):
    root = copy_fixture("plain", tmp_path)
    _edit(root, lambda d: d.update(format_version=4))
    before = {f.name: f.read_bytes() for f in (root / "v00000002").iterdir()}
    with pytest.raises(StoreError, match=f"format_version 4, this miita-edge writes {FORMAT_VERSION}; refusing to overwrite"):
        with Store(root).writer():
            pass
    assert {f.name: f.read_bytes() for f in (root / "v00000002").iterdir()} == before


def test_a_format_1_memory_is_read_by_info(tmp_path, capsys):
    from miita_edge.cli import main

    root = copy_fixture("memory", tmp_path)
    assert main(["info", "--memory", str(root), "--json"]) == 0
    info = json.loads(capsys.readouterr().out)
    assert info["store_format"] == 1 and info["examples"] == 6 and info["prototypes"] == 3 and info["anchors"] == 4
    assert info["fingerprint"]["sha256"].startswith("a5fd3b62") and info["budget"] == "64KiB"
    assert main(["info", "--memory", str(root)]) == 0
    assert f"rewrites it as format {FORMAT_VERSION}" in capsys.readouterr().out


@pytest.mark.model
def test_a_format_1_memory_opens_answers_and_becomes_the_current_format_on_ingest(tmp_path):
    from miita_edge import Example, Miita
    from miita_edge.runtime.engine import EngineConfig

    root = copy_fixture("memory", tmp_path)
    old = Store(root).read()
    old_anchors = {bytes(r) for r in np.asarray(old.arrays["anchors"])}
    old_tokens = np.asarray(old.arrays["tokens"]).tolist()
    with Miita(memory=root, engine_config=EngineConfig(n_threads=1)) as m:
        assert (m.examples, m.bank.n_prototypes, m.bank.n_anchors, m.budget_spec) == (6, 3, 4, "64KiB")
        assert m.ask("question 9 about billing", max_tokens=4).adapted
        rows = [Example("question 7 about billing", "billing", line=1), Example("where is my parcel", "shipping", line=2)]
        report = m.ingest(rows, progress=False)
    new = Store(root).read()
    assert new.version == 2 and new.format_version == FORMAT_VERSION and (root / "v00000002").is_file()
    assert not (root / "v00000001").exists()
    assert "m" in new.manifest and report.bytes == new.bytes_on_disk < old.bytes_on_disk
    with Miita(memory=root, engine_config=EngineConfig(n_threads=1)) as m:
        assert m.examples == 8 and m.stream_bytes == 190 + sum(len(r.input) + len(r.output) for r in rows)
        assert m.template.name == "plain" and m.preset.name == "default" and m.budget_spec == "64KiB"
    # nothing of the old memory is lost: every old anchor and every old answer is still stored
    assert old_anchors <= {bytes(r) for r in np.asarray(new.arrays["anchors"])}
    from miita_edge.memory.bank_arrays import decode_token_dict, unpack_tokens
    ids = decode_token_dict(new.arrays)  # the compact layout: a token dictionary, indices, lengths
    if "tok_bits" in new.arrays:  # the indices and lengths as one bit stream
        idx, lens = unpack_tokens(new.arrays["tok_bits"], len(new.arrays["counts"]), len(ids))
    else:
        idx, lens = np.asarray(new.arrays["tok_idx"], np.int64), np.asarray(new.arrays["tok_len"], np.int64)
    flat = ids[idx].tolist()
    ends = np.cumsum(lens).tolist()
    new_tokens = [t for s, e in zip([0] + ends[:-1], ends) for t in flat[s:e] + [-1]]  # format 1's separators
    assert new_tokens[:len(old_tokens)] == old_tokens
