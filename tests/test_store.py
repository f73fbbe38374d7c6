"""Tests for miita_edge.memory.store: round trips, exact sizes, corruption, locking, crash safety.

Every size assertion is checked against the file system (getsize), never against the store's
own arithmetic alone, and content is checked with an independent reader of the format
(tests/_store_ref.py) as well as through ``Store.read``. The compact format's own properties
(every dtype, every byte flipped, framing) are in tests/test_store_format.py; format 1 in
tests/test_store_v1.py.
"""
from __future__ import annotations

import importlib.util
import mmap
import os
import random
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

import miita_edge
from miita_edge.errors import MiitaError, StoreError
from miita_edge.memory.store import FORMAT_VERSION, Snapshot, Store, encoded_size

import _store_ref as ref  # tests/_store_ref.py

WORKER = Path(__file__).with_name("_store_crash_worker.py")
_spec = importlib.util.spec_from_file_location("_store_crash_worker", WORKER)
worker = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(worker)

DTYPES = [np.float32, np.float16, np.int8, np.uint8, np.int32, np.uint16]
SHAPES = [(0, 8), (5, 8), (1, 3), (0,), (7,)]


def _worker_env() -> dict[str, str]:
    env = dict(os.environ)
    pkg_root = str(Path(miita_edge.__file__).resolve().parent.parent)
    env["PYTHONPATH"] = os.pathsep.join([pkg_root, env.get("PYTHONPATH", "")]).rstrip(os.pathsep)
    return env


def version_dirs(root: Path) -> list[str]:
    """The versions present (format-2 files and format-1 directories)."""
    return sorted(p.name for p in root.iterdir() if p.name.startswith("v"))


def measured_bytes(vpath: Path) -> int:
    """Independent size: the version file (or every file under a format-1 directory), as the OS reports it."""
    if vpath.is_file():
        return os.path.getsize(vpath)
    total = 0
    for dirpath, _, files in os.walk(vpath):
        for f in files:
            total += os.path.getsize(os.path.join(dirpath, f))
    return total


def current_dir(root: Path) -> Path:
    """The committed version's path (a file since format 2)."""
    return root / (root / "CURRENT").read_text().strip()


def same_array(a: np.ndarray, b: np.ndarray) -> bool:
    """Bit-exact equality, so NaN payloads and -0.0 count too."""
    return a.dtype == b.dtype and a.shape == b.shape and np.ascontiguousarray(a).tobytes() == np.ascontiguousarray(b).tobytes()


def sample(dtype, shape, seed=0) -> np.ndarray:
    rng = np.random.default_rng(seed)
    dt = np.dtype(dtype)
    if dt.kind == "f":
        return rng.standard_normal(shape).astype(dt)
    info = np.iinfo(dt)
    return rng.integers(info.min, info.max, size=shape, endpoint=True, dtype=dt)


def commit(root: Path, arrays, manifest) -> Snapshot:
    with Store(root).writer() as w:
        return w.commit(arrays, manifest)


# ----------------------------------------------------------------------------- round trip


@pytest.mark.parametrize("dtype", DTYPES, ids=lambda d: np.dtype(d).name)
@pytest.mark.parametrize("shape", SHAPES, ids=str)
def test_round_trip(tmp_path, dtype, shape):
    arrays = {"keys": sample(dtype, shape), "vals": sample(dtype, shape, seed=1)[::-1].copy(), "one": np.arange(3, dtype=dtype)}
    manifest = {"fingerprint": {"model": "gemma", "layer": 6}, "n": shape[0], "ratio": 0.25, "tags": ["a", None, True]}
    predicted = encoded_size(arrays, manifest)
    root = tmp_path / "mem"
    snap = commit(root, arrays, manifest)

    vdir = current_dir(root)
    assert snap.version == 1
    assert snap.bytes_on_disk == predicted == measured_bytes(vdir)
    for got in (snap, Store(root).read()):
        assert got.manifest == manifest
        assert set(got.arrays) == set(arrays)
        for name, arr in arrays.items():
            assert same_array(got.arrays[name], arr), name
            assert not got.arrays[name].flags.writeable
    # An independent reader of the documented layout gets the same arrays from the file.
    got = ref.arrays_of(vdir.read_bytes())
    assert set(got) == set(arrays)
    for name, arr in arrays.items():
        assert same_array(got[name], arr)


def _base_of(arr: np.ndarray):
    """What an array's memory finally belongs to (through views and memoryviews)."""
    while isinstance(arr, np.ndarray) and arr.base is not None:
        arr = arr.base
    return arr.obj if isinstance(arr, memoryview) else arr


def test_nonempty_arrays_are_memory_mapped(tmp_path):
    commit(tmp_path, {"keys": np.ones((4, 8), np.float32), "empty": np.zeros((0, 8), np.float32)}, {})
    snap = Store(tmp_path).read()
    assert isinstance(_base_of(snap.arrays["keys"]), mmap.mmap)  # a view of the map, not a copy
    assert snap.arrays["keys"].flags.aligned and not snap.arrays["keys"].flags.writeable
    assert snap.arrays["empty"].shape == (0, 8)


def test_noncontiguous_fortran_and_big_endian_inputs(tmp_path):
    arrays = {
        "f": np.asfortranarray(np.arange(12, dtype=np.float32).reshape(3, 4)),
        "strided": np.arange(20, dtype=np.int32)[::3],
        "be": np.arange(5, dtype=">u2"),
        "b": np.array([True, False, True]),
        "c": np.array([1 + 2j], dtype=np.complex64),
    }
    predicted = encoded_size(arrays, {"k": 1})
    snap = commit(tmp_path, arrays, {"k": 1})
    assert snap.bytes_on_disk == predicted == measured_bytes(current_dir(tmp_path))
    for name, arr in arrays.items():
        assert np.array_equal(Store(tmp_path).read().arrays[name], arr), name


def test_encoded_size_is_pure(tmp_path):
    root = tmp_path / "mem"
    encoded_size({"a": np.zeros(3, np.int8)}, {"x": 1})
    assert not root.exists() and list(tmp_path.iterdir()) == []


json_values = st.recursive(
    st.none() | st.booleans() | st.integers(-(2**70), 2**70) | st.floats(allow_nan=False, allow_infinity=False) | st.text(max_size=12),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=6), inner, max_size=4),
    max_leaves=12,
)
any_dtype = st.sampled_from(
    ["<f4", "<f2", "<f8", "|i1", "|u1", "<i2", "<u2", "<i4", "<u4", "<i8", "|b1", "<c8", ">f4", ">i4"]
)


@st.composite
def array_dicts(draw):
    names = draw(st.lists(st.from_regex(r"[a-z0-9_]{1,12}", fullmatch=True), max_size=5, unique=True))
    out = {}
    for name in names:
        ndim = draw(st.sampled_from([1, 2]))
        rows = draw(st.sampled_from([0, 1, 2, 9, 10, 99, 100, 1000, 12345]))
        shape = (rows,) if ndim == 1 else (rows, draw(st.integers(0, 17)))
        if np.prod(shape) > 20000:
            shape = (rows,) if ndim == 1 else (rows, 1)
        out[name] = draw(hnp.arrays(np.dtype(draw(any_dtype)), shape))
    return out


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
@given(arrays=array_dicts(), manifest=st.dictionaries(st.text(max_size=8), json_values, max_size=5))
def test_encoded_size_matches_disk_property(tmp_path_factory, arrays, manifest):
    root = tmp_path_factory.mktemp("prop")
    predicted = encoded_size(arrays, manifest)
    snap = commit(root, arrays, manifest)
    assert snap.bytes_on_disk == predicted == measured_bytes(current_dir(root))
    got = Store(root).read()
    assert got.manifest == manifest
    assert all(same_array(got.arrays[k], v) for k, v in arrays.items())
    # A second commit of the same content (now version 2) has the same size: the version
    # number must not leak into the byte count.
    with Store(root).writer() as w:
        assert w.commit(arrays, manifest).bytes_on_disk == predicted


def test_size_independent_of_version_number(tmp_path):
    arrays = {"keys": np.zeros((3, 4), np.float32)}
    sizes = set()
    with Store(tmp_path).writer() as w:
        for _ in range(12):  # crosses 9 -> 10 (one more digit if the version were a plain int)
            snap = w.commit(arrays, {"m": 1})
            sizes.add(measured_bytes(current_dir(tmp_path)))
    assert snap.version == 12
    assert sizes == {encoded_size(arrays, {"m": 1})}


# ----------------------------------------------------------------------------- versions


def test_versions_increase_and_old_ones_are_removed(tmp_path):
    store = Store(tmp_path / "mem")
    assert not store.exists()
    seen = []
    with store.writer() as w:
        for i in range(1, 4):
            seen.append(w.commit({"x": np.full((i,), i, np.int32)}, {"i": i}).version)
            assert version_dirs(store.path) == [f"v{seen[-1]:08d}"]
    assert seen == [1, 2, 3]
    assert store.exists()
    with store.writer() as w:  # a new writer continues the sequence
        assert w.commit({"x": np.zeros(1, np.int32)}, {}).version == 4
    snap = store.read()
    assert snap.version == 4 and snap.manifest == {}
    assert sorted(os.listdir(store.path)) == [".lock", "CURRENT", "v00000004"]


def test_open_snapshot_survives_deletion_of_its_version(tmp_path):
    """Readers map files; a later commit unlinks them, which must not disturb the mapping."""
    commit(tmp_path, {"x": np.arange(100, dtype=np.float32)}, {"v": 1})
    old = Store(tmp_path).read()
    commit(tmp_path, {"x": np.zeros(100, dtype=np.float32)}, {"v": 2})
    assert version_dirs(tmp_path) == ["v00000002"]
    assert np.array_equal(old.arrays["x"], np.arange(100, dtype=np.float32))


def test_stale_debris_is_left_by_readers_and_removed_by_next_writer(tmp_path):
    commit(tmp_path, {"x": np.arange(3, dtype=np.int8)}, {"v": 1})
    stale = tmp_path / "v00000002"
    stale.write_bytes(b"\x93MIM\x02 half")
    stale_v1 = tmp_path / "v00000003"  # a format-1 directory left by an older writer
    stale_v1.mkdir()
    (stale_v1 / "x.npy").write_bytes(b"\x93NUMPY half")
    (tmp_path / "CURRENT.tmp").write_text("v00000002\n")
    (tmp_path / "user_notes.txt").write_text("not ours")

    assert Store(tmp_path).read().version == 1
    assert stale.exists() and (tmp_path / "CURRENT.tmp").exists()  # readers never clean

    with Store(tmp_path).writer():
        pass
    assert not stale.exists() and not stale_v1.exists() and not (tmp_path / "CURRENT.tmp").exists()
    assert (tmp_path / "user_notes.txt").exists()  # only store-shaped names are touched
    assert Store(tmp_path).read().version == 1
    with Store(tmp_path).writer() as w:
        assert w.commit({"x": np.arange(2, dtype=np.int8)}, {}).version == 2


# ----------------------------------------------------------------------------- corruption


def _make(tmp_path: Path) -> Path:
    root = tmp_path / "mem"
    commit(root, {"keys": np.arange(40, dtype=np.float32).reshape(5, 8), "ids": np.arange(5, dtype=np.int32)}, {"n": 5})
    return root


def _rewrite(root: Path, fn) -> None:
    """Apply ``fn`` to the version file's bytes (a bytearray) and write them back."""
    f = current_dir(root)
    data = bytearray(f.read_bytes())
    out = fn(data)
    f.write_bytes(bytes(data if out is None else out))


def _forge(fn):
    """Edit header fields through the reference codec; the CRC is recomputed, so only the field
    check can catch it."""
    def forge(root):
        def edit(raw):
            doc = ref.parse(bytes(raw))
            fn(doc)
            return ref.build(doc)
        _rewrite(root, edit)
    forge.__name__ = fn.__name__
    return forge


def _truncate(root):
    f = current_dir(root)
    os.truncate(f, os.path.getsize(f) - 7)


def _flip_data_byte(root):
    def flip(data):
        data[-3] ^= 0x40  # inside the last payload (ids)
    _rewrite(root, flip)


def _flip_crc_byte(root):
    def flip(data):
        data[6] ^= 0x01
    _rewrite(root, flip)


def _flip_meta_byte(root):
    def flip(data):
        at = bytes(data).index(b'{"n":5}')
        data[at + 5] ^= 0x02  # 5 -> 7: still valid JSON, only the CRC can tell
    _rewrite(root, flip)


def _append(root):
    with open(current_dir(root), "ab") as fh:
        fh.write(b"\0" * 16)


def _delete_file(root):
    os.unlink(current_dir(root))


def _garbage_file(root):
    current_dir(root).write_bytes(b"{\"format_version\":1,\xff garbage")


def _empty_file(root):
    current_dir(root).write_bytes(b"")


def _future_format(root):
    def edit(data):
        data[4] = 4  # format 3 is read; 4 is a newer miita-edge's
    _rewrite(root, edit)


def _forged_shape(doc):
    """A self-consistent header claiming more rows than the file holds: must not be mapped."""
    doc["arrays"][0]["shape"] = [500, 8]


def _forged_fewer_rows(doc):
    doc["arrays"][0]["shape"] = [4, 8]


def _bad_dtype_code(doc):
    doc["arrays"][0]["code"] = 0x7F


def _big_endian_byte(doc):
    doc["arrays"][0]["code"] = 0x82  # big-endian uint8 does not exist: one code per dtype


def _bad_name(doc):
    doc["arrays"][0]["name"] = "../evil"


def _duplicate_name(doc):
    doc["arrays"][1]["name"] = doc["arrays"][0]["name"]


def _version_mismatch(doc):
    doc["version"] = 9


def _meta_garbage(doc):
    doc["meta"] = b"\xff" * len(doc["meta"])


def _meta_not_object(doc):
    doc["meta"] = b"[1,2,3]"


def _meta_nan(doc):
    doc["meta"] = b"[NaN,1]"  # same length as {"n":5}: the payload offsets stay


def _too_many_arrays(root):
    def edit(raw):
        return ref.fix_crc(bytes(raw[:13]) + ref.enc_varint(10**6) + bytes(raw[14:]))
    _rewrite(root, edit)


def _overlong_number(root):
    def edit(raw):
        return ref.fix_crc(bytes(raw[:14]) + b"\xff" * 12 + bytes(raw[14:]))
    _rewrite(root, edit)


def _version_is_a_fifo(root):
    f = current_dir(root)
    f.unlink()
    os.mkfifo(f)


def _current_missing_dir(root):
    (root / "CURRENT").write_text("v00000042\n")


def _current_garbage(root):
    (root / "CURRENT").write_text("hello world\n")


def _no_current(root):
    os.unlink(root / "CURRENT")


CORRUPTIONS = [
    (_truncate, ["v00000001", "truncated"]),
    (_flip_data_byte, ["v00000001", "CRC32"]),
    (_flip_crc_byte, ["v00000001", "CRC32"]),
    (_flip_meta_byte, ["v00000001", "CRC32"]),
    (_append, ["v00000001", "oversized"]),
    (_delete_file, ["v00000001", "missing"]),
    (_garbage_file, ["v00000001", "bad magic"]),
    (_empty_file, ["v00000001", "truncated"]),
    (_future_format, ["v00000001", "format_version 4", "newer"]),
    (_forge(_forged_shape), ["v00000001", "truncated"]),
    (_forge(_forged_fewer_rows), ["v00000001", "oversized"]),
    (_forge(_bad_dtype_code), ["v00000001", "unknown dtype code"]),
    (_forge(_big_endian_byte), ["v00000001", "unknown dtype code"]),
    (_forge(_bad_name), ["v00000001", "bad array name"]),
    (_forge(_duplicate_name), ["v00000001", "appears twice"]),
    (_forge(_version_mismatch), ["v00000001", "records version 9"]),
    (_forge(_meta_garbage), ["v00000001", "not valid JSON"]),
    (_forge(_meta_not_object), ["v00000001", "not a JSON object"]),
    (_forge(_meta_nan), ["v00000001", "not valid JSON"]),
    (_too_many_arrays, ["v00000001", "1000000 arrays"]),
    (_overlong_number, ["v00000001", "overlong"]),
    (_version_is_a_fifo, ["v00000001", "neither a version file nor"]),
    (_current_missing_dir, ["v00000042", "missing"]),
    (_current_garbage, ["CURRENT", "corrupt"]),
    (_no_current, ["not a memory store"]),
]


@pytest.mark.parametrize("damage,needles", CORRUPTIONS, ids=[c[0].__name__.strip("_") for c in CORRUPTIONS])
def test_corruption_is_a_one_line_store_error(tmp_path, damage, needles):
    root = _make(tmp_path)
    Store(root).read()  # sanity: valid before the damage
    damage(root)
    with pytest.raises(StoreError) as info:
        Store(root).read()
    msg = str(info.value)
    assert isinstance(info.value, MiitaError)
    assert "\n" not in msg
    assert str(root) in msg
    for needle in needles:
        assert needle in msg, msg


@pytest.mark.parametrize("kind", ["nonexistent", "regular_file", "empty_dir"])
def test_not_a_store(tmp_path, kind):
    path = tmp_path / "thing"
    if kind == "regular_file":
        path.write_text("hello")
    elif kind == "empty_dir":
        path.mkdir()
    with pytest.raises(StoreError, match="memory .*thing") as info:
        Store(path).read()
    assert "\n" not in str(info.value)
    assert not Store(path).exists()
    expected = {"nonexistent": "does not exist", "regular_file": "not a directory", "empty_dir": "not a memory store"}[kind]
    assert expected in str(info.value)


def test_writer_refuses_a_file_path(tmp_path):
    path = tmp_path / "file"
    path.write_text("x")
    with pytest.raises(StoreError, match="not a directory"):
        with Store(path).writer():
            pass


def test_writer_refuses_to_overwrite_newer_format(tmp_path):
    root = _make(tmp_path)
    _future_format(root)
    before = current_dir(root).read_bytes()
    with pytest.raises(StoreError, match=f"format_version 4, this miita-edge writes {FORMAT_VERSION}; refusing to overwrite") as info:
        with Store(root).writer():
            pass
    assert "\n" not in str(info.value)
    assert current_dir(root).read_bytes() == before


def test_writer_repairs_a_damaged_current_version(tmp_path):
    root = _make(tmp_path)
    _truncate(root)
    snap = commit(root, {"keys": np.ones((2, 2), np.float32)}, {"n": 2})
    assert snap.version == 2 and Store(root).read().manifest == {"n": 2}
    assert snap.format_version == FORMAT_VERSION


# ----------------------------------------------------------------------------- programming errors


@pytest.mark.parametrize(
    "arrays,manifest,match",
    [
        ({"Bad-Name": np.zeros(1)}, {}, "name"),
        ({"": np.zeros(1)}, {}, "name"),
        ({"obj": np.array([object()], dtype=object)}, {}, "dtype"),
        ({"s": np.array(["a"])}, {}, "dtype"),
        ({"g": np.zeros(2, np.longdouble)}, {}, "cannot hold"),
        ({"deep": np.zeros((1,) * 33, np.int8)}, {}, "dimensions"),
        ({"lst": [1, 2]}, {}, "ndarray"),
        ({}, [1], "dict"),
        ({}, {"x": object()}, "JSON"),
        ({}, {"x": float("nan")}, "JSON"),
        ({}, {"t": (1, 2)}, "round-trip"),
        ({}, {1: "int key"}, "round-trip"),
    ],
)
def test_bad_arguments_are_value_errors(tmp_path, arrays, manifest, match):
    with Store(tmp_path).writer() as w:
        with pytest.raises(ValueError, match=match):
            w.commit(arrays, manifest)
    assert not Store(tmp_path).exists()  # nothing was published


def test_commit_outside_with_is_a_bug(tmp_path):
    with pytest.raises(RuntimeError):
        Store(tmp_path).writer().commit({}, {})


# ----------------------------------------------------------------------------- locking


def test_second_writer_in_same_process_is_refused(tmp_path):
    store = Store(tmp_path)
    with store.writer() as w:
        with pytest.raises(StoreError, match=rf"memory .* is locked by another writer \(pid {os.getpid()}\)") as info:
            with store.writer():
                pass
        assert "\n" not in str(info.value)
        w.commit({"x": np.zeros(1, np.int8)}, {})  # the holder is unaffected
    with store.writer() as w:  # released
        assert w.commit({"x": np.zeros(1, np.int8)}, {}).version == 2


def test_writer_in_another_process_blocks_us(tmp_path):
    proc = subprocess.Popen(
        [sys.executable, str(WORKER), "hold", str(tmp_path), "0.6"], stdout=subprocess.PIPE, env=_worker_env()
    )
    try:
        assert proc.stdout.readline() == b"locked\n"
        with pytest.raises(StoreError, match=rf"locked by another writer \(pid {proc.pid}\)"):
            with Store(tmp_path).writer():
                pass
        start = time.monotonic()
        with Store(tmp_path).writer(wait=True) as w:  # blocks until the holder exits
            assert time.monotonic() - start > 0.1
            assert w.commit({"x": np.ones(2, np.int8)}, {"ok": True}).version == 1
        assert proc.wait(timeout=10) == 0
    finally:
        proc.kill()
        proc.wait()
        proc.stdout.close()


def test_readers_ignore_the_lock(tmp_path):
    commit(tmp_path, {"x": np.ones(2, np.int8)}, {"v": 1})
    with Store(tmp_path).writer():
        assert Store(tmp_path).read().manifest == {"v": 1}


# ----------------------------------------------------------------------------- crash safety


def _check_content(snap: Snapshot) -> None:
    v = snap.version
    assert snap.manifest == worker.manifest_for(v)
    expected = worker.arrays_for(v)
    assert set(snap.arrays) == set(expected)
    for name, arr in expected.items():
        assert same_array(snap.arrays[name], arr), (v, name)
    assert snap.bytes_on_disk == encoded_size(expected, worker.manifest_for(v))


def test_sigkill_at_random_moments_never_loses_the_last_commit(tmp_path):
    """A writer committing in a tight loop is SIGKILLed 35 times at random instants.

    After each kill the store must open, hold exactly the content its version number
    promises, and never go back in version. While the writer runs, this process also reads
    concurrently, exercising the reader's retry when a version is deleted under it.
    """
    root = tmp_path / "mem"
    rng = random.Random(20240607)
    env = _worker_env()
    last = 0
    concurrent_reads = 0
    for _ in range(35):
        proc = subprocess.Popen([sys.executable, str(WORKER), "commit", str(root)], stdout=subprocess.PIPE, env=env)
        try:
            assert proc.stdout.readline() == b"ready\n", "worker failed to start"
            deadline = time.monotonic() + rng.uniform(0.0, 0.05)
            while time.monotonic() < deadline:
                if Store(root).exists():
                    snap = Store(root).read()
                    _check_content(snap)
                    assert snap.version >= last
                    last = snap.version
                    concurrent_reads += 1
            proc.send_signal(signal.SIGKILL)
            assert proc.wait(timeout=10) == -signal.SIGKILL, "worker died on its own"
        finally:
            proc.kill()
            proc.wait()
            proc.stdout.close()
        if not Store(root).exists():
            assert last == 0  # killed before the very first commit
            continue
        snap = Store(root).read()
        _check_content(snap)
        assert snap.version >= last
        last = snap.version
    # The loop must have made real progress, or the kills proved nothing.
    assert last >= 10, last
    assert concurrent_reads > 0
    with Store(root).writer():  # a final writer clears whatever debris the last kill left
        pass
    assert version_dirs(root) == [f"v{last:08d}"]
    assert not (root / "CURRENT.tmp").exists()
