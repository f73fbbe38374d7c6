"""Presets: today's default written once, and every earlier version readable as data.

The reference is ``tests/data/preset_versions.json``: every (name, version) a memory may record,
with all of its settings, as the code that defined each version as a function gave them before
the versions became data. A memory built at version N must open with exactly those settings.
"""
from __future__ import annotations

import json
from dataclasses import asdict, fields
from pathlib import Path

import pytest

from miita_edge.errors import InputError, StoreError
from miita_edge.method.presets import PAST_VERSIONS, Preset, default_preset, get_preset, paper_preset, preset_names, \
    preset_version

ARCHIVE = json.loads((Path(__file__).parent / "data" / "preset_versions.json").read_text("utf-8"))


def _plain(o):
    if isinstance(o, tuple):
        return list(o)
    if isinstance(o, dict):
        return {k: _plain(v) for k, v in o.items()}
    return o


@pytest.mark.parametrize("key", sorted(ARCHIVE))
def test_every_archived_version_is_rebuilt_setting_for_setting(key):
    """Every archived setting as archived; a setting added since sits at its field default, which
    is what every earlier memory did (a new mechanism starts switched off)."""
    name, _, version = key.partition("@")
    got = _plain(asdict(preset_version(name, int(version))))
    assert {k: v for k, v in got.items() if k in ARCHIVE[key]} == ARCHIVE[key]
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
