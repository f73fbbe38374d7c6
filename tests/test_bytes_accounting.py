"""``memory.accounting``: a memory's bytes split into keys, answers, vectors and framing, against a
brute-force count of the committed file and of the bank's prototypes, and the answers a memory
keeps against a direct count. No model: banks are written directly, with random keys, and repaired
under a small budget so that anchors fold into centroids and prototypes are evicted."""
from __future__ import annotations

import numpy as np
import pytest

from miita_edge.memory import codecs
from miita_edge.memory.accounting import PARTS, account, answer_coverage
from miita_edge.memory.bank import BankConfig, MemoryBank
from miita_edge.memory.budget import parse_budget
from miita_edge.memory.manifest import Manifest, StreamCounts
from miita_edge.memory.prototype import uint_for
from miita_edge.memory.store import Store
from miita_edge.memory.store_format import encode_meta

H = 32
FP = {"sha256": "ab" * 32, "arch": "gemma3", "n_embd": H, "key_layer": 4, "key_layers": [4, 3]}
ANSWERS = [np.array([5 + a, 9, 1 + a % 2], np.int32)[: 1 + a % 3] for a in range(9)]


def grown_bank(config: BankConfig, n: int, budget: int | None, seed: int = 0) -> tuple[MemoryBank, Manifest]:
    """A bank of ``n`` writes over the 9 answers (answer i % 9 for write i, with keys near that
    answer's own centre), repaired to ``budget`` bytes after each write as ingest does."""
    bank = MemoryBank(config, H, key_parts=2)
    rec = Manifest({"name": "default", "version": 12}, "banking77", FP, parse_budget("none" if budget is None
                                                                                     else str(budget)),
                   StreamCounts(0, 0, 0))
    rng = np.random.default_rng(seed)
    centres = rng.standard_normal((len(ANSWERS), 2 * H))
    for i in range(n):
        a = i % len(ANSWERS)
        toks = ANSWERS[a]
        dirs = rng.standard_normal((len(toks), H)).astype(np.float32)
        bank.write(dirs, toks, centres[a] + 0.9 * rng.standard_normal(2 * H))
        rec.counts.examples += 1
        rec.counts.stream_bytes += 40
        if budget is not None:
            bank.repair(budget, rec.committed_size)
    return bank, rec


def budget_for(room: int | None) -> int | None:
    """``room`` bytes above an empty default memory in the format commits write (None: no budget),
    so a case repairs the same way whichever format the store writes (format 3's framing is ~70
    bytes smaller than format 2's; the header and the manifest are budget bytes too)."""
    if room is None:
        return None
    _, rec = grown_bank(CONFIGS["default"], 0, None)
    return rec.committed_size(MemoryBank(CONFIGS["default"], H, key_parts=2)) + room


def brute_parts(bank: MemoryBank, file_bytes: bytes, manifest: dict) -> dict:
    """Each part counted from the prototypes one by one and from the version file's own bytes."""
    cfg, protos = bank.config, bank.protos
    A = sum(len(p.anchors) for p in protos)
    J = len(protos)
    keys = A * codecs.bytes_per_vector(cfg.key_precision, bank.key_dim)
    toks = [int(t) for p in protos for t in p.tokens]
    lens = [len(p.tokens) for p in protos]
    # a dictionary row per distinct id (2 bytes, 3 from 2^16), a narrowest-type index per token and
    # a length per answer; or both as one bit stream (a byte for its length width, then the bits)
    # where that is smaller, and then the lengths count as answers, not records
    n_ids = len(set(toks))
    idx_plain = len(toks) * np.dtype(uint_for(max(n_ids - 1, 0))).itemsize
    len_plain = J * np.dtype(uint_for(max(lens, default=0))).itemsize
    bits = J * max(1, max(lens, default=0).bit_length()) + len(toks) * max(1, (n_ids - 1).bit_length())
    packed = 1 + (bits + 7) // 8 < idx_plain + len_plain
    rows = sum(3 if t >= 65536 else 2 for t in set(toks))
    # or, where not larger, the ids as one Rice-coded list: a k byte, a varint count, the gaps at the best k
    ids = sorted(set(toks))
    gaps = [b - a - 1 for a, b in zip([-1] + ids, ids)]
    rice_bits = min(sum(g >> k for g in gaps) + len(gaps) * (1 + k) for k in range(24))
    rows = min(rows, 1 + (1 if len(ids) < 128 else 2) + -(-rice_bits // 8))
    dictionary = rows + min(1 + (bits + 7) // 8, idx_plain + len_plain) < 3 * len(toks) + len_plain
    packed = cfg.payload != "mean" and dictionary and packed
    if cfg.payload == "mean":
        answers = 0
    elif not dictionary:
        answers = 3 * len(toks)
    else:
        answers = rows + (1 + (bits + 7) // 8 if packed else idx_plain)
    vectors = sum(len(p.dirs) for p in protos) * codecs.bytes_per_vector(cfg.dir_precision, H) \
        if cfg.payload != "tokens" else 0
    one_each = all(len(p.anchors) == 1 for p in protos)  # then no anchor_per array
    records = (0 if one_each else J * np.dtype(uint_for(max(len(p.anchors) for p in protos))).itemsize)  # anchor_per
    # anchor_count, unless every prototype's one anchor stands for all of its keys (then counts says it)
    if not (J and one_each and all(int(p.anchor_n[0]) == p.n <= 65535 for p in protos)):
        records += A * np.dtype(uint_for(min(max((int(c) for p in protos for c in p.anchor_n), default=0),
                                             65535))).itemsize
    records += J * np.dtype(uint_for(max((p.n for p in protos), default=0))).itemsize  # counts
    if cfg.payload != "mean" and not packed:
        records += len_plain  # tok_len
    if cfg.relevance:
        records += J  # radius, int8
    meta = encode_meta(manifest)
    head_and_meta = file_bytes.index(meta) + len(meta)  # the manifest ends the header
    padding = len(file_bytes) - head_and_meta - keys - answers - vectors - records
    row = codecs.bytes_per_vector(cfg.key_precision, bank.key_dim)
    centroid = row * sum(int(np.count_nonzero(p.anchor_n > 1)) for p in protos)
    return {"keys": keys, "answers": answers, "vectors": vectors, "framing": head_and_meta + padding + records,
            "head_and_meta": head_and_meta, "padding": padding, "records": records, "centroid": centroid}


CONFIGS = {
    # the synthetic keys (2·H bits) are narrower than the shipped floor: it is lowered so that repair
    # narrows them and the accounts below cover narrowed keys too
    "default": BankConfig(payload="tokens", key_precision="bit", relevance=True, shrink_keys=True, anchor_fold="ward",
                          min_key_bits=32),
    "int8-keys": BankConfig(payload="tokens", key_precision="int8", relevance=False),
    "sequence": BankConfig(payload="sequence", dir_precision="int8", key_precision="float16", tau_d=0.95),
}


#: (config, room above an empty memory): unlimited, anchors folded into centroids, and (default) keys narrowed and
#: answers evicted (in format 2 the budgets 700, 440 and 260 bytes)
CASES = [(name, b) for name in CONFIGS for b in (None, 479, 219)] + [("default", 39)]



@pytest.mark.parametrize("name,room", CASES)
def test_the_parts_add_up_to_the_committed_file_and_match_a_brute_force_count(tmp_path, name, room):
    budget = budget_for(room)
    bank, rec = grown_bank(CONFIGS[name], 60, budget)
    manifest = rec.stored(bank)
    with Store(tmp_path / "m").writer() as w:
        snap = w.commit(bank.to_arrays(), manifest)
    path = tmp_path / "m" / (tmp_path / "m" / "CURRENT").read_text().strip()
    file_bytes = path.read_bytes()
    got = account(Store(tmp_path / "m").read().arrays, manifest)
    want = brute_parts(bank, file_bytes, manifest)
    assert got.total == sum(got.parts.values()) == snap.bytes_on_disk == len(file_bytes) == rec.committed_size(bank)
    if budget is not None:
        assert got.total <= budget
    assert {k: got.parts[k] for k in PARTS} == {k: want[k] for k in PARTS}
    assert got.framing["header"] + got.framing["manifest"] == want["head_and_meta"]
    assert got.framing["padding"] == want["padding"] and 0 <= want["padding"] < 8
    assert sum(v for k, v in got.framing.items() if k not in ("header", "manifest", "padding")) == want["records"]
    assert got.centroid_keys == want["centroid"] <= got.parts["keys"]
    # the shapes-only arrays the budget is checked with give the same account, centroids aside
    shapes = account(bank.to_arrays(shapes_only=True), manifest)
    assert (shapes.total, shapes.parts) == (got.total, got.parts)


@pytest.mark.parametrize("written,writer", [(2, 3), (3, 2)])
def test_a_version_is_accounted_in_its_own_format_whatever_the_writer_writes(tmp_path, monkeypatch, written, writer):
    """A memory committed in one format and read by code that writes the other: the account laid
    out in the version's own format (``Snapshot.format_version``) is the file's bytes; laid out in
    the writer's format it is not (a header of another size), so the format is not ignored."""
    from miita_edge.memory import store_format

    bank, rec = grown_bank(CONFIGS["default"], 60, None)
    manifest = rec.stored(bank)
    monkeypatch.setattr(store_format, "FORMAT_VERSION", written)
    with Store(tmp_path / "m").writer() as w:
        w.commit(bank.to_arrays(), manifest)
    path = tmp_path / "m" / (tmp_path / "m" / "CURRENT").read_text().strip()
    file_bytes = path.read_bytes()
    monkeypatch.setattr(store_format, "FORMAT_VERSION", writer)
    snap = Store(tmp_path / "m").read()
    assert snap.format_version == written
    got = account(snap.arrays, snap.manifest, snap.format_version)
    want = brute_parts(bank, file_bytes, manifest)
    assert got.total == snap.bytes_on_disk == len(file_bytes)
    assert {k: got.parts[k] for k in PARTS} == {k: want[k] for k in PARTS}
    assert got.framing["header"] + got.framing["manifest"] == want["head_and_meta"]
    assert account(snap.arrays, snap.manifest).total != len(file_bytes)


def test_a_layout_in_a_format_without_one_file_is_refused():
    from miita_edge.memory.store_format import encoded_size

    with pytest.raises(ValueError, match="format 1 has no single-file layout"):
        encoded_size({"a": np.zeros(3, np.int8)}, {}, fmt=1)


def test_a_tight_budget_folds_anchors_into_centroids_and_loses_answers():
    """The synthetic banks above do reach the cases the accounting must get right (so the test
    that compares counts is not comparing zeros)."""
    bank, rec = grown_bank(CONFIGS["default"], 60, budget_for(39))
    acc = account(bank.to_arrays(), rec.stored(bank))
    assert acc.centroid_keys > 0 and bank.key_dim < 2 * H and len(bank.protos) < len(ANSWERS)
    bank, rec = grown_bank(CONFIGS["sequence"], 60, None)
    assert len(bank.protos) > len(ANSWERS)  # several prototypes for one answer


@pytest.mark.parametrize("name,room", CASES)
def test_the_coverage_matches_a_direct_count(name, room):
    bank, _ = grown_bank(CONFIGS[name], 60, budget_for(room))
    stream = [tuple(int(t) for t in ANSWERS[i % len(ANSWERS)]) for i in range(60)]
    protos = [tuple(int(t) for t in s) for s in bank.answer_tokens()]
    anchors = [len(p.anchors) for p in bank.protos]
    cov = answer_coverage(protos, anchors, stream)
    distinct = sorted(set(stream))
    direct = {a: (sum(p == a for p in protos), sum(n for p, n in zip(protos, anchors) if p == a)) for a in distinct}
    assert cov.answers == len(distinct) == len(ANSWERS)
    assert cov.per_answer == direct
    kept = [v for v in direct.values() if v[0]]
    assert cov.kept == len(kept) and cov.lost == len(ANSWERS) - len(kept)
    assert cov.protos_max == max(p for p, _ in kept) and cov.anchors_max == max(a for _, a in kept)
    assert cov.protos_mean == pytest.approx(np.mean([p for p, _ in kept]))
    assert cov.anchors_mean == pytest.approx(np.mean([a for _, a in kept]))
    assert cov.foreign == 0 and sum(p for p, _ in cov.per_answer.values()) == len(protos)


def test_coverage_counts_foreign_prototypes_and_refuses_mismatched_lengths():
    cov = answer_coverage(["a", "x", "a"], [2, 1, 3], ["a", "b", "a"])
    assert (cov.answers, cov.kept, cov.lost, cov.foreign) == (2, 1, 1, 1)
    assert cov.per_answer == {"a": (2, 5), "b": (0, 0)}
    assert (cov.protos_mean, cov.protos_max, cov.anchors_mean, cov.anchors_max) == (2.0, 2, 5.0, 5)
    empty = answer_coverage([], [], ["a"])
    assert (empty.kept, empty.protos_mean, empty.anchors_max) == (0, 0.0, 0)
    with pytest.raises(ValueError, match="2 prototype answers but 1 anchor counts"):
        answer_coverage(["a", "b"], [1], ["a"])
