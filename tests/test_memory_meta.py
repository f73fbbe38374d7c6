"""A memory's fields in the store manifest (memory/meta.py): the compact stored form round-trips to
the long form, format 1's long form reads as itself, and whatever cannot be decoded is refused by
the facade's check with one line naming the field."""
from __future__ import annotations

import json

import numpy as np
import pytest

from miita_edge.errors import StoreError
from miita_edge.memory import meta, store_format
from miita_edge.method.presets import default_preset, paper_preset
from miita_edge.method.presets import check_memory_fields as check_memory_meta

SHA = "a5fd3b62230aa5ec60212297dc9d20eaa70578ac519e00d93a17e44c087a6818"
ARRAYS = {"counts": np.zeros(3, np.uint32), "anchor_count": np.zeros(4, np.uint16)}


def fields(**over) -> dict:
    out = {"format": meta.FORMAT_V2, "preset": default_preset().to_json(), "template": "banking77",
           "fingerprint": {"sha256": SHA, "arch": "gemma3", "n_embd": 640, "key_layer": 12, "key_layers": [12, 9]},
           "budget": "1%",
           "stream_bytes": 239055, "examples": 3075, "skipped": 2, "prototypes": 3, "anchors": 4,
           "key_whitened": False}
    out.update(over)
    return out


@pytest.mark.parametrize("over", [{}, {"template": "plain", "budget": "64KiB", "skipped": 0},
                                  {"preset": {"name": "default"},  # version 1, one key layer
                                   "fingerprint": {"sha256": SHA, "arch": "gemma3", "n_embd": 640, "key_layer": 9}},
                                  {"preset": {**paper_preset().to_json(), "eta": 0.25, "bank": {"tau_d": 0.9}}},
                                  {"template": "plain", "key_whitened": True}],
                         ids=["banking77-1%", "defaults-omitted", "default-v1", "preset-overrides", "whitened"])
@pytest.mark.parametrize("fmt", [2, 3])
def test_compact_round_trips(over, fmt, monkeypatch):
    """Whatever format the store writes: every field comes back; the sha256 whole in format 2, its
    first 96 bits (24 hex digits) from format 3."""
    monkeypatch.setattr(store_format, "FORMAT_VERSION", fmt)
    f = fields(**over)
    stored = meta.compact(f)
    assert json.loads(json.dumps(stored)) == stored
    kept = SHA if fmt == 2 else SHA[:24]
    assert meta.expand(stored, ARRAYS) == {**f, "fingerprint": {**f["fingerprint"], "sha256": kept}}
    check_memory_meta("m", meta.expand(stored, ARRAYS))


@pytest.mark.parametrize("over", [{}, {"preset": {"name": "default"},
                                       "fingerprint": {"sha256": SHA, "arch": "gemma3", "n_embd": 640, "key_layer": 9}}],
                         ids=["two-layers", "one-layer"])
def test_format_3_keeps_96_bits_of_the_sha256_and_they_name_the_model(over, monkeypatch):
    """Every field comes back as it was, but the sha256: its first 96 bits, which name the model."""
    monkeypatch.setattr(store_format, "FORMAT_VERSION", 3)
    f = fields(**over)
    stored = meta.compact(f)
    assert stored["f"][0] == "pf07YiMKpexgISKX"  # the whole sha256's first 16 characters
    back = meta.expand(stored, ARRAYS)
    assert back == {**f, "fingerprint": {**f["fingerprint"], "sha256": SHA[:24]}}
    assert meta.same_model(back["fingerprint"], f["fingerprint"])
    check_memory_meta("m", back)
    monkeypatch.setattr(store_format, "FORMAT_VERSION", 2)  # today's writer reads it the same
    assert meta.expand(stored, ARRAYS) == back


@pytest.mark.parametrize("stored_sha,same", [(SHA, True), (SHA[:24], True), (SHA[:23] + "0", False),
                                             ("0" + SHA[1:], False), (SHA[:16], False), (SHA[:25], False),
                                             (None, False)])
def test_same_model_is_the_sha256_prefix_and_every_other_field(stored_sha, same):
    """Brute force over what ``same_model`` is meant to be: the model's sha256 begins with the stored
    one, which is whole or exactly 24 hex digits long, and every other field is equal."""
    model = fields()["fingerprint"]
    stored = {**model, "sha256": stored_sha}
    assert meta.same_model(stored, model) is same
    for key, other in [("arch", "llama"), ("n_embd", 576), ("key_layer", 9), ("key_layers", [12, 8])]:
        assert not meta.same_model({**stored, key: other}, model)
    assert not meta.same_model({k: v for k, v in stored.items() if k != "key_layers"}, model)


@pytest.mark.parametrize("fmt,sha,longest", [(2, "pf07YiMKpexgISKX3J0g6qcFeKxRngDZOhfkTAh6aBg", 150),
                                              (3, "pf07YiMKpexgISKX", 123)])
def test_the_stored_form_is_short(fmt, sha, longest, monkeypatch):
    monkeypatch.setattr(store_format, "FORMAT_VERSION", fmt)
    text = json.dumps(meta.compact(fields()), separators=(",", ":"))
    assert text.startswith('{"m":2,"p":"default/22","t":"banking77","f":["%s","gemma3",640,[12,9]]' % sha)
    assert len(text) <= longest  # two key layers and the preset version cost 6 bytes over one layer
    assert '"k"' not in json.dumps(meta.compact(fields(skipped=0)))  # the omitted value is not stored


def test_format_1_long_form_reads_as_itself():
    v1 = fields(format=meta.FORMAT_V1)
    assert meta.expand(v1, {}) == v1
    check_memory_meta("m", v1)


def test_a_sha256_that_is_not_hex_is_a_programming_error():
    with pytest.raises(ValueError, match="64 lowercase hex"):
        meta.compact(fields(fingerprint={"sha256": "abc", "arch": "x", "n_embd": 1, "key_layer": 0}))


@pytest.mark.parametrize("stored,needle", [
    ({"m": 3}, "unknown memory format 3 (written by a newer miita-edge; upgrade)"),
    ({"m": "2"}, "unknown memory format"),
    ({"kind": "plain store"}, "unknown memory format"),
    ([1, 2], "unknown memory format"),
    ({"m": 2, "p": "default", "f": ["short", "gemma3", 640, 9], "s": 1, "e": 1}, "fingerprint"),
    ({"m": 2, "p": "default", "f": ["pf07YiMKpexgISKX3J0g6qcFeKxRngDZOhfkTAh6aBg", "gemma3", 640], "s": 1, "e": 1},
     "fingerprint"),
    ({"m": 2, "p": 7, "f": ["pf07YiMKpexgISKX3J0g6qcFeKxRngDZOhfkTAh6aBg", "gemma3", 640, 9], "s": 1, "e": 1}, "preset"),
    ({"m": 2, "p": "default", "f": ["pf07YiMKpexgISKX3J0g6qcFeKxRngDZOhfkTAh6aBg", "gemma3", 640, 9], "e": 1},
     "stream_bytes"),
    ({"m": 2, "p": "nope", "f": ["pf07YiMKpexgISKX3J0g6qcFeKxRngDZOhfkTAh6aBg", "gemma3", 640, 9], "s": 1, "e": 1},
     "unknown preset"),
], ids=["newer", "m-string", "not-a-memory", "not-a-dict", "short-sha", "short-fingerprint", "preset-type",
        "no-stream", "unknown-preset"])
def test_undecodable_fields_are_one_line_errors(stored, needle):
    with pytest.raises(StoreError) as info:
        check_memory_meta("MEM", meta.expand(stored, ARRAYS))
    assert needle in str(info.value) and "MEM" in str(info.value) and "\n" not in str(info.value)


def test_counts_come_from_the_arrays():
    f = meta.expand(meta.compact(fields()), {"counts": np.zeros(7), "anchor_count": np.zeros(11)})
    assert (f["prototypes"], f["anchors"]) == (7, 11)
    with pytest.raises(StoreError, match="prototypes"):
        check_memory_meta("m", meta.expand(meta.compact(fields()), {}))


def test_a_format_3_memory_s_fields_compact_again(monkeypatch):
    """expand() of a format-3 memory holds 24 hex digits of the sha256: compact() takes them back (what
    a caller that edits a field and commits again does), and refuses them for format 2, which needs 256 bits."""
    monkeypatch.setattr(store_format, "FORMAT_VERSION", 3)
    f = fields()
    back = meta.expand(meta.compact(f), ARRAYS)
    assert back["fingerprint"]["sha256"] == SHA[:24]
    assert meta.compact(back) == meta.compact(f)
    with pytest.raises(ValueError, match="64 lowercase hex"):
        meta.compact(fields(fingerprint={**f["fingerprint"], "sha256": SHA[:23]}))
    monkeypatch.setattr(store_format, "FORMAT_VERSION", 2)
    with pytest.raises(ValueError, match="store format 2 needs all 256"):
        meta.compact(back)
