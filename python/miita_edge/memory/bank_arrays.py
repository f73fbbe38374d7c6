"""A bank's stored form: the arrays that persist it (``to_arrays``) and their reader
(:class:`StoredArrays`: every array checked, views read in place, Prototype objects made on demand).

Every byte counts against the budget, so integers take the narrowest unsigned type their largest
value fits; format 1 memories (``anchor_owner``, int32 ``tokens`` with separators) are still read.
"""
from __future__ import annotations

import numpy as np

from . import codecs
from .kept_coordinates import encode_kept, kept_nbytes
from .prototype import RADIUS_SCALE, TOKEN_END, BankConfig, Prototype, uint_for
from .token_ids import decode_token_ids, encode_token_ids, token_ids_nbytes

__all__ = ["ANCHOR_COUNT_MAX", "Seqs", "StoredArrays", "WIDE_TOKEN", "counts_say_anchor_counts", "decode_token_dict",
           "dictionary_bytes", "dictionary_pays", "distinct_tokens", "rows_are_smaller",
           "encode_token_dict", "pack_tokens", "packed_token_widths", "to_arrays", "token_row_bytes", "tokens_packed",
           "unpack_tokens"]

#: The largest count an anchor stores (uint16's); a centroid of more keys is stored as standing for this many.
ANCHOR_COUNT_MAX = 65535


def to_arrays(bank, shapes_only: bool = False) -> dict[str, np.ndarray]:
    """The arrays that persist ``bank`` (a ``MemoryBank``: the bank imports this module). With
    ``shapes_only`` they are zero-cost broadcast views of the right shape/dtype (for exact sizing).

    Layout (every byte counts against the budget, so integers take the narrowest unsigned
    type their largest value fits): ``anchors`` grouped by prototype, ``anchor_per`` how many
    each prototype owns, ``anchor_count`` how many keys each anchor stands for (saturating at 65,535), ``counts``
    each prototype's n (``anchor_per`` only where some prototype owns more than one anchor; ``anchor_count``
    only where it says more than ``counts``: absent, every prototype owns one anchor standing for all its
    keys, as under a tight budget, where it would repeat ``counts`` byte for byte), the
    answer tokens as a dictionary (each distinct id once, ascending: ``tok_ids``, one Rice-coded
    list, or where rows are smaller ``tok_dict`` uint16 for ids below 2^16 and ``tok_dict3`` 3-byte
    little-endian rows for the rest, vocabularies up to 2^24) and ``tok_bits`` or
    ``tok_idx`` (each token's place in the dictionary, the narrowest unsigned type), or, where
    that is not smaller (``dictionary_pays``), ``tok3``, every token as a 3-byte id in place; with
    ``tok_len`` per prototype, ``radius`` (relevance gate) in int8, and the evidence (``_evidence_arrays``).
    Why a dictionary: answers share most of their tokens (Banking77's 77 labels: 332 tokens, 114
    distinct), so each token costs a few bits and each distinct id about two bytes once, where a tight
    budget's keys need every byte. Earlier memories (``tok3``; format 1's ``anchor_owner`` and int32
    ``tokens`` with separators) are still read."""
    cfg, H, J = bank.config, bank.n_embd, len(bank.protos)
    # a key stores key_stored coordinates itself; the shared ones (narrow_rule "balanced-shared") once
    stored_dim = bank.key_stored
    key_bytes_cols = codecs.bytes_per_vector("bit", stored_dim) if cfg.key_precision == "bit" else stored_dim
    A = bank.n_anchors
    per = [len(p.anchors) for p in bank.protos]
    lens = [len(p.tokens) for p in bank.protos]
    out: dict[str, np.ndarray] = {}

    def fake(shape, dtype):
        return np.broadcast_to(np.zeros((), dtype), shape)

    if bank.key_kept is not None:  # a balanced narrowing kept other coordinates than the first ones
        w = H * bank.key_parts
        out["key_kept"] = fake((kept_nbytes(bank.key_kept, w),), np.uint8) if shapes_only \
            else encode_kept(bank.key_kept, w)
    if len(bank.key_shared):
        out["key_shared"] = fake(((len(bank.key_shared) + 7) // 8,), np.uint8) if shapes_only \
            else np.packbits(bank.key_shared > 0, bitorder="little")

    kdt = {"float32": np.float32, "float16": np.float16, "int8": np.int8, "bit": np.uint8}
    per_dt, cnt_dt = uint_for(max(per, default=0)), uint_for(max((p.n for p in bank.protos), default=0))
    # an anchor stands for at most 65,535 keys as stored (the count saturates there)
    acnt_dt = uint_for(min(max((int(c) for p in bank.protos for c in p.anchor_n), default=0), ANCHOR_COUNT_MAX))
    len_dt = uint_for(max(lens, default=0))
    if shapes_only:
        n_dirs = sum(len(p.dirs) for p in bank.protos)
        if cfg.payload != "tokens":
            out["dirs"] = fake((n_dirs, H), kdt[cfg.dir_precision])
            if cfg.dir_precision == "int8":
                out["dir_scale"] = fake((n_dirs,), np.float32)
        out["anchors"] = fake((A, key_bytes_cols), kdt[cfg.key_precision])
        if cfg.key_precision == "int8":
            out["anchor_scale"] = fake((A,), np.float32)
        if any(n != 1 for n in per):
            out["anchor_per"] = fake((J,), per_dt)
        if not counts_say_anchor_counts(bank.protos):
            out["anchor_count"] = fake((A,), acnt_dt)
        out["counts"] = fake((J,), cnt_dt)
        if cfg.payload != "mean":
            ids = distinct_tokens(bank.protos)
            if dictionary_pays(ids, sum(lens), lens):
                if rows_are_smaller(ids):
                    wide = int(np.count_nonzero(ids >= WIDE_TOKEN))
                    if len(ids) - wide:
                        out["tok_dict"] = fake((len(ids) - wide,), np.uint16)
                    if wide:
                        out["tok_dict3"] = fake((wide, 3), np.uint8)
                else:
                    out["tok_ids"] = fake((token_ids_nbytes(ids),), np.uint8)
                if tokens_packed(len(ids), lens):
                    out["tok_bits"] = fake((packed_token_bytes(len(ids), lens),), np.uint8)
                else:
                    out["tok_idx"] = fake((sum(lens),), uint_for(max(len(ids) - 1, 0)))
                    out["tok_len"] = fake((J,), len_dt)
            else:
                out["tok3"] = fake((sum(lens), 3), np.uint8)
                out["tok_len"] = fake((J,), len_dt)
        if cfg.relevance:
            out["radius"] = fake((J,), np.int8)
        return out | _evidence_arrays(bank.protos, True)

    if cfg.payload != "tokens":
        D = np.concatenate([p.dirs for p in bank.protos]) if J else np.zeros((0, H), np.float32)
        enc = codecs.encode(D, cfg.dir_precision)
        out["dirs"] = enc["data"]
        if "scale" in enc:
            out["dir_scale"] = enc["scale"]
    Amat, _ = bank.anchor_matrix()
    enc = codecs.encode(np.ascontiguousarray(Amat[:, :stored_dim]), cfg.key_precision)
    out["anchors"] = enc["data"].reshape(A, key_bytes_cols)
    if "scale" in enc:
        out["anchor_scale"] = enc["scale"]
    if any(n != 1 for n in per):  # absent: every prototype owns exactly one anchor
        out["anchor_per"] = np.array(per, per_dt)
    if not counts_say_anchor_counts(bank.protos):
        an = np.concatenate([p.anchor_n for p in bank.protos]) if J else np.zeros(0, np.int64)
        out["anchor_count"] = np.minimum(an, ANCHOR_COUNT_MAX).astype(acnt_dt)
    out["counts"] = np.array([p.n for p in bank.protos], cnt_dt)
    if cfg.payload != "mean":
        flat = np.concatenate([p.tokens for p in bank.protos]).astype(np.int64) if J else np.zeros(0, np.int64)
        if len(flat) and (flat.min() < 0 or flat.max() >= 1 << 24):
            raise ValueError("answer token ids must lie in 0..2^24-1 to be stored in 3 bytes")
        ids = np.unique(flat)
        if dictionary_pays(ids, len(flat), lens):
            out.update(encode_token_dict(ids))
            idx = np.searchsorted(ids, flat)
            if tokens_packed(len(ids), lens):
                out["tok_bits"] = pack_tokens(idx, lens, len(ids))
            else:
                out["tok_idx"] = idx.astype(uint_for(max(len(ids) - 1, 0)))
                out["tok_len"] = np.array(lens, len_dt)
        else:
            out["tok3"] = np.stack([(flat >> s) & 0xFF for s in (0, 8, 16)], axis=1).astype(np.uint8) \
                if len(flat) else np.zeros((0, 3), np.uint8)
            out["tok_len"] = np.array(lens, len_dt)
    if cfg.relevance:
        out["radius"] = np.array([np.floor(p.radius * RADIUS_SCALE + 1e-6) for p in bank.protos],
                                 np.float64).clip(-RADIUS_SCALE, RADIUS_SCALE).astype(np.int8)
    return out | _evidence_arrays(bank.protos, False)


def _evidence_arrays(protos, shapes_only: bool) -> dict[str, np.ndarray]:
    """``ev_len`` (one uint8 length per prototype) and ``ev3`` (every evidence token as a 3-byte id), or
    nothing while no answer holds its taught input (method/verify)."""
    ev = [np.zeros(0, np.int64) if p.evidence is None else np.asarray(p.evidence, np.int64) for p in protos]
    if not any(len(e) for e in ev):
        return {}
    if shapes_only:
        return {"ev_len": np.broadcast_to(np.zeros((), np.uint8), (len(ev),)),
                "ev3": np.broadcast_to(np.zeros((), np.uint8), (sum(len(e) for e in ev), 3))}
    if max(len(e) for e in ev) > 255:
        raise ValueError("an answer's evidence holds more than 255 tokens")
    flat = np.concatenate(ev)
    if flat.min() < 0 or flat.max() >= 1 << 24:
        raise ValueError("evidence token ids must lie in 0..2^24-1 to be stored in 3 bytes")
    return {"ev_len": np.array([len(e) for e in ev], np.uint8),
            "ev3": np.stack([(flat >> s) & 0xFF for s in (0, 8, 16)], axis=1).astype(np.uint8)}



def counts_say_anchor_counts(protos) -> bool:
    """Whether ``counts`` alone says every anchor's count: each prototype owns one anchor, which
    stands for all of its n keys, and n fits an anchor's stored count. Then ``anchor_count`` is left
    out and read back as ``counts``, so a tight budget does not pay for one byte per prototype
    twice. False for a bank without prototypes (its arrays stay as they always were)."""
    return bool(protos) and all(len(p.anchor_n) == 1 and int(p.anchor_n[0]) == int(p.n) <= ANCHOR_COUNT_MAX
                                for p in protos)


class Seqs:
    """Each prototype's answer tokens as slices of a flat int32 array (indexable, sized)."""

    def __init__(self, flat: np.ndarray, starts: np.ndarray, ends: np.ndarray) -> None:
        self.flat, self.starts, self.ends = flat, starts.astype(np.int64), ends.astype(np.int64)

    def __len__(self) -> int:
        return len(self.ends)

    def __getitem__(self, j: int) -> np.ndarray:
        return self.flat[self.starts[j]:self.ends[j]]


class StoredArrays:
    """A bank's stored arrays, checked, before its Prototype objects exist.

    The checks (and their messages) are the ones ``from_arrays`` always made; the views read the
    arrays with numpy (one pass each) instead of walking Prototype objects."""

    def __init__(self, config: BankConfig, H: int, key_parts: int, arrays: dict[str, np.ndarray],
                 width: int | None = None) -> None:
        """``width``: the key frame's full width where it is not H · key_parts (an overcomplete
        frame, ``MemoryBank.key_whiten``)."""
        self.config, self.H = config, H
        # A store accepts any valid arrays (a forged file with a recomputed checksum is valid), so the
        # ranks are checked here: a 2-D tokens array split into 2-D "sequences" crashed ``ask``
        # (the corruption campaign, docs/reliability.md).
        for name in ("counts", "anchor_owner", "anchor_per", "anchor_count", "anchor_scale", "dir_scale", "tokens",
                     "tok_len", "tok_idx", "tok_bits", "tok_ids", "radius", "key_kept", "key_shared", "ev_len"):
            if name in arrays and np.ndim(arrays[name]) != 1:
                raise ValueError(f"{name} array has shape {np.shape(arrays[name])}, expected one dimension")
        counts = np.asarray(arrays["counts"])
        if counts.ndim != 1 or counts.dtype.kind not in "iu":
            raise ValueError("counts is not a vector of integers")
        J = len(counts)
        if config.payload == "tokens":
            D = np.zeros((0, H), np.float32)
        else:
            enc = {"data": arrays["dirs"]}
            codecs.check_stored("dirs", enc["data"], config.dir_precision)
            if "dir_scale" in arrays:
                enc["scale"] = arrays["dir_scale"]
            D = codecs.decode(enc, config.dir_precision, H)
        raw = np.asarray(arrays["anchors"])
        scale = np.asarray(arrays["anchor_scale"]) if "anchor_scale" in arrays else None
        full = H * key_parts if width is None else int(width)
        if raw.ndim != 2:
            raise ValueError(f"anchors array has shape {raw.shape}, expected (n, width)")
        codecs.check_stored("anchors", raw, config.key_precision)
        if config.key_precision == "bit":  # full width, or narrowed by repair to a multiple of 8 bits
            cols = raw.shape[1]
            key_dim = full if cols == codecs.bytes_per_vector("bit", full) else 8 * cols
            if key_dim > full or key_dim < 8:
                raise ValueError(f"anchors array has shape {raw.shape}, expected (n, <= "
                                 f"{codecs.bytes_per_vector('bit', full)})")
        else:
            key_dim = raw.shape[1]
            if key_dim != full:
                raise ValueError(f"anchors array has shape {raw.shape}, expected (n, {full})")
        if scale is not None and scale.shape != (len(raw),):
            raise ValueError("anchor_scale does not match the anchors")
        if "anchor_per" in arrays:  # format 2: anchors grouped by prototype, counted per prototype
            per = np.asarray(arrays["anchor_per"]).astype(np.int64)
            if per.shape != (J,) or (J and per.min() < 0) or int(per.sum()) != len(raw):
                raise ValueError("anchor_per does not match the anchors and prototypes")
            owner = np.repeat(np.arange(J, dtype=np.int64), per)
        elif "anchor_owner" in arrays:  # format 1: an owner per anchor
            owner = np.asarray(arrays["anchor_owner"]).astype(np.int64)
        else:  # every prototype owns exactly one anchor
            if len(raw) != J:
                raise ValueError(f"anchors array holds {len(raw)} rows for {J} prototypes of one anchor each "
                                 f"(anchor_per is absent)")
            owner = np.arange(J, dtype=np.int64)
        if "anchor_count" in arrays:
            acount = np.asarray(arrays["anchor_count"]).astype(np.int64)
        elif "anchor_per" in arrays or "anchor_owner" in arrays:
            raise ValueError("anchor_count array is missing (some prototype owns more than one anchor)")
        else:  # each prototype's one anchor stands for all its keys (counts_say_anchor_counts)
            acount = counts.astype(np.int64)
            if len(acount) and acount.max() > ANCHOR_COUNT_MAX:
                raise ValueError(f"counts exceed {ANCHOR_COUNT_MAX} where anchor_count is absent")
        if len(acount) != len(owner) or (len(acount) and acount.min() < 1):
            raise ValueError("anchor_count does not match the anchors")
        if len(owner) != len(raw) or (len(owner) and (owner.min() < 0 or owner.max() >= J)):
            raise ValueError("anchor_owner does not index the prototypes")
        flat, starts, ends = _answers(config, arrays, J)
        n_dirs = {"mean": J, "sequence": int((ends - starts).sum()), "tokens": 0}[config.payload]
        if n_dirs > len(D):
            raise ValueError("dirs array is shorter than the prototypes need")
        if n_dirs != len(D):
            raise ValueError("dirs array is longer than the prototypes need")
        radius = None
        if config.relevance:
            if "radius" not in arrays:
                raise ValueError("radius array is missing (the relevance gate needs it)")
            radius = np.asarray(arrays["radius"])
            if radius.shape != (J,) or radius.dtype != np.int8 or (J and radius.min() < -RADIUS_SCALE):
                raise ValueError("radius does not hold one int8 radius per prototype")
        self._evidence = _evidence(arrays, J)
        self.J, self.counts, self.D, self.raw, self.scale = J, counts, D, raw, scale
        self._arrays_shared = arrays.get("key_shared")
        self.key_dim, self.radius = key_dim, radius
        self.owner, self.acount, self._seqs = owner, acount, Seqs(flat, starts, ends)
        # Each prototype's anchors in stored order: a sort by owner instead of one mask per
        # prototype (O(A log A), not O(J·A)); none when the owners are sorted (as written).
        self.sorted = bool(len(owner) < 2 or (owner[1:] >= owner[:-1]).all())
        self.by_owner = None if self.sorted else np.argsort(owner, kind="stable")

    def share(self, places: np.ndarray) -> np.ndarray:
        """Mutates: every stored key gains the shared coordinates (``key_shared``, one bit each for
        ``places``, stored once) after its own, so the views read keys as the bank holds them in RAM.
        Returns their signs (±1). ValueError where ``key_shared`` does not hold one bit per place."""
        bits = np.asarray(self._arrays_shared)
        n = len(places)
        if bits.ndim != 1 or bits.dtype != np.uint8 or len(bits) != (n + 7) // 8 or \
                np.unpackbits(bits, bitorder="little")[n:].any() or self.config.key_precision != "bit":
            raise ValueError(f"key_shared does not hold one bit for each of the {n} shared coordinates")
        signs = np.unpackbits(bits, bitorder="little")[:n].astype(np.float32) * 2 - 1
        own = np.unpackbits(self.raw, axis=1)[:, :self.key_dim]
        self.raw = np.packbits(np.concatenate([own, np.broadcast_to(signs > 0, (len(own), n)).astype(np.uint8)],
                                              axis=1), axis=1)
        self.key_dim += n
        return signs

    def radii(self) -> np.ndarray:
        """Each prototype's radius as a cosine (J,); 1.0 everywhere without the relevance gate."""
        return np.ones(self.J) if self.radius is None else self.radius.astype(np.float64) / RADIUS_SCALE

    def owner_sorted(self) -> np.ndarray:
        return self.owner if self.sorted else self.owner[self.by_owner]

    def packed_sorted(self) -> np.ndarray:
        return self.raw if self.sorted else self.raw[self.by_owner]

    def anchors(self) -> np.ndarray:
        enc = {"data": self.packed_sorted()}
        if self.scale is not None:
            enc["scale"] = self.scale if self.sorted else self.scale[self.by_owner]
        return codecs.decode(enc, self.config.key_precision, self.key_dim)

    def seqs(self) -> Seqs:
        return self._seqs

    def evidence(self) -> list:
        """Each prototype's evidence tokens (int32), None where it holds none."""
        return self._evidence

    def dir_rows(self) -> np.ndarray:
        """First row of each prototype's payload in D (J,), and its length (J,)."""
        L = {"mean": np.ones(self.J, np.int64), "tokens": np.zeros(self.J, np.int64),
             "sequence": (self._seqs.ends - self._seqs.starts).astype(np.int64)}[self.config.payload]
        return np.cumsum(L) - L, L

    def directions(self, position: int) -> np.ndarray:
        D = np.zeros((self.J, self.H), np.float32)
        first, L = self.dir_rows()
        has = np.flatnonzero(position < L)
        D[has] = self.D[first[has] + position]
        return D

    def prototypes(self) -> list[Prototype]:
        """The Prototype objects, made when a bank is first changed (writes and repair need them)."""
        cfg, raw, scale, acount = self.config, self.raw, self.scale, self.acount
        by_owner = np.arange(len(self.owner)) if self.by_owner is None else self.by_owner
        bounds = np.searchsorted(self.owner[by_owner], np.arange(self.J + 1))

        def anchors_of(j: int) -> tuple[np.ndarray, np.ndarray]:
            idx = by_owner[bounds[j]:bounds[j + 1]]
            enc = {"data": raw[idx]}
            if scale is not None:
                enc["scale"] = scale[idx]
            return codecs.decode(enc, cfg.key_precision, self.key_dim), acount[idx]

        first, L = self.dir_rows()
        radii = self.radii()
        out = []
        for j in range(self.J):
            a, a_n = anchors_of(j)
            seq = self._seqs[j] if cfg.payload != "mean" else np.zeros(0, np.int32)
            f = int(first[j])
            ev = self._evidence[j]
            out.append(Prototype(self.D[f:f + int(L[j])].copy(), seq.copy(), a, int(self.counts[j]), a_n,
                                 radius=float(radii[j]), evidence=None if ev is None else ev.copy()))
        return out


def _evidence(arrays: dict, J: int) -> list:
    """The stored evidence (``ev_len``, ``ev3``: each prototype's taught input as 3-byte token ids),
    one int32 array or None per prototype; ValueError where the two arrays do not agree."""
    if "ev_len" not in arrays and "ev3" not in arrays:
        return [None] * J
    if "ev_len" not in arrays or "ev3" not in arrays:
        raise ValueError("evidence needs both ev_len and ev3")
    lens, raw = np.asarray(arrays["ev_len"]), np.asarray(arrays["ev3"])
    if lens.shape != (J,) or lens.dtype != np.uint8:
        raise ValueError("ev_len does not hold one uint8 length per prototype")
    if raw.ndim != 2 or raw.shape[1] != 3 or raw.dtype != np.uint8 or len(raw) != int(lens.sum(dtype=np.int64)):
        raise ValueError(f"ev3 array has shape {raw.shape}, expected ({int(lens.sum(dtype=np.int64))}, 3) uint8")
    flat = (raw[:, 0].astype(np.int32) | (raw[:, 1].astype(np.int32) << 8) | (raw[:, 2].astype(np.int32) << 16))
    ends = np.cumsum(lens.astype(np.int64))
    return [flat[e - n:e] if n else None for n, e in zip(lens.tolist(), ends.tolist())]


def distinct_tokens(protos) -> np.ndarray:
    """The distinct answer token ids of ``protos``, ascending (the token dictionary's rows)."""
    return np.unique(np.concatenate([np.asarray(p.tokens, np.int64) for p in protos])) if protos \
        else np.zeros(0, np.int64)


#: Token ids from here on take 3-byte dictionary rows (``tok_dict3``), those below it 2 (``tok_dict``).
WIDE_TOKEN = 1 << 16


def dictionary_rows_bytes(ids: np.ndarray) -> int:
    """Bytes of the dictionary as rows: 2 per id, 3 from ``WIDE_TOKEN``."""
    ids = np.asarray(ids, np.int64)
    return 2 * len(ids) + int(np.count_nonzero(ids >= WIDE_TOKEN))


def rows_are_smaller(ids: np.ndarray) -> bool:
    """Whether the dictionary ``ids`` takes fewer bytes as rows (``tok_dict``, ``tok_dict3``) than as
    one Rice-coded list (``tok_ids``); a tie goes to ``tok_ids`` (one array header, not two)."""
    return dictionary_rows_bytes(ids) < token_ids_nbytes(ids)


def dictionary_bytes(ids: np.ndarray) -> int:
    """Bytes of the dictionary of the distinct ascending ``ids`` in its smaller form."""
    return min(dictionary_rows_bytes(ids), token_ids_nbytes(ids))


def dictionary_pays(ids: np.ndarray, n_tokens: int, lens=None) -> bool:
    """Whether a dictionary of the distinct ``ids`` and an index per token take fewer bytes than
    ``n_tokens`` 3-byte ids in place: answers that share their tokens (labels) are stored through a
    dictionary, answers of mostly distinct tokens (extractive spans) are not made dearer by one.
    ``lens`` (each answer's length), if given: the indices cost what their cheaper coding costs
    (``tokens_packed``), and the lengths are counted on both sides."""
    ids = np.asarray(ids, np.int64)
    rows = dictionary_bytes(ids)
    idx = n_tokens * np.dtype(uint_for(max(len(ids) - 1, 0))).itemsize
    if lens is None:
        return rows + idx < 3 * n_tokens
    len_bytes = len(lens) * np.dtype(uint_for(max(lens, default=0))).itemsize
    index_side = packed_token_bytes(len(ids), lens) if tokens_packed(len(ids), lens) else idx + len_bytes
    return rows + index_side < 3 * n_tokens + len_bytes


def packed_token_widths(n_ids: int, lens) -> tuple[int, int]:
    """(L, B): the bits of one answer length and of one dictionary index in ``tok_bits``: the
    fewest that hold the longest answer and the last dictionary row (at least one each)."""
    return max(1, int(max(lens, default=0)).bit_length()), max(1, int(n_ids - 1).bit_length())


def packed_token_bytes(n_ids: int, lens) -> int:
    """Bytes of ``tok_bits``: one byte for L, then J lengths of L bits and every token's index of B
    bits, rounded up to a whole byte."""
    L, B = packed_token_widths(n_ids, lens)
    return 1 + (len(lens) * L + int(sum(lens)) * B + 7) // 8


def tokens_packed(n_ids: int, lens) -> bool:
    """Whether the answers' lengths and dictionary indices are stored as one bit stream
    (``tok_bits``) rather than as byte arrays (``tok_len``, ``tok_idx``): where it is smaller.

    Why: a label of Banking77 is about four tokens of a dictionary of about a hundred ids, so its
    indices need 7 bits and its length 4, where the byte arrays spend 8 each; at a 1% budget the
    difference (about a byte per answer) is a byte more of every key."""
    if not len(lens) or not sum(lens):
        return False
    J, N = len(lens), int(sum(lens))
    plain = J * np.dtype(uint_for(max(lens))).itemsize + N * np.dtype(uint_for(max(n_ids - 1, 0))).itemsize
    return packed_token_bytes(n_ids, lens) < plain


def _bits(values: np.ndarray, width: int) -> np.ndarray:
    """Each value's ``width`` low bits, least significant first, one uint8 (0/1) per bit."""
    v = np.asarray(values, np.int64).reshape(-1, 1)
    return ((v >> np.arange(width, dtype=np.int64)) & 1).astype(np.uint8).reshape(-1)


def pack_tokens(idx, lens, n_ids: int) -> np.ndarray:
    """``tok_bits``: byte 0 is L; then, least significant bit first, each answer's length in L bits,
    then each token's dictionary index in B bits (``packed_token_widths``); the last byte's unused
    bits are zero."""
    L, B = packed_token_widths(n_ids, lens)
    bits = np.concatenate([_bits(np.asarray(lens, np.int64), L), _bits(np.asarray(idx, np.int64), B)])
    return np.concatenate([np.array([L], np.uint8), np.packbits(bits, bitorder="little")])


def unpack_tokens(buf, J: int, n_ids: int) -> tuple[np.ndarray, np.ndarray]:
    """Inverse of ``pack_tokens`` for ``J`` answers and a dictionary of ``n_ids`` rows: (indices,
    lengths) as int64. ValueError naming what does not hold for a stream it never writes."""
    b = np.asarray(buf)
    if b.ndim != 1 or b.dtype != np.uint8 or len(b) < 1:
        raise ValueError(f"tok_bits array has dtype {b.dtype} and shape {b.shape}, expected a byte stream")
    L = int(b[0])
    B = packed_token_widths(n_ids, [])[1]
    if not 1 <= L <= 32:
        raise ValueError(f"tok_bits gives answer lengths {L} bits wide (1..32)")
    bits = np.unpackbits(b[1:], bitorder="little")
    if len(bits) < J * L:
        raise ValueError("tok_bits is shorter than the answers' lengths")
    weights = (np.int64(1) << np.arange(max(L, B), dtype=np.int64))
    lens = bits[:J * L].reshape(J, L).astype(np.int64) @ weights[:L] if J else np.zeros(0, np.int64)
    N = int(lens.sum())
    end = J * L + N * B
    if (end + 7) // 8 != len(b) - 1 or bits[end:].any():
        raise ValueError("tok_bits does not end where the answers' tokens do")
    idx = bits[J * L:end].reshape(N, B).astype(np.int64) @ weights[:B] if N else np.zeros(0, np.int64)
    if N and int(idx.max()) >= n_ids:
        raise ValueError("tok_bits points past the token dictionary")
    return idx, lens


def token_row_bytes(token: int) -> int:
    """Bytes the dictionary row of one distinct id takes."""
    return 3 if token >= WIDE_TOKEN else 2


def encode_token_dict(ids: np.ndarray) -> dict[str, np.ndarray]:
    """The dictionary of the ascending distinct ``ids``: one Rice-coded list (``tok_ids``,
    ``token_ids``), or, where that is larger (``rows_are_smaller``), ``tok_dict`` (uint16) for
    those below ``WIDE_TOKEN`` and ``tok_dict3`` (3-byte little-endian rows) for the rest, each
    only where it has a row; the dictionary's order is theirs concatenated, still ascending."""
    ids = np.asarray(ids, np.int64)
    if not rows_are_smaller(ids):
        return {"tok_ids": encode_token_ids(ids)}
    out = {}
    narrow, wide = ids[ids < WIDE_TOKEN], ids[ids >= WIDE_TOKEN]
    if len(narrow):
        out["tok_dict"] = narrow.astype(np.uint16)
    if len(wide):
        out["tok_dict3"] = np.stack([(wide >> s) & 0xFF for s in (0, 8, 16)], axis=1).astype(np.uint8)
    return out


def decode_token_dict(arrays) -> np.ndarray:
    """Inverse of ``encode_token_dict`` (int32 ids); ValueError for a dictionary it never writes."""
    if "tok_ids" in arrays:
        if "tok_dict" in arrays or "tok_dict3" in arrays:
            raise ValueError("tok_ids and tok_dict/tok_dict3 both hold a token dictionary")
        return decode_token_ids(arrays["tok_ids"])
    parts = []
    if "tok_dict" in arrays:
        d = np.asarray(arrays["tok_dict"])
        if d.ndim != 1 or d.dtype != np.uint16:
            raise ValueError(f"tok_dict array has dtype {d.dtype} and shape {d.shape}, expected uint16 ids")
        parts.append(d.astype(np.int32))
    if "tok_dict3" in arrays:
        d = np.asarray(arrays["tok_dict3"])
        if d.ndim != 2 or d.shape[1] != 3 or d.dtype != np.uint8:
            raise ValueError(f"tok_dict3 array has dtype {d.dtype} and shape {d.shape}, expected 3-byte rows")
        t = d.astype(np.int32)
        parts.append(t[:, 0] | (t[:, 1] << 8) | (t[:, 2] << 16))
    return np.concatenate(parts) if parts else np.zeros(0, np.int32)


def _answers(config: BankConfig, arrays: dict[str, np.ndarray], J: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Each prototype's answer tokens as (flat int32 ids, starts, ends), checked: a dictionary and
    each token's index into it with their lengths, earlier format 2's 3-byte ids in place, or
    format 1's int32 ids with a separator after each answer."""
    if config.payload != "mean":
        if "tok_bits" in arrays:
            ids = decode_token_dict(arrays)
            idx, lens = unpack_tokens(arrays["tok_bits"], J, len(ids))
            flat = ids[idx] if len(idx) else np.zeros(0, np.int32)
            ends = np.cumsum(lens)
            starts = ends - lens
        elif "tok_idx" in arrays:
            ids = decode_token_dict(arrays)
            idx = np.asarray(arrays["tok_idx"])
            lens = np.asarray(arrays.get("tok_len", np.zeros(0, np.uint8))).astype(np.int64)
            if idx.ndim != 1 or idx.dtype.kind != "u" or lens.shape != (J,) \
                    or (J and lens.min() < 0) or int(lens.sum()) != len(idx):
                raise ValueError("tok_idx/tok_len do not hold one answer per prototype")
            if len(idx) and int(idx.max()) >= len(ids):
                raise ValueError("tok_idx points past the token dictionary")
            flat = ids[idx.astype(np.int64)] if len(idx) else np.zeros(0, np.int32)
            ends = np.cumsum(lens)
            starts = ends - lens
        elif "tok3" in arrays:
            t3 = np.asarray(arrays["tok3"])
            lens = np.asarray(arrays["tok_len"]).astype(np.int64)
            if t3.ndim != 2 or t3.shape[1] != 3 or lens.shape != (J,) or (J and lens.min() < 0) \
                    or int(lens.sum()) != len(t3):
                raise ValueError("tok3/tok_len do not hold one answer per prototype")
            t = t3.astype(np.int32)
            flat = t[:, 0] | (t[:, 1] << 8) | (t[:, 2] << 16)
            ends = np.cumsum(lens)
            starts = ends - lens
        else:  # format 1: int32 with a separator after each answer
            flat = np.asarray(arrays["tokens"], np.int32)
            if len(flat) and flat.min() < TOKEN_END:
                raise ValueError(f"tokens array holds a negative token id ({int(flat.min())})")
            ends = np.flatnonzero(flat == TOKEN_END)
            if len(ends) != J:
                raise ValueError("tokens array does not hold one sequence per prototype")
            starts = np.concatenate([[0], ends[:-1] + 1]) if J else np.zeros(0, np.int64)
    else:
        flat, starts, ends = np.zeros(0, np.int32), np.zeros(J, np.int64), np.zeros(J, np.int64)
    return flat, starts, ends
