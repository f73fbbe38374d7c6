"""A memory's own fields beside its arrays (the manifest), and the checks made before they are read.

``memory.meta`` converts the fields between their long form and the compact form the store keeps;
this module holds what a memory *is* besides its bank (:class:`Manifest`: preset, template, model
fingerprint, budget, what it has learned) and validates a stored manifest's long form, so a
damaged or foreign manifest is one StoreError naming the field, never a KeyError from deep inside
(the corruption campaign, docs/reliability.md). Parsing the stored preset is the method layer's
(``method.presets.check_memory_fields``): this layer does not know presets.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from os import PathLike
from typing import Sequence

from ..errors import BudgetError, InputError, StoreError
from . import meta as meta_mod
from . import store as store_mod
from .bank import MemoryBank
from .budget import Budget, parse_budget

__all__ = ["Manifest", "StreamCounts", "call_stream_bytes", "check_fields", "read_fields", "stored_key_layers"]

_COUNTS = ("stream_bytes", "examples", "skipped", "prototypes", "anchors")


@dataclass
class StreamCounts:
    """What a memory has learned so far, as stored in its manifest. ``stream_bytes`` (UTF-8 bytes
    of every input and output seen, skipped ones included) is what a fractional budget is of."""

    examples: int = 0
    skipped: int = 0
    stream_bytes: int = 0


def call_stream_bytes(counts: StreamCounts, pairs: Sequence) -> int:
    """The stream size once this call is learned: everything before it plus every example of
    the call (skipped ones too: they were seen). A fractional budget resolves against this."""
    return counts.stream_bytes + sum(len(ex.input.encode()) + len(ex.output.encode()) for ex in pairs)


@dataclass
class Manifest:
    """Everything a committed memory stores besides its bank's arrays.

    ``preset`` is the preset's JSON (only what differs from its named version), ``fingerprint`` the
    model's. ``counts`` is the object ingest updates as it writes, so :meth:`committed_size` is
    always the size the memory would have if committed now (the manifest's bytes count too)."""

    preset: dict
    template: str
    fingerprint: dict
    budget: Budget
    counts: StreamCounts = field(default_factory=StreamCounts)
    # the keys are whitened because the memory decided so at its first ingest (a preset whose
    # key_whitening is "replies"); a preset that always or never whitens leaves it False
    key_whitened: bool = False

    def fields(self, bank: MemoryBank) -> dict:
        """The long form (what ``memory.meta.expand`` gives back)."""
        c = self.counts
        return {"format": meta_mod.FORMAT_V2, "preset": self.preset, "template": self.template,
                "fingerprint": self.fingerprint, "budget": self.budget.spec, "stream_bytes": c.stream_bytes,
                "examples": c.examples, "skipped": c.skipped, "prototypes": bank.n_prototypes,
                "anchors": bank.n_anchors, "key_whitened": self.key_whitened}

    def stored(self, bank: MemoryBank) -> dict:
        """The compact form the store keeps (``memory.meta``)."""
        return meta_mod.compact(self.fields(bank))

    def committed_size(self, bank: MemoryBank) -> int:
        """Exact bytes the memory occupies on disk once committed (every file)."""
        return store_mod.encoded_size(bank.to_arrays(shapes_only=True), self.stored(bank))

    def budget_bytes(self, stream: int | None = None) -> int | None:
        """The budget in bytes for a stream of ``stream`` bytes (default: the memory's own);
        None when unlimited."""
        b = self.budget
        return None if b.unlimited else b.resolve(self.counts.stream_bytes if stream is None else stream)


def check_fields(path: str | PathLike, fields) -> None:
    """Validate a memory's fields in their long form (``memory.meta.expand``) before anything reads
    them, all but the preset's own settings (``method.presets.check_memory_fields`` parses those)."""
    def bad(why: str) -> StoreError:
        return StoreError(f"memory {path}: manifest {why}; not a memory this miita-edge can open")

    if not isinstance(fields, dict) or fields.get("format") not in meta_mod.FORMATS:
        got = fields.get("format") if isinstance(fields, dict) else None
        if isinstance(got, int) and not isinstance(got, bool) and got > meta_mod.MEMORY_FORMAT:
            raise StoreError(f"memory {path}: unknown memory format {got} (written by a newer miita-edge; upgrade)")
        raise StoreError(f"memory {path}: unknown memory format {str(got)[:40]!r}")
    for k in _COUNTS:
        v = fields.get(k)
        if not isinstance(v, int) or isinstance(v, bool) or v < 0:
            raise bad(f"field {k!r} is {str(v)[:40]!r}, not a count")
    if not isinstance(fields.get("template"), str):
        raise bad("field 'template' is not a name")
    if not isinstance(fields.get("budget"), str):
        raise bad("field 'budget' is not a budget")
    try:
        parse_budget(fields["budget"])
    except (InputError, BudgetError):
        raise bad(f"field 'budget' is {fields['budget'][:40]!r}") from None
    fp = fields.get("fingerprint")
    if not (isinstance(fp, dict) and isinstance(fp.get("sha256"), str) and isinstance(fp.get("arch"), str)
            and all(isinstance(fp.get(k), int) and not isinstance(fp.get(k), bool) for k in ("n_embd", "key_layer"))):
        raise bad("field 'fingerprint' is incomplete")
    if not isinstance(fields.get("preset"), dict):
        raise bad("field 'preset' is not an object")
    if not isinstance(fields.get("key_whitened", False), bool):
        raise bad(f"field 'key_whitened' is {str(fields['key_whitened'])[:40]!r}, not true or false")


def read_fields(path: str | PathLike, snap: store_mod.Snapshot) -> dict:
    """A committed memory's fields in the long form, checked (format 1 or 2)."""
    fields = meta_mod.expand(snap.manifest, snap.arrays)
    check_fields(path, fields)
    return fields


def stored_key_layers(path: str | PathLike, fields: dict, n_layer: int) -> list[int]:
    """The layers the stored keys were pooled from, whatever the preset now says (a memory built
    before a preset changed its key layers keeps answering from its anchors' layers), checked
    against a model of ``n_layer`` layers."""
    fp = fields["fingerprint"]
    layers = fp.get("key_layers") or [fp["key_layer"]]
    if not (isinstance(layers, list) and layers and all(
            isinstance(k, int) and not isinstance(k, bool) and 0 <= k <= n_layer - 2 for k in layers)
            and len(set(layers)) == len(layers) and layers[0] == fp["key_layer"]):
        raise StoreError(f"memory {path}: its key layers {str(layers)[:40]} do not exist in this "
                         f"model (0..{n_layer - 2})")
    return list(layers)
