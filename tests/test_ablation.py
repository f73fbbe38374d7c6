"""The ablation's variants: each is the default with exactly its mechanism switched off, and each
is a method of ``miita-edge bench``."""
from __future__ import annotations

from dataclasses import asdict

import pytest

from miita_edge.errors import InputError
from miita_edge.evaluation.ablation import MECHANISMS, without
from miita_edge.evaluation.registry import get_method
from miita_edge.method.presets import default_preset


def _changed(a: dict, b: dict, prefix: str = "") -> set[str]:
    out = set()
    for k in a:
        if isinstance(a[k], dict):
            out |= _changed(a[k], b[k], f"{k}.")
        elif a[k] != b[k]:
            out.add(prefix + k)
    return out


EXPECTED = {
    "centroid-vote": {"centroid_vote"}, "generic-null": {"null_gate"},
    "relevance-gate": {"relevance_gate", "null_gate"},
    "head-direction": {"direction", "eta_unit", "eta", "gate"}, "measured-layers": {"key_select"},
    "hold": {"hold_min_tokens"}, "whitening": {"key_whitening"},
    "ward-fold": {"bank.anchor_fold"}, "narrowing": {"bank.shrink_keys"}, "rival-narrowing": {"bank.narrow_rule"},
    "paraphrase-reach": {"single_reach"}, "heldout-reach": {"single_reach"}, "abstain": {"abstain"},
    "reach-margin": {"reach_margin"}, "key-folded": {"key_prompt"}, "verify-reach": {"bank.evidence"}, "read-answers": {"answer_reading"}, "read-reach": {"read_reach"}, "read-twice": {"bank.evidence_inputs"},
    "key-meaning": {"key_prompt"}, "narrow-floor-64": {"bank.min_key_bits"},
}


@pytest.mark.parametrize("name", sorted(MECHANISMS))
def test_each_variant_switches_off_its_own_fields_and_nothing_else(name):
    assert _changed(asdict(default_preset()), asdict(without(name))) == EXPECTED[name]


def test_every_mechanism_has_an_expectation_and_a_bench_method():
    assert set(MECHANISMS) == set(EXPECTED)
    for name in MECHANISMS:
        assert get_method(f"miita-default-without-{name}").factory()._preset() is not None


def test_an_unknown_mechanism_is_one_line():
    with pytest.raises(InputError, match="unknown mechanism 'gate'"):
        without("gate")


def test_each_candidate_switches_on_its_own_fields_and_is_a_bench_method():
    from miita_edge.evaluation.ablation import CANDIDATES, with_candidate

    want = {"general-axes": {"key_axes"}, "reach-every": {"reach_every"}, "alpha-gate": {"gate"},
            "float-gate": {"gate_query"}, "float-gate-axes": {"gate_query", "key_axes"},
            "leading-axes": {"key_axes"}, "float-gate-leading": {"gate_query", "key_axes"},
            "narrowed-axes": {"key_axes"}, "float-gate-narrowed": {"gate_query", "key_axes"},
            "narrowed-unit": {"key_axes", "key_axes_scale"},
            "float-gate-narrowed-unit": {"gate_query", "key_axes", "key_axes_scale"},
            "contested-reach": {"reach_contested"}, "balanced-bits": {"bank.narrow_rule"},
            "balanced-shared": {"bank.narrow_rule"}, "key-canonical": {"key_prompt"}}
    assert set(CANDIDATES) == set(want)
    for name, fields in want.items():
        assert _changed(asdict(default_preset()), asdict(with_candidate(name))) == fields
        assert get_method(f"miita-default-with-{name}").factory()._preset() is not None
