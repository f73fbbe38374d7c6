"""Store formats 2 and 3 (one file per version): every dtype and rank round-trips at aligned offsets,
every damaged byte is refused, the size prediction is exact, format 3 names a bank's arrays in one
byte and reads format 2, and a default-preset memory's framing stays within 256 bytes (176 in
format 3). Checked against tests/_store_ref.py, a reader written from the documented layout.
"""
from __future__ import annotations

import os
from pathlib import Path

import numpy as np
import pytest

from miita_edge.errors import StoreError
from miita_edge.memory import meta as meta_mod
from miita_edge.memory.bank import BankConfig, MemoryBank
from miita_edge.memory.store import Store, encoded_size
from miita_edge.memory import store_format
from miita_edge.memory.store_format import DTYPES
from miita_edge.method.presets import default_preset

import _store_ref as ref  # tests/_store_ref.py

ALL_DTYPES = [d for d in DTYPES] + [d.newbyteorder(">") for d in DTYPES if d.itemsize > 1]
SHAPES = [(), (0,), (7,), (0, 5), (3, 5), (1, 1), (2, 0, 3)]


def sample(dtype: np.dtype, shape, seed: int) -> np.ndarray:
    rng = np.random.default_rng(seed)
    raw = rng.integers(0, 256, size=int(np.prod(shape, dtype=np.int64)) * dtype.itemsize, dtype=np.uint8)
    if dtype.kind == "b":
        raw = raw & 1
    return raw.view(dtype).reshape(shape)  # every bit pattern, NaN payloads included


@pytest.fixture(params=[2, 3], ids=["format2", "format3"])
def fmt(request, monkeypatch):
    """The format commits write: today's (2), and format 3 as it would be written once adopted."""
    monkeypatch.setattr(store_format, "FORMAT_VERSION", request.param)
    return request.param


@pytest.fixture
def format3(monkeypatch):
    monkeypatch.setattr(store_format, "FORMAT_VERSION", 3)


def commit(root: Path, arrays, manifest) -> Path:
    with Store(root).writer() as w:
        w.commit(arrays, manifest)
    return root / (root / "CURRENT").read_text().strip()


def same(a: np.ndarray, b: np.ndarray) -> bool:
    return a.dtype == b.dtype and a.shape == b.shape and np.ascontiguousarray(a).tobytes() == np.ascontiguousarray(b).tobytes()


@pytest.mark.parametrize("dtype", ALL_DTYPES, ids=lambda d: d.str)
def test_every_dtype_and_rank_round_trips_aligned(tmp_path, dtype, fmt):
    arrays = {f"a{i}": sample(dtype, shape, i) for i, shape in enumerate(SHAPES)}
    arrays["odd"] = np.arange(3, dtype=np.uint8)  # a 1-byte array in front forces padding
    manifest = {"dtype": dtype.str}
    predicted = encoded_size(arrays, manifest)
    vfile = commit(tmp_path, arrays, manifest)
    raw = vfile.read_bytes()
    assert len(raw) == predicted == os.path.getsize(vfile)
    doc = ref.parse(raw)
    assert doc["end"] == len(raw) and doc["version"] == 1 and doc["format"] == fmt
    assert ref.crc_of(raw) == doc["crc"]
    for a in doc["arrays"]:
        assert a["offset"] % ref.dtype_of(a["code"]).alignment == 0, a
    snap = Store(tmp_path).read()
    by_ref = ref.arrays_of(raw)
    assert snap.manifest == manifest and set(snap.arrays) == set(arrays) == set(by_ref)
    for name, arr in arrays.items():
        got = snap.arrays[name]
        assert same(got, arr) and same(by_ref[name], arr), name
        assert not got.flags.writeable and got.flags.aligned and got.flags.c_contiguous, name


def test_arrays_are_written_in_decreasing_alignment_so_padding_is_small(tmp_path):
    arrays = {"u8": np.arange(3, dtype=np.uint8), "f8": np.ones(2), "u2": np.arange(5, dtype=np.uint16),
              "i4": np.arange(1, dtype=np.int32)}
    raw = commit(tmp_path, arrays, {}).read_bytes()
    doc = ref.parse(raw)
    assert [a["name"] for a in doc["arrays"]] == ["f8", "i4", "u2", "u8"]
    padding = len(raw) - doc["header_end"] - sum(a.nbytes for a in arrays.values())
    assert 0 <= padding <= 7


def _small_store(tmp_path: Path) -> tuple[Path, bytes, dict]:
    arrays = {"keys": np.arange(6, dtype=np.float32).reshape(2, 3), "bits": np.arange(5, dtype=np.uint8),
              "none": np.zeros((0, 2), np.int32)}
    vfile = commit(tmp_path / "mem", arrays, {"n": 2, "t": "x"})
    return vfile, vfile.read_bytes(), arrays


def test_every_flipped_bit_of_a_small_store_is_refused(tmp_path, fmt):
    """Each of the file's bits flipped in turn: the store refuses every one with a one-line
    StoreError; a flip in an array payload is named a CRC32 mismatch."""
    vfile, raw, arrays = _small_store(tmp_path)
    doc = ref.parse(raw)
    payload = {i for a in doc["arrays"] for i in range(a["offset"], a["offset"] + a["nbytes"])}
    assert payload and len(raw) < 200
    messages = set()
    for i in range(len(raw)):
        for bit in range(8):
            bad = bytearray(raw)
            bad[i] ^= 1 << bit
            vfile.write_bytes(bytes(bad))
            with pytest.raises(StoreError) as info:
                Store(tmp_path / "mem").read()
            msg = str(info.value)
            assert "\n" not in msg and "v00000001" in msg, (i, bit, msg)
            if i in payload:
                assert "CRC32 mismatch" in msg, (i, bit, msg)
            messages.add(msg.split(": ", 1)[1].split(" (")[0])
    vfile.write_bytes(raw)
    snap = Store(tmp_path / "mem").read()
    assert all(same(snap.arrays[k], v) for k, v in arrays.items())
    assert len(messages) >= 4, messages  # magic, format, truncation/size, CRC at least


def test_every_truncation_and_extension_is_refused(tmp_path, fmt):
    vfile, raw, _ = _small_store(tmp_path)
    for cut in list(range(len(raw))) + [len(raw) + 1, len(raw) + 4096]:
        vfile.write_bytes(raw[:cut] if cut < len(raw) else raw + bytes(cut - len(raw)))
        with pytest.raises(StoreError, match="truncated|oversized|bad magic"):
            Store(tmp_path / "mem").read()


def test_a_consistent_forgery_is_a_valid_store(tmp_path, fmt):
    """The reference codec really writes the format: a file rebuilt from its parse opens."""
    vfile, raw, arrays = _small_store(tmp_path)
    assert ref.build(ref.parse(raw)) == raw
    doc = ref.parse(raw)
    doc["meta"] = b'{"n":3,"t":"x"}'  # same length
    vfile.write_bytes(ref.build(doc))
    assert Store(tmp_path / "mem").read().manifest == {"n": 3, "t": "x"}


def test_a_bank_array_costs_one_name_byte_and_any_other_is_spelled_out(tmp_path, format3):
    """Format 3's names against the reference: a name of the list is its 1-based index, any other
    name is 0 and the name; both read back, and the header is that much shorter than format 2's."""
    # one-byte dtypes only, so no padding moves when the header's length changes
    arrays = {"counts": np.arange(3, dtype=np.uint8), "anchors": np.ones((2, 8), np.uint8),
              "my_extra": np.zeros(2, np.int8)}
    raw = commit(tmp_path / "m", arrays, {}).read_bytes()
    doc = ref.parse(raw)
    assert doc["format"] == 3
    assert {a["name"]: a["spelled"] for a in doc["arrays"]} == {"counts": False, "anchors": False, "my_extra": True}
    as_format_2 = ref.build({**doc, "format": 2})
    # a coded name saves its letters (its code takes the length byte's place); a spelled one costs its 0
    assert len(as_format_2) - len(raw) == len("counts") + len("anchors") - 1
    snap = Store(tmp_path / "m").read()
    assert snap.format_version == 3 and all(same(snap.arrays[k], v) for k, v in arrays.items())


def test_format_3_reads_format_2_and_the_next_commit_writes_format_3(tmp_path, format3):
    """The same arrays and manifest written as format 2 (every name spelled out) read back as they
    were, named format 2; the next commit writes format 3."""
    arrays = {"counts": np.arange(3, dtype=np.uint8), "tok_bits": np.arange(5, dtype=np.uint8),
              "keys": np.ones((2, 2), np.int8)}  # one-byte dtypes: no padding to move
    vfile = commit(tmp_path / "m", arrays, {"n": 1})
    vfile.write_bytes(ref.build({**ref.parse(vfile.read_bytes()), "format": 2}))
    assert ref.parse(vfile.read_bytes())["format"] == 2
    snap = Store(tmp_path / "m").read()
    assert snap.format_version == 2 and snap.manifest == {"n": 1}
    assert all(same(snap.arrays[k], v) for k, v in arrays.items())
    assert commit(tmp_path / "m", dict(snap.arrays), {"n": 2}).read_bytes()[4] == 3


def test_todays_writer_reads_a_format_3_file_and_rewrites_it_as_format_2(tmp_path, monkeypatch):
    """A memory written in format 3 (by the candidate, or a later release) opens here, and the next
    commit of today's writer (format 2) keeps every array."""
    arrays = {"counts": np.arange(3, dtype=np.uint8), "anchors": np.ones((2, 8), np.uint8)}
    monkeypatch.setattr(store_format, "FORMAT_VERSION", 3)
    assert commit(tmp_path / "m", arrays, {"n": 1}).read_bytes()[4] == 3
    monkeypatch.setattr(store_format, "FORMAT_VERSION", 2)
    snap = Store(tmp_path / "m").read()
    assert snap.format_version == 3 and all(same(snap.arrays[k], v) for k, v in arrays.items())
    raw = commit(tmp_path / "m", dict(snap.arrays), {"n": 2}).read_bytes()
    assert raw[4] == 2 and all(same(ref.arrays_of(raw)[k], v) for k, v in arrays.items())


def test_an_unknown_name_code_is_refused(tmp_path, format3):
    """A code past the list (a newer writer's array, or damage with a fixed CRC) is one line naming it."""
    vfile = commit(tmp_path / "m", {"counts": np.arange(3, dtype=np.uint8)}, {})
    raw = bytearray(vfile.read_bytes())
    assert raw[15] == ref.NAMES.index("counts") + 1  # 13 fixed bytes, two one-byte varints, then the code
    for code in (len(ref.NAMES) + 1, 255):
        raw[15] = code
        vfile.write_bytes(ref.fix_crc(bytes(raw)))
        with pytest.raises(StoreError, match=f"unknown name code {code}"):
            Store(tmp_path / "m").read()


# ----------------------------------------------------------------------------- bank-shaped memories


FINGERPRINT = {"sha256": "a5fd3b62230aa5ec60212297dc9d20eaa70578ac519e00d93a17e44c087a6818", "arch": "gemma3",
               "n_embd": 640, "key_layer": 9}


def default_bank(n_protos: int, anchors_per: int, tokens_per: int, seed: int = 0) -> MemoryBank:
    """A default-preset bank (answer tokens, 1-bit keys) of the given shape, built directly."""
    from miita_edge.memory.bank import Prototype

    rng = np.random.default_rng(seed)
    bank = MemoryBank(default_preset().bank, 640)
    for j in range(n_protos):
        keys = np.sign(rng.standard_normal((anchors_per, 640))).astype(np.float32)
        bank.protos.append(Prototype(np.zeros((0, 640), np.float32), rng.integers(0, 262144, tokens_per).astype(np.int32),
                                     keys, n=3, anchor_n=np.full(anchors_per, 2, np.int64)))
    return bank


def memory_meta(bank: MemoryBank, **over) -> dict:
    fields = {"format": meta_mod.FORMAT_V2, "preset": default_preset().to_json(), "template": "banking77",
              "fingerprint": FINGERPRINT, "budget": "1%", "stream_bytes": 239055, "examples": 3075, "skipped": 0,
              "prototypes": bank.n_prototypes, "anchors": bank.n_anchors, **over}
    return meta_mod.compact(fields)


@pytest.mark.parametrize("shape", [(9, 2, 3), (1, 1, 2), (77, 4, 4), (400, 3, 6)], ids=str)
def test_default_preset_memory_framing_is_at_most_256_bytes(tmp_path, shape, fmt):
    """Framing = every byte that is not array payload: header, names, dtypes, shapes, CRC, padding,
    the memory's own fields. The target is at most 256 bytes in format 2 (format 1: 1,368 at 1%),
    176 in format 3."""
    bank = default_bank(*shape)
    meta = memory_meta(bank, stream_bytes=2_852_224 if shape[0] > 100 else 239055,
                       examples=14_000 if shape[0] > 100 else 3075)
    arrays = bank.to_arrays()
    predicted = encoded_size(bank.to_arrays(shapes_only=True), meta)
    assert predicted == encoded_size(arrays, meta)
    vfile = commit(tmp_path / "m", arrays, meta)
    size = os.path.getsize(vfile)
    payload = sum(a.nbytes for a in arrays.values())
    assert size == predicted
    assert size - payload <= {2: 256, 3: 176}[fmt], (shape, size - payload)
    # and the memory's fields come back in full from the stored form
    snap = Store(tmp_path / "m").read()
    fields = meta_mod.expand(snap.manifest, snap.arrays)
    assert fields["prototypes"] == shape[0] and fields["anchors"] == shape[0] * shape[1]
    assert meta_mod.same_model(fields["fingerprint"], FINGERPRINT) and fields["budget"] == "1%"
    assert (fields["fingerprint"] == FINGERPRINT) == (fmt == 2)  # format 3 keeps 96 bits of the sha256 and fields["template"] == "banking77"


def test_size_prediction_is_exact_while_a_bank_grows(tmp_path):
    """What budget repair relies on: ``encoded_size`` of the zero-cost shape views equals the bytes
    on disk after the commit, at every size (varint widths change at 128 and 16,384)."""
    root = tmp_path / "m"
    for n in (0, 1, 2, 63, 64, 127, 128, 129, 300):
        bank = default_bank(n, 1, 2, seed=n)
        meta = memory_meta(bank, examples=n * 1000, stream_bytes=n * 99999)
        predicted = encoded_size(bank.to_arrays(shapes_only=True), meta)
        with Store(root).writer() as w:
            snap = w.commit(bank.to_arrays(), meta)
        vfile = root / (root / "CURRENT").read_text().strip()
        assert snap.bytes_on_disk == predicted == os.path.getsize(vfile), n
        assert Store(root).read().bytes_on_disk == predicted


def test_bank_round_trips_through_the_store(tmp_path):
    bank = default_bank(5, 3, 4, seed=3)
    commit(tmp_path / "m", bank.to_arrays(), memory_meta(bank))
    snap = Store(tmp_path / "m").read()
    back = MemoryBank.from_arrays(BankConfig(payload="tokens", key_precision="bit"), 640, snap.arrays)
    assert back.n_prototypes == 5 and back.n_anchors == 15
    for p, q in zip(bank.protos, back.protos):
        assert p.tokens.tolist() == q.tokens.tolist() and np.array_equal(p.anchors, q.anchors) and p.n == q.n
