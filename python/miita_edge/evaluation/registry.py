"""The method registry: every method ``miita-edge bench --method`` knows, by name.

It sits above ``methods.py`` and ``baselines.py`` so that neither imports the other's registry.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

from ..errors import InputError
from . import baselines
from .ablation import CANDIDATES, MECHANISMS, with_candidate, without
from .baselines import ExampleMem
from .methods import Frozen, LabelVote, Method, MiitaMethod
from .prompted import FrozenLabels, SummaryMem

__all__ = ["METHODS", "MethodInfo", "get_method", "register_method"]


@dataclass(frozen=True)
class MethodInfo:
    name: str
    factory: Callable[[], Method]
    description: str
    alias_of: str | None = None


METHODS: dict[str, MethodInfo] = {}


def register_method(name: str, factory: Callable[[], Method], description: str, alias_of: str | None = None) -> None:
    METHODS[name] = MethodInfo(name, factory, description, alias_of)


def get_method(name: str) -> MethodInfo:
    """A registered method, or ``miita-default@N`` / ``miita-paper@N``: that preset as it was at
    version N, so a cell archived under an older version can be run again on today's machine and
    compared query by query (a version's effect apart from the machine's)."""
    if name in METHODS:
        return METHODS[name]
    base, at, version = name.partition("@")
    if at and base in _PINNABLE:
        from ..method.presets import preset_version

        if not (version.isdigit() and version[0] != "0"):
            raise InputError(f"method {name!r}: the version after '@' must be a whole number >= 1")
        v = int(version)
        try:
            preset_version(_PINNABLE[base], v)
        except InputError:
            raise InputError(f"method {name!r}: preset {_PINNABLE[base]!r} has no version {v}") from None
        return MethodInfo(name, lambda: MiitaMethod(lambda: preset_version(_PINNABLE[base], v),
                                                    oracle_alignment=base == "miita-paper"),
                          f"{METHODS[base].description}, at preset version {v}")
    raise InputError(f"unknown method {name!r}; known: {', '.join(METHODS)}, or miita-default@N / miita-paper@N "
                     "(a preset's version N)")


#: Methods whose preset can be pinned to an earlier version with ``@N``, and their preset's name.
_PINNABLE = {"miita-default": "default", "miita-paper": "paper"}


def _dense_preset():
    from ..method.presets import default_preset, preset_version

    p = default_preset()
    p.bank.payload = "sequence"
    # A stored direction is a unit vector in the hidden space (the paper's Norm(W^T(e_y - p))),
    # not a head-geometry direction in logits: it steers as the row directions did (version 4 of
    # the default, the last to steer along unit rows: eta 0.3 of the query's hidden norm). Left
    # at "head", the push would scale unit vectors as if they were logit directions, and the
    # memory's preset would not validate when it is opened again.
    p.direction, p.eta_unit, p.eta = "row", "hidden", preset_version("default", 4).eta
    # Its directions are read from the pass that pools the key, so the key is that of the prompt as typed.
    p.key_prompt = "memory"
    p.bank.validate()
    p.validate_keys()
    return p


def _whitened_preset():
    from ..method.presets import default_preset

    p = default_preset()
    p.key_whitening = "paraphrase"
    p.validate_keys()
    return p


def _baseline(name: str) -> Method:
    return getattr(baselines, name)()


def _register_builtins() -> None:
    reg = register_method
    reg("frozen", Frozen, "the model alone, no memory")
    reg("frozen-labels", FrozenLabels, "classification only: the model alone, its prompt listing the query's stage's "
        "label set (meta.json), no memory; FWT against it separates the answer format from the task")
    reg("miita-default", lambda: MiitaMethod("default"),
        "MIITA, default preset (1-bit keys, per-position target tokens, prefix-consistent anchor vote)")
    reg("token-mem", lambda: MiitaMethod("default"),
        "alias of miita-default: the default preset already stores target tokens only (3 bytes each) "
        "and takes each token's direction from the model's head",
        alias_of="miita-default")
    reg("miita-dense", lambda: MiitaMethod(_dense_preset),
        "default preset with the full per-position correction directions stored (payload 'sequence'), "
        "steered as unit rows (eta 0.3 of the hidden norm)")
    reg("miita-whitened", lambda: MiitaMethod(_whitened_preset),
        "default preset with keys whitened against paraphrase noise (method/key_whitening.py)")
    reg("miita-ungated", lambda: MiitaMethod("default", gate="ungated"), "default preset, gate ablation (alpha_t = 1)")
    reg("miita-paper", lambda: MiitaMethod("paper", oracle_alignment=True),
        "MIITA as published (paper preset, SemUncRet); reports Oracle Alignment")
    reg("miita-paper-ungated", lambda: MiitaMethod("paper", gate="ungated"), "paper preset, gate ablation (alpha_t = 1)")
    for mode in ("random", "semantic", "uncertainty", "oracle"):
        reg(f"miita-paper-{mode}", (lambda m=mode: MiitaMethod("paper", mode=m, oracle_alignment=True)),
            f"paper preset, retrieval variant {mode} (appendix C.3); reports Oracle Alignment")
    for mech in MECHANISMS.values():
        reg(f"miita-default-without-{mech.name}", (lambda n=mech.name: MiitaMethod(lambda: without(n))),
            f"ablation: the default preset without {mech.name} ({mech.what}; acts on {mech.acts_on})")
    for cand in CANDIDATES.values():
        reg(f"miita-default-with-{cand.name}", (lambda n=cand.name: MiitaMethod(lambda: with_candidate(n))),
            f"candidate: the default preset with {cand.name} ({cand.what})")
    reg("label-vote", LabelVote, "classification only: the weighted majority label of what a default memory "
        "retrieves for the query (its anchor vote, centroids and relevance gate), no LM")
    reg("example-mem", ExampleMem, "top-4 retrieved (x, y) examples as demonstrations; byte-budgeted, a uniform "
        "sample of the stream kept")
    reg("semantic-mem", lambda: _baseline("SemanticMem"), "semantic prototypes (key + answer-state centroids, "
        "merged by key similarity), no correction information, used like MIITA's paper preset (appendix C.2)")
    reg("summary-mem", SummaryMem, "SummaryMem (appendix C.2): one running line of notes per stage, written by the "
        "model from the stage's examples, budget split evenly over the stages; the 2 notes sharing most words with "
        "the query are put in its prompt")
    reg("knn-lm", lambda: _baseline("KnnLM"), "kNN-LM datastore of (final hidden state, next answer token), int8 "
        "keys, k=8, lambda=0.25, a uniform sample of the stream kept (Khandelwal et al. 2020)")


_register_builtins()
