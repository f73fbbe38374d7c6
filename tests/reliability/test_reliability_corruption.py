"""Short run of the corruption campaign (tests/reliability/reliability_corruption.py; figures in docs/reliability.md),
and regression tests for what the full campaign found."""
from __future__ import annotations

import json

import numpy as np
import pytest

import reliability_corruption as campaign  # tests/reliability/reliability_corruption.py


def test_short_campaign_has_no_crash_and_no_silent_acceptance(tmp_path):
    r = campaign.campaign(300, seed=3, work=tmp_path, with_model=False, model_sample=0, progress=False)
    assert not r["failures"], r["failures"][:10]
    total = sum(t["count"] for t in r["table"].values())
    rejected = sum(t["store rejected"] for t in r["table"].values())
    assert total == 300 and rejected > 180  # the mutations really damaged the stores
    assert r["table"]["legacy-v1"]["count"] > 0  # the format-1 reader is exercised too
    assert sum(t["forged"] for t in r["table"].values()) > 60


def test_the_checker_flags_a_silent_acceptance_and_a_crash(tmp_path):
    """A reader that skipped the CRC check would be caught: feed the classifier such a result."""
    assert campaign.failures_of({"store": "accepted", "silent": True, "consistent": False}) == [
        "silent acceptance of changed array bytes"]
    assert campaign.failures_of({"store": "accepted", "silent": True, "consistent": True}) == []
    assert campaign.failures_of({"store": "CRASH KeyError: 'x'", "info": "rejected"}) == ["store: CRASH KeyError: 'x'"]
    # a format-2 manifest is inside the CRC: accepting a damaged one is a failure (format 1: reported only)
    assert campaign.failures_of({"store": "accepted", "meta_changed": True, "consistent": False, "v2": True}) == [
        "silent acceptance of a changed manifest"]
    assert campaign.failures_of({"store": "accepted", "meta_changed": True, "consistent": False, "v2": False}) == []
    # and open_all_ways itself reports changed bytes when the store lets them through
    from miita_edge.memory.store import Store

    d = tmp_path / "s"
    with Store(d).writer() as w:
        w.commit({"a": np.arange(4, dtype=np.int32)}, {"k": 1})
    base = campaign._normalise(json.loads(json.dumps(campaign.base_content(d), default=campaign.encode_base),
                                       object_hook=campaign.decode_base))
    assert campaign.open_all_ways(d, base)["silent"] is False
    base["arrays"]["a"] = (base["arrays"]["a"][0], base["arrays"]["a"][1], b"\x00" * 16)
    assert campaign.open_all_ways(d, base)["silent"] is True


def test_deeply_nested_manifest_is_a_store_error(tmp_path):
    """Found by the campaign (format 1): json.loads raised RecursionError, a traceback instead of
    one line. Format 2 keeps the guard: a deep meta laid out as a valid file (CRC recomputed)."""
    from miita_edge.errors import StoreError
    from miita_edge.memory.store import Store

    d = tmp_path / "s"
    with Store(d).writer() as w:
        w.commit({"a": np.zeros(2)}, {"k": 1})
    vfile = d / (d / "CURRENT").read_text().strip()
    doc = campaign.split_v2(vfile.read_bytes())
    doc["meta"] = b"[" * 100000 + b"]" * 100000
    vfile.write_bytes(campaign.build_v2(doc))
    with pytest.raises(StoreError, match="not valid JSON"):
        Store(d).read()


@pytest.mark.parametrize("meta", [{"kind": "not a memory"}, {"format": "miita-edge-memory/1"},
                                  {"format": "miita-edge-memory/1", "stream_bytes": -1}])
def test_info_on_a_store_that_is_not_a_memory_is_one_line(tmp_path, capsys, meta):
    """Found by the campaign: `miita-edge info` on a store whose manifest lacks the memory's fields
    raised KeyError('budget')."""
    from miita_edge.cli import main
    from miita_edge.memory.store import Store

    d = tmp_path / "s"
    with Store(d).writer() as w:
        w.commit({"a": np.zeros(2)}, meta)
    rc = main(["info", "--memory", str(d)])
    err = capsys.readouterr().err.strip().splitlines()
    assert rc == 2 and len(err) == 1 and str(d) in err[0], err


@pytest.mark.parametrize("edit", ["drop-entry", "empty-arrays"])
def test_a_header_that_lost_an_array_entry_is_refused(tmp_path, edit):
    """Found by the campaign (format 1): deleting an array's entry from manifest.json made the store
    return the other arrays without a word. Format 2: a header that lists fewer arrays than the
    file holds leaves payload bytes over, and the file is refused as oversized (CRC recomputed)."""
    from miita_edge.errors import StoreError
    from miita_edge.memory.store import Store

    d = tmp_path / "s"
    with Store(d).writer() as w:
        w.commit({"a": np.zeros(2), "b": np.ones(3)}, {"k": 1})
    vfile = d / (d / "CURRENT").read_text().strip()
    raw = vfile.read_bytes()
    doc = campaign.split_v2(raw)
    doc["arrays"] = doc["arrays"][:1] if edit == "drop-entry" else []
    body = campaign.build_v2(doc)
    vfile.write_bytes(campaign.fix_crc(body + bytes(len(raw) - len(body))))
    with pytest.raises(StoreError, match="oversized"):
        Store(d).read()


@pytest.mark.parametrize("tokens,needle", [(np.arange(12, dtype=np.int32).reshape(6, 2), "one dimension"),
                                           (np.array([5, -1, -17772, 7, -1, 9, -1], np.int32), "negative token id")],
                         ids=["2-d", "negative"])
def test_a_forged_tokens_array_is_refused_by_the_bank(tokens, needle):
    """Found by the format-2 campaign: stores forged with a recomputed CRC are valid stores, and a
    tokens array of rank 2 (TypeError) or with a negative id (RuntimeError from the LM-head kernel)
    crashed ``ask``. The bank now refuses them, which ``Miita`` reports as inconsistent arrays."""
    from miita_edge.memory.bank import BankConfig, MemoryBank

    arrays = {"anchors": np.zeros((3, 80), np.uint8), "anchor_owner": np.arange(3, dtype=np.uint16),
              "anchor_count": np.ones(3, np.uint16), "counts": np.ones(3, np.uint32), "tokens": tokens}
    with pytest.raises(ValueError, match=needle):
        MemoryBank.from_arrays(BankConfig(payload="tokens", key_precision="bit"), 640, arrays)


@pytest.mark.model
@pytest.mark.parametrize("edit,needle", [("huge", "outside the model's vocabulary"), ("2-d", "one dimension")])
def test_a_memory_with_a_forged_tokens_array_is_a_one_line_error(tmp_path, edit, needle):
    import shutil
    from pathlib import Path

    from miita_edge.errors import StoreError
    from miita_edge.memory.store import Store
    from miita_edge.miita import Miita
    from miita_edge.runtime.engine import EngineConfig

    d = tmp_path / "m"
    shutil.copytree(Path(__file__).resolve().parents[1] / "data" / "store_v1" / "memory", d)
    snap = Store(d).read()
    arrays = {k: np.array(v) for k, v in snap.arrays.items()}
    tokens = arrays["tokens"].copy()
    if edit == "huge":
        tokens[0] = 10**9
    else:
        tokens = tokens.reshape(-1, 1)
    arrays["tokens"] = tokens
    with Store(d).writer() as w:
        w.commit(arrays, snap.manifest)  # a valid store: checksum and all
    with pytest.raises(StoreError, match=needle) as info:
        Miita(memory=d, engine_config=EngineConfig(n_threads=1))
    assert "\n" not in str(info.value) and "inconsistent arrays" in str(info.value)


@pytest.mark.parametrize("precision,name,bad", [("bit", "anchors", np.int16), ("int8", "anchors", np.uint8),
                                                ("float32", "dirs", np.float16)])
def test_an_array_forged_with_another_dtype_is_refused_by_the_bank(precision, name, bad):
    """Found by the format-2 campaign (seed 1): anchors rewritten as int16 of the right shape (header
    updated, CRC recomputed) passed every shape check and crashed ``ask`` in the 1-bit scan
    kernel (TypeError). The bank now checks each array's stored dtype against its precision."""
    from miita_edge.memory import codecs
    from miita_edge.memory.bank import BankConfig, MemoryBank

    H, rng = 64, np.random.default_rng(0)
    cfg = BankConfig(payload="mean", key_precision=precision if name == "anchors" else "float32",
                     dir_precision=precision if name == "dirs" else "float32")
    keys, dirs = codecs.encode(rng.standard_normal((3, H)), cfg.key_precision), \
        codecs.encode(rng.standard_normal((3, H)), cfg.dir_precision)
    arrays = {"anchors": keys["data"], "anchor_owner": np.arange(3, dtype=np.uint16),
              "anchor_count": np.ones(3, np.uint16), "counts": np.ones(3, np.uint32), "dirs": dirs["data"]}
    if "scale" in keys:
        arrays["anchor_scale"] = keys["scale"]
    MemoryBank.from_arrays(cfg, H, dict(arrays)).counts()  # the well-formed arrays open
    arrays[name] = arrays[name].astype(bad)
    with pytest.raises(ValueError, match=f"{name} array has dtype {np.dtype(bad)}"):
        MemoryBank.from_arrays(cfg, H, arrays).counts()
