"""Presets: today's default written once, and every earlier version readable as data.

The reference is ``tests/data/preset_versions.json``: every (name, version) a memory may record,
with all of its settings, as the code that defined each version as a function gave them before
the versions became data. A memory built at version N must open with exactly those settings,
less the fields of mechanisms the method no longer has (``RETIRED_FIELDS``), which it ignores.
"""
from __future__ import annotations

import json
from dataclasses import asdict, fields
from pathlib import Path

import pytest

from miita_edge.errors import InputError, StoreError
from miita_edge.memory.prototype import BankConfig
from miita_edge.method.presets import PAST_VERSIONS, RETIRED_FIELDS, Preset, default_preset, get_preset, paper_preset, \
    preset_names, preset_version

ARCHIVE = json.loads((Path(__file__).parent / "data" / "preset_versions.json").read_text("utf-8"))
CURRENT = {f.name for f in fields(Preset)}


def _plain(o):
    if isinstance(o, tuple):
        return list(o)
    if isinstance(o, dict):
        return {k: _plain(v) for k, v in o.items()}
    return o


@pytest.mark.parametrize("key", sorted(ARCHIVE))
def test_every_archived_version_is_rebuilt_setting_for_setting(key):
    """Every archived setting that ``Preset`` still has, as archived; a setting added since sits at
    its field default, which is what every earlier memory did (a new mechanism starts switched off).
    Every other archived setting belongs to a retired mechanism."""
    name, _, version = key.partition("@")
    got = _plain(asdict(preset_version(name, int(version))))
    assert set(ARCHIVE[key]) - CURRENT <= set(RETIRED_FIELDS)
    # a bank setting added since sits at its BankConfig default, likewise
    bank_defaults = {f.name: f.default for f in fields(BankConfig)}
    assert {k: v for k, v in got["bank"].items() if k not in ARCHIVE[key]["bank"]} == \
        {k: bank_defaults[k] for k in got["bank"] if k not in ARCHIVE[key]["bank"]}
    got["bank"] = {k: v for k, v in got["bank"].items() if k in ARCHIVE[key]["bank"]}
    assert {k: v for k, v in got.items() if k in ARCHIVE[key]} == \
        {k: v for k, v in ARCHIVE[key].items() if k in CURRENT}
    defaults = {f.name: f.default for f in fields(Preset)}
    assert {k: v for k, v in got.items() if k not in ARCHIVE[key]} == \
        {k: defaults[k] for k in got if k not in ARCHIVE[key]}


def test_the_archive_covers_every_version_and_nothing_else():
    known = {f"{n}@{v}" for n, v in PAST_VERSIONS} | {f"{n}@{get_preset(n).version}" for n in preset_names()}
    assert known == set(ARCHIVE)


@pytest.mark.parametrize("key", sorted(ARCHIVE))
def test_a_stored_preset_round_trips_through_its_manifest_form(key):
    name, _, version = key.partition("@")
    p = preset_version(name, int(version))
    assert asdict(Preset.from_json(json.loads(json.dumps(p.to_json())))) == asdict(p)


def test_users_choose_a_name_and_get_todays_version():
    assert preset_names() == ["paper", "default"]
    assert asdict(get_preset("default")) == asdict(default_preset())
    assert asdict(get_preset("paper")) == asdict(paper_preset())
    with pytest.raises(InputError, match="unknown preset 'default@11'"):
        get_preset("default@11")


def test_a_version_newer_than_this_code_is_refused_in_one_line():
    with pytest.raises(StoreError, match="newer than this miita-edge knows"):
        Preset.from_json({"name": "default", "version": default_preset().version + 1})
    with pytest.raises(InputError, match="version 99"):
        preset_version("paper", 99)


def test_retired_fields_are_no_field_of_a_preset_and_each_says_why():
    assert RETIRED_FIELDS and not set(RETIRED_FIELDS) & CURRENT
    assert all(isinstance(why, str) and len(why) > 20 for why in RETIRED_FIELDS.values())
    # every retired field was archived by some version: the list names real fields, not typos
    assert set(RETIRED_FIELDS) <= set().union(*ARCHIVE.values())


@pytest.mark.parametrize("key", sorted(ARCHIVE))
def test_a_manifest_that_records_retired_fields_reads_as_the_preset_without_them(key):
    """A memory built while a retired mechanism existed may record its fields (its preset differed
    from the named one there, or a caller set them): they are ignored, whatever their value."""
    name, _, version = key.partition("@")
    p = preset_version(name, int(version))
    stored = {**p.to_json(), **{k: ARCHIVE[key][k] for k in RETIRED_FIELDS if k in ARCHIVE[key]},
              "rerank_lambda": 0.7, "rerank_score": "no longer checked"}
    got = Preset.from_json(json.loads(json.dumps(stored)))
    assert asdict(got) == asdict(p)
    assert not set(RETIRED_FIELDS) & set(vars(got)) and not set(RETIRED_FIELDS) & set(got.to_json())


@pytest.mark.model
def test_a_stored_memory_whose_preset_records_retired_fields_opens_and_answers_as_before(engine, tmp_path):
    """A committed memory whose manifest's preset carries retired fields (as one built by the
    ablation's "without rerank" variant did) opens, answers as the same memory without them, and
    its next commit no longer records them."""
    import numpy as np

    from miita_edge import Example, Miita
    from miita_edge.memory.meta import compact, expand
    from miita_edge.memory.store import Store

    mem = tmp_path / "mem"
    with Miita(engine=engine, memory=mem, template="plain") as m:
        m.ingest([Example("how do I change my PIN?", "Open the app and choose Card, then PIN."),
                  Example("where is my new card?", "card arrival")], budget="none", progress=False)
        before = m.ask("how can I change my PIN", max_tokens=8)
    st = Store(mem)
    with st.writer() as w:
        snap = st.read()
        arrays = {k: np.array(v) for k, v in snap.arrays.items()}
        long = expand(snap.manifest, snap.arrays)
        long["preset"] = {**long["preset"], "rerank_lambda": 0.0, "rerank_top": 3, "rerank_min_tokens": 16,
                          "rerank_score": "channel"}
        w.commit(arrays, compact(long))
    snap = st.read()
    assert "rerank_lambda" in expand(snap.manifest, snap.arrays)["preset"]  # what the memory now records
    with Miita(engine=engine, memory=mem, template="plain") as m:
        assert asdict(m.preset) == asdict(default_preset())
        again = m.ask("how can I change my PIN", max_tokens=8)
        assert (again.text, again.prototypes, again.weights) == (before.text, before.prototypes, before.weights)
        m.ingest([Example("I want a new PIN", "Open the app and choose Card, then PIN.")], budget="none",
                 progress=False)
    snap = Store(mem).read()
    assert not set(RETIRED_FIELDS) & set(expand(snap.manifest, snap.arrays)["preset"])
