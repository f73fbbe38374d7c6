"""The default preset with one mechanism switched off: what the ablation (``bench/ablation.py``)
compares against the default, query by query, on dev rows.

Each entry names a mechanism of the default, where it can act (so a run is spent only where the
switch can change an answer: a mechanism that reads replies never acts on a memory of labels), and
what the preset falls back to without it. A fallback is the setting the preset had before the
mechanism existed, so "without X" is the default as it would be had X never been added.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

from ..errors import InputError
from ..method.presets import Preset, default_preset, preset_version
from ..runtime.engine import DEFAULT_KEY_DEPTHS

__all__ = ["CANDIDATES", "MECHANISMS", "Mechanism", "with_candidate", "without"]


@dataclass(frozen=True)
class Mechanism:
    name: str
    acts_on: str  # "all", "labels" or "replies" (answers of 16 tokens or more), "repair" (acts only where a byte budget makes repair run)
    off: Callable[[Preset], None]  # switches it off in place (a candidate's: on)
    what: str


def _steer_rows(p: Preset) -> None:
    old = preset_version("default", 4)  # the last version that steered along unit head rows
    p.direction, p.eta_unit, p.eta, p.gate = old.direction, old.eta_unit, old.eta, old.gate


def _depth_layers(p: Preset) -> None:
    p.key_select, p.key_depths = "depths", DEFAULT_KEY_DEPTHS


def _no_gate(p: Preset) -> None:
    p.relevance_gate, p.null_gate = False, False


def _set(**kw) -> Callable[[Preset], None]:
    def off(p: Preset) -> None:
        for k, v in kw.items():
            setattr(p, k, v)
    return off


def _bank(**kw) -> Callable[[Preset], None]:
    def off(p: Preset) -> None:
        for k, v in kw.items():
            setattr(p.bank, k, v)
    return off


MECHANISMS: dict[str, Mechanism] = {m.name: m for m in (
    Mechanism("centroid-vote", "all", _set(centroid_vote=False), "the vote reads anchors only, not each answer's centroid"),
    Mechanism("generic-null", "all", _set(null_gate=False), "the relevance gate without the generic-question null"),
    Mechanism("relevance-gate", "all", _no_gate, "no relevance gate at all: every query is steered by its vote"),
    Mechanism("head-direction", "all", _steer_rows,
              "steer along unit head rows at 0.3 of the hidden norm, gated (the default's steering before the "
              "head geometry and the measured push)"),
    Mechanism("measured-layers", "all", _depth_layers,
              "key layers at 2/3 and 1/2 of the depth instead of the two measured on the model"),
    Mechanism("hold", "replies", _set(hold_min_tokens=0), "no hold: a token no steering answer has ends the steering"),
    Mechanism("whitening", "replies", _set(key_whitening="none"), "reply memories keep unwhitened keys"),
    Mechanism("ward-fold", "repair", _bank(anchor_fold="closest"), "repair folds the closest anchor pair"),
    Mechanism("narrowing", "repair", _bank(shrink_keys=False), "repair evicts answers without narrowing keys first"),
    Mechanism("rival-narrowing", "repair", _bank(narrow_rule="prefix"),
              "narrowing drops the frame's last coordinates (a narrowed key is its prefix), not those that tell "
              "answers from their nearest rivals least, and keeps no shared bits"),
    Mechanism("paraphrase-reach", "all", _set(single_reach="repeat"),
              "an answer taught once steers only on an exact repeat, not as far as the model's paraphrases come"),
    Mechanism("heldout-reach", "replies", _set(single_reach="paraphrase"),
              "in a whitened memory, how far an answer taught once reaches is measured on the paraphrase groups "
              "its whitening was fitted on (in sample)"),
    Mechanism("abstain", "all", _set(abstain=False),
              "where the nearest retrieved answer is not trusted, the vote goes to the other retrieved answers"),
    Mechanism("reach-margin", "all", _set(reach_margin=0.0),
              "an answer the paraphrase reach alone trusts steers however near another retrieved answer comes"),
    Mechanism("key-folded", "all", _set(key_prompt="memory"),
              "keys pooled from the input as typed: another case or doubled spaces make another key"),
    Mechanism("verify-reach", "all", _bank(evidence=False),
              "no answer keeps its taught input, so the model never checks an answer the paraphrase reach alone "
              "trusts against the nearest answers' inputs"),
    Mechanism("read-answers", "all", _set(answer_reading=0.0),
              "the vote's weights are the keys' alone: the model does not read the leading answers"),
    Mechanism("read-reach", "all", _set(read_reach=0.0),
              "the key's paraphrase reach, not the model's reading, decides whether an answer taught once that "
              "keeps its taught input steers (version 18's gate)"),
    Mechanism("read-twice", "all", _bank(evidence_inputs=1),
              "an answer taught by a second input lets its evidence go, and its radius, not the model's reading, "
              "judges it (version 19)"),
    Mechanism("key-meaning", "all", _set(key_prompt="folded"),
              "keys pooled from the memory's own prompt with the input folded (versions 16-20), not from a prompt "
              "that asks for the input's meaning in one word"),
    Mechanism("narrow-floor-64", "repair", _bank(min_key_bits=96),
              "repair narrows keys to 96 bits at the least (versions 13-21), not to 64, before it merges or evicts "
              "an answer"),
)}


#: Mechanisms not (yet) in the default, measured the same way before any is adopted: the default
#: with each one switched on (``miita-default-with-NAME``).
CANDIDATES: dict[str, Mechanism] = {m.name: m for m in (
    Mechanism("key-canonical", "all", _set(key_prompt="canonical"),
              "keys pooled from the memory's own prompt with the input in canonical form (case, end mark and "
              "spacing folded), in a key pass of their own; the answer's prompt keeps the text as typed"),
    Mechanism("general-axes", "all", _set(key_axes="general"),
              "keys rotated onto the principal axes of the model's general prompts before their bits are kept"),
    Mechanism("reach-every", "all", _set(reach_every=True),
              "the paraphrase reach also trusts an answer taught more than once, beside its radius test"),
    Mechanism("alpha-gate", "all", _set(gate="gated"),
              "the paper's activation gate: each step's addition scaled by alpha_t = max(0, cos(h_t, h_q))"),
    Mechanism("float-gate", "all", _set(gate_query="float"),
              "the gate's general-question tests score the float query against stored bits, as the vote does"),
    Mechanism("float-gate-axes", "all", _set(gate_query="float", key_axes="general"),
              "float-gate with the keys rotated onto the general prompts' axes (general-axes)"),
    Mechanism("leading-axes", "all", _set(key_axes="leading"),
              "the general prompts' axes' bits stored before all the key's coordinates (narrow keys keep the axes)"),
    Mechanism("float-gate-leading", "all", _set(gate_query="float", key_axes="leading"),
              "float-gate with leading-axes"),
    Mechanism("narrowed-axes", "all", _set(key_axes="narrowed"),
              "keys keep their coordinates at full width and move to leading-axes once repair narrows them"),
    Mechanism("float-gate-narrowed", "all", _set(gate_query="float", key_axes="narrowed"),
              "float-gate with narrowed-axes"),
    Mechanism("contested-reach", "all", _set(reach_contested=True),
              "the paraphrase reach does not trust an answer taught once whose example has another answer's "
              "example as near as a paraphrase comes"),
    Mechanism("narrowed-unit", "all", _set(key_axes="narrowed", key_axes_scale="unit"),
              "narrowed-axes with every row of the axes' frame at one size over the general prompts, so no "
              "stored bit outweighs another in the vote"),
    Mechanism("float-gate-narrowed-unit", "all",
              _set(gate_query="float", key_axes="narrowed", key_axes_scale="unit"),
              "float-gate with narrowed-unit"),
    Mechanism("balanced-bits", "repair", _bank(narrow_rule="balanced"),
              "narrowing drops the coordinates whose bits the memory's answers share most, not the frame's last "
              "ones, and stores which it kept"),
    Mechanism("balanced-shared", "repair", _bank(narrow_rule="balanced-shared"),
              "balanced-bits, and each dropped coordinate among the frame's first 128 stays in every key as one "
              "bit the memory stores once (the answers' majority sign), for the relevance gate"),
)}


def with_candidate(name: str) -> Preset:
    """The default preset with candidate mechanism ``name`` switched on."""
    if name not in CANDIDATES:
        raise InputError(f"unknown candidate {name!r}; known: {', '.join(CANDIDATES)}")
    p = default_preset()
    CANDIDATES[name].off(p)
    p.validate_keys()
    return p


def without(name: str) -> Preset:
    """The default preset with mechanism ``name`` switched off (validated like a stored preset)."""
    if name not in MECHANISMS:
        raise InputError(f"unknown mechanism {name!r}; known: {', '.join(MECHANISMS)}")
    p = default_preset()
    MECHANISMS[name].off(p)
    p.bank.validate()
    p.retrieval.validate()
    p.validate_keys()
    return p
