"""How an ingest computes its examples' keys (and corrections): one seam, chosen once per call.

Every extractor is called like :func:`.ingest.extract_examples` — ``extractor(examples, bar)``
gives one ``Extracted | None`` per example, in stream order (lazily for the threaded one, so the
bank is written while later shards decode) — and is closed after the call. Which one runs is
decided here from :class:`KeyOptions`, a frozen value the CLI, serve or a caller builds, and plain
values (the engine, template, preset): this module knows nothing of the facade.

- one prompt per decode on the engine itself (the default): every stored key is bitwise the key
  the same prompt gets at ask time, continuing the rows it shares with the prompt decoded before it where
  that keeps it bitwise (``runtime.key_pass``); what the relevance gate's exact-repeat rule and
  forget's exact property rely on (docs/serving.md);
- several prompts per decode on one context (``batch``), or on ``contexts`` contexts side by side
  (:mod:`.thread_ingest`): keys within rounding of one-by-one extraction, so an ingested input
  asked again verbatim is not an exact repeat for the gate;
- ``fast``: the same, on the model's lossless Q8_0 twin cut after its deepest key layer
  (``runtime.key_twin``), at least two contexts;
- ``ray``: extraction on a Ray cluster (:mod:`.ray_ingest`), the bank written here, in stream order.

The batched and twin extractors apply to presets that need only keys (the ``tokens`` payload);
for other presets, and with an extract cache, the engine's own one-prompt path runs.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Iterable, Protocol, Sequence

from ..errors import InputError
from ..runtime.contexts import q8_twin
from ..runtime.engine import Engine
from ..streams import Example
from .extract import Extracted
from .ingest import extract_examples
from .presets import Preset
from .ray_ingest import RayExtractor
from .templates import Template, key_template
from .thread_ingest import ThreadExtractor

__all__ = ["KeyExtractor", "KeyOptions", "LocalExtractor", "RAY_WORKERS", "choose_extractor", "key_engine"]

#: Ray workers, each loading the model once, when ``--ray`` is given without ``--contexts``.
RAY_WORKERS = 2


@dataclass(frozen=True)
class KeyOptions:
    """How ingest extracts keys (see the module doc); the default is one prompt per decode.

    ``batch``: several prompts per decode on the engine's own context (needs an engine made with
    ``EngineConfig(n_seq_max > 1)``; with one sequence it changes nothing). ``contexts``: contexts
    side by side (1: the engine's own). ``fast``: the Q8_0 twin. ``ray``: True for a local cluster,
    an address for a running one, None for none; ``ray_workers`` actors, each loading the model.
    The CLI says both counts with one option (:meth:`side_by_side`)."""

    batch: bool = False
    contexts: int = 1
    fast: bool = False
    ray: str | bool | None = None
    ray_workers: int = RAY_WORKERS

    def __post_init__(self) -> None:
        for what, n in (("--contexts", self.contexts), ("--contexts (Ray workers)", self.ray_workers)):
            if isinstance(n, bool) or not isinstance(n, int) or n < 1:
                raise InputError(f"{what} must be >= 1, got {n}")
        if self.fast and self.ray:
            raise InputError("--fast-keys and --ray: choose one (Ray workers extract with the model itself)")

    @classmethod
    def side_by_side(cls, workers: int | None, fast: bool = False, ray: str | bool | None = None) -> "KeyOptions":
        """``ingest --contexts N [--ray]``: N extraction workers side by side, one notion whichever
        runs them -- llama.cpp contexts sharing the loaded model (default 1), or with ``ray`` Ray
        workers each loading it (default :data:`RAY_WORKERS`). Only one of the two ever runs
        (:func:`choose_extractor` takes Ray first), so one count says both."""
        if ray:
            return cls(fast=fast, ray=ray, ray_workers=RAY_WORKERS if workers is None else workers)
        return cls(contexts=1 if workers is None else workers, fast=fast)

    def check_preset(self, preset: Preset) -> None:
        """Refuse fast keys for a preset that computes corrections at ingest (one-line error)."""
        if self.fast and preset.bank.payload != "tokens":
            raise InputError(f"--fast-keys: preset {preset.name!r} computes corrections at ingest, not only "
                             f"keys; drop --fast-keys")


class KeyExtractor(Protocol):
    def __call__(self, examples: Sequence[Example], bar=None) -> Iterable[Extracted | None]: ...

    def close(self) -> None: ...


@dataclass
class LocalExtractor:
    """The engine's own context: one prompt per decode (or ``batch_keys``), through ``cache``."""

    engine: Engine
    template: Template
    preset: Preset
    max_prompt_tokens: int | None = None
    cache: object = None
    batch_keys: bool = False

    def __call__(self, examples: Sequence[Example], bar=None) -> list[Extracted | None]:
        return extract_examples(self.engine, self.template, self.preset, examples,
                                max_prompt_tokens=self.max_prompt_tokens, cache=self.cache, bar=bar,
                                batch_keys=self.batch_keys)

    def close(self) -> None:
        """Nothing to release: the engine is the caller's."""


def key_engine(engine: Engine, options: KeyOptions) -> Engine:
    """The engine the keys are computed on: the model's Q8_0 twin for ``fast`` (written to the
    cache on first use; the engine itself when the model has no Q5_0 weights, it is then as fast),
    else ``engine``. Call it before a stream to make the twin outside any row's error."""
    return (q8_twin(engine) or engine) if options.fast else engine


def choose_extractor(engine: Engine, template: Template, preset: Preset, options: KeyOptions, *,
                     max_prompt_tokens: int | None = None, cache=None) -> KeyExtractor:
    """The extractor ``options`` ask for, on ``engine`` pooling the memory's key layers. Options
    that do not apply (side-by-side contexts for a preset that computes corrections, or with an
    extract cache) fall back to the engine's own context; the CLI refuses them up front
    (``KeyOptions.check_preset``)."""
    if options.ray:
        return RayExtractor(str(engine.info.path), preset.to_json(), template.name, max_prompt_tokens,
                            address=None if options.ray is True else str(options.ray), workers=options.ray_workers,
                            key_layers=list(engine.key_layers), key_pooling=list(engine.key_pooling))
    n = options.contexts
    if (n > 1 or options.fast) and preset.bank.payload == "tokens" and cache is None:
        eng = key_engine(engine, options)
        n = max(n, 2) if options.fast else n
        return ThreadExtractor(eng, key_template(preset.key_prompt, template), preset.skip_bos, contexts=n,
                               threads=max(1, eng.n_threads // n),
                               max_prompt_tokens=max_prompt_tokens)
    return LocalExtractor(engine, template, preset, max_prompt_tokens, cache, options.batch)
