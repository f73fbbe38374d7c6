"""The memory layer's parts that the facade used to do itself: ``Store.transaction`` (lock, version
check, roll-back), ``Store.refuse_foreign``, and ``memory.manifest`` (a memory's fields beside its
bank and its exact committed size), checked against the store's own files."""
from __future__ import annotations

import numpy as np
import pytest

from miita_edge.errors import StoreConflict, StoreError
from miita_edge.memory import meta
from miita_edge.memory.bank import BankConfig, MemoryBank
from miita_edge.memory.budget import Budget, parse_budget
from miita_edge.memory.manifest import Manifest, StreamCounts, read_fields, stored_key_layers
from miita_edge.memory.store import Store

FP = {"sha256": "ab" * 32, "arch": "gemma3", "n_embd": 8, "key_layer": 4, "key_layers": [4, 3]}


class Holder:
    """What a facade looks like to a transaction: attributes that a commit is made of."""

    def __init__(self) -> None:
        self.bank = {"rows": [1, 2]}
        self.count = 0


def test_a_transaction_works_on_copies_and_puts_them_back_on_error(tmp_path):
    store, h = Store(tmp_path / "m"), Holder()
    original = h.bank
    with pytest.raises(RuntimeError):
        with store.transaction(0, "ingest", h, ("bank", "count")):
            assert h.bank == original and h.bank is not original  # a deep copy
            h.bank["rows"].append(3)
            h.count = 7
            raise RuntimeError("boom")
    assert h.bank is original and h.bank == {"rows": [1, 2]} and h.count == 0
    assert not store.exists()


def test_a_transaction_keeps_its_changes_unless_told_not_to(tmp_path):
    store, h = Store(tmp_path / "m"), Holder()
    with store.transaction(0, "ingest", h, ("bank",)) as w:
        h.bank["rows"].append(3)
        snap = w.commit({"x": np.zeros(2, np.float32)}, {"n": 1})
    assert h.bank == {"rows": [1, 2, 3]} and snap.version == 1 and store.read().version == 1
    with store.transaction(1, "forget", h, ("bank",)) as w:
        h.bank["rows"].clear()
        w.keep = False  # e.g. nothing matched: the caller's state stays as it was
    assert h.bank == {"rows": [1, 2, 3]} and store.read().version == 1


def test_a_transaction_refuses_a_memory_that_moved_on(tmp_path):
    store, h = Store(tmp_path / "m"), Holder()
    with store.writer() as w:
        w.commit({"x": np.zeros(2, np.float32)}, {"n": 1})
    with pytest.raises(StoreConflict, match=r"changed since it was opened \(version 0 -> 1.*rerun this forget"):
        with store.transaction(0, "forget", h, ("bank",)):
            pytest.fail("the block must not run")
    assert store.read().version == 1


def test_refuse_foreign_allows_the_stores_debris_only(tmp_path):
    d = tmp_path / "m"
    Store(d).refuse_foreign()  # absent
    d.mkdir()
    (d / ".lock").write_text("")
    (d / "CURRENT.tmp").write_text("v000001\n")
    Store(d).refuse_foreign()
    (d / "notes.txt").write_text("mine")
    with pytest.raises(StoreError, match="directory exists but is not a miita-edge memory"):
        Store(d).refuse_foreign()
    f = tmp_path / "file"
    f.write_text("")
    with pytest.raises(StoreError, match="is not a directory"):
        Store(f).refuse_foreign()


def bank_with(n: int) -> MemoryBank:
    b = MemoryBank(BankConfig(payload="tokens", key_precision="bit"), 8, key_parts=2)
    rng = np.random.default_rng(0)
    for i in range(n):
        b.write(np.zeros((0, 8), np.float32), np.array([10 + i % 3, 1], np.int32), rng.standard_normal(16))
    return b


@pytest.mark.parametrize("budget", ["64KiB", "1%", "none", " 2KB"])
def test_the_committed_size_is_the_files_and_the_fields_round_trip(tmp_path, budget):
    bank = bank_with(7)
    rec = Manifest({"name": "default", "version": 4}, "banking77", FP, parse_budget(budget), StreamCounts(7, 1, 345))
    with Store(tmp_path / "m").writer() as w:
        snap = w.commit(bank.to_arrays(), rec.stored(bank))
    assert rec.committed_size(bank) == snap.bytes_on_disk == sum(p.stat().st_size for p in (tmp_path / "m").glob("v*"))
    fields = read_fields(tmp_path / "m", Store(tmp_path / "m").read())
    want = rec.fields(bank)
    assert fields["budget"] == budget  # the text as written
    # every field as it was, but the sha256: the part the store's format keeps, which names the model
    assert {**fields, "fingerprint": None} == {**want, "fingerprint": None}
    assert {**fields["fingerprint"], "sha256": None} == {**want["fingerprint"], "sha256": None}
    assert want["fingerprint"]["sha256"].startswith(fields["fingerprint"]["sha256"])
    assert meta.same_model(fields["fingerprint"], want["fingerprint"])
    assert stored_key_layers("m", fields, n_layer=6) == [4, 3]
    with pytest.raises(StoreError, match=r"key layers \[4, 3\] do not exist in this model \(0..2\)"):
        stored_key_layers("m", fields, n_layer=4)


def test_budget_bytes_resolve_against_the_stream_as_counted():
    rec = Manifest({"name": "paper"}, "plain", FP, parse_budget("10%"), StreamCounts(stream_bytes=1000))
    assert rec.budget_bytes() == 100 and rec.budget_bytes(stream=2005) == 200
    rec.counts.stream_bytes = 50
    assert rec.budget_bytes() == 5
    assert Manifest({"name": "paper"}, "plain", FP, parse_budget("none")).budget_bytes() is None
    assert Budget(4096).spec == "4096 B" and parse_budget("4KiB").spec == "4KiB" and parse_budget("4KiB") == Budget(4096)
    assert meta.compact(rec.fields(bank_with(1)))["b"] == "10%"
