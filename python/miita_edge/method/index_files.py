"""What both recall fronts (``ann_index``'s usearch graph, ``ivf_index``'s inverted file) share:
the groups of identical rows they index once, and the cache file they are kept in.

Why identical rows are grouped: a one-anchor prototype's centroid equals its anchor, so nearly
every voter row has a twin; indexing each distinct row once and handing back the whole group keeps
ties broken by the exact path's rule (lower index), not by which twin an index returned.

Why one container: both indexes are derived from a memory version, cached in the user cache
directory and mapped on the next open; a damaged or foreign file must be refused, never trusted,
and two processes building the same cache must leave one whole file.
"""
from __future__ import annotations

import json
import mmap
import os
import threading
from pathlib import Path

import numpy as np

__all__ = ["HEADER", "DuplicateGroups", "duplicate_rows", "map_container", "strong_half", "write_container"]

HEADER = 4096  # fixed header size of a cache file: magic, JSON, zero padding


def strong_half(q: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(signs, stronger half) of a float query as both fronts code it: ``q_i >= 0`` (as
    ``codecs.encode(..., "bit")``), and ``|q_i|`` at or above the median. The Hamming distance over
    the stronger half counts disagreements where the query is sure (ann_index's module docstring)."""
    q = np.asarray(q, np.float32).reshape(-1)
    s = q >= 0
    a = np.abs(q)
    h = a.size // 2  # the median by one partition (np.median's own machinery costs more right after a decode)
    part = np.partition(a, [h - 1, h] if a.size % 2 == 0 and a.size > 1 else [h])
    med = (part[h - 1] + part[h]) / 2 if a.size % 2 == 0 and a.size > 1 else part[h]
    return s, a >= med


def duplicate_rows(rows: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """Groups of byte-identical rows: (representatives (lowest row of each group, all rows),
    groups with more than one row as (rep, start, members)) — a 64-bit hash of each row, a sort,
    and an exact comparison of neighbours; a hash collision only leaves two rows ungrouped."""
    n = rows.shape[0]
    if n == 0:
        z = np.zeros(0, np.int64)
        return z, z, np.zeros(1, np.int64), z
    b = np.ascontiguousarray(rows).view(np.uint8).reshape(n, -1)
    pad = (-b.shape[1]) % 8
    if pad:
        b = np.concatenate([b, np.zeros((n, pad), np.uint8)], axis=1)
    w = b.view(np.uint64)
    mult = (np.random.default_rng(0x5EED).integers(1, 2**63, w.shape[1], dtype=np.uint64) | np.uint64(1))
    h = np.zeros(n, np.uint64)
    with np.errstate(over="ignore"):
        for s in range(0, n, 65536):
            blk = w[s:s + 65536] * mult
            hb = blk.sum(axis=1, dtype=np.uint64)
            h[s:s + 65536] = hb ^ (hb >> np.uint64(29))
    order = np.argsort(h, kind="stable")  # equal rows: ascending row id
    same = np.zeros(n, bool)
    eq_h = h[order[1:]] == h[order[:-1]]
    if eq_h.any():
        i = np.flatnonzero(eq_h)
        same[i + 1] = (b[order[i + 1]] == b[order[i]]).all(axis=1)
    first = np.flatnonzero(~same)
    reps_sorted = order[first]
    reps = np.sort(reps_sorted)
    if not same.any():
        z = np.zeros(0, np.int64)
        return reps.astype(np.int64), z, np.zeros(1, np.int64), z
    sizes = np.diff(np.append(first, n))
    multi = np.flatnonzero(sizes > 1)
    dup_rep = reps_sorted[multi]
    by_rep = np.argsort(dup_rep)
    members, start = [], [0]
    for g in multi[by_rep]:
        m = np.sort(order[first[g] + 1:first[g] + sizes[g]])
        members.append(m)
        start.append(start[-1] + m.size)
    return (reps.astype(np.int64), dup_rep[by_rep].astype(np.int64), np.array(start, np.int64),
            np.concatenate(members).astype(np.int64))


class DuplicateGroups:
    """Rows identical to a representative (``_duplicates``' rep, start, members), and each row's
    group (-1: none), so that a candidate finds its group in one read: binary-searching 256-512
    candidates in ``rep`` right after a prompt pass (caches cold) costs a measurable share of
    retrieval (docs/benchmarks.md); 4 bytes a row, derived, never stored."""

    def __init__(self, rep: np.ndarray, start: np.ndarray, members: np.ndarray, n_rows: int) -> None:
        self.rep, self.start, self.members = rep, start, members
        self.group = np.full(n_rows if rep.size else 0, -1, np.int32)
        self.group[rep] = np.arange(rep.size, dtype=np.int32)

    def expand(self, keys: np.ndarray) -> np.ndarray:
        """``keys`` and every row identical to one of them, sorted and unique."""
        if self.rep.size and keys.size:
            pos = self.group[keys]
            pos = pos[pos >= 0].astype(np.int64)
            if pos.size:  # every member of the matched groups, gathered without a Python loop
                lo = self.start[pos]
                keys = np.concatenate([keys, self.members[_ranges(lo, self.start[pos + 1] - lo)]])
        return np.unique(keys)

    def twins(self, keys: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """(group of each key (-1: none), how many rows are identical to it besides itself)."""
        keys = np.asarray(keys, np.int64)
        n = np.zeros(keys.size, np.int32)
        if not self.rep.size:
            return np.full(keys.size, -1, np.int32), n
        g = self.group[keys]
        has = g >= 0
        gi = g[has].astype(np.int64)
        n[has] = self.start[gi + 1] - self.start[gi]
        return g, n

    def top_rows(self, keys: np.ndarray, scores: np.ndarray, k: int,
                 twins: tuple[np.ndarray, np.ndarray] | None = None) -> tuple[np.ndarray, np.ndarray]:
        """Of distinct ``keys`` scored ``scores`` (each row of a group scores as its representative:
        the rows are identical), every row, twins included, scoring at least the ``k``-th best
        score of the expanded set: (rows sorted ascending, their scores). ``twins``:
        ``self.twins(keys)`` when the caller has it at hand (the inverted file keeps it in list
        order, read where the lists were read, not at random rows of a 4-byte-a-row table).

        Why not expand first and score every row: at 100,000 one-anchor prototypes nearly every
        candidate has a twin, so expanding doubled the rows gathered and re-scored right after a
        prompt pass, and the expansion itself cost more than the vote. A top-k vote
        reads only the rows at or above its k-th score (all of them, ties included, so the lower
        row still wins a tie), and those are found from the representatives' scores and the group
        sizes alone; only the few groups at the top are expanded."""
        keys = np.asarray(keys, np.int64)
        scores = np.asarray(scores)
        if keys.size == 0 or k <= 0:
            return np.zeros(0, np.int64), scores[:0]
        g, extra = self.twins(keys) if twins is None else twins
        order = np.argsort(-scores, kind="stable")
        reach = np.cumsum(extra[order] + 1)
        kth = scores[order[min(int(np.searchsorted(reach, k)), keys.size - 1)]]
        sel = np.flatnonzero(scores >= kth)
        rows, sc = keys[sel], scores[sel]
        twin = sel[extra[sel] > 0]
        if twin.size:
            n = extra[twin].astype(np.int64)
            rows = np.concatenate([rows, self.members[_ranges(self.start[g[twin].astype(np.int64)], n)]])
            sc = np.concatenate([sc, np.repeat(scores[twin], n)])
        o = np.argsort(rows, kind="stable")
        return rows[o], sc[o]


def _ranges(lo: np.ndarray, n: np.ndarray) -> np.ndarray:
    """The indices lo[0] .. lo[0] + n[0] - 1, then lo[1] .., concatenated, without a Python loop."""
    return np.repeat(lo - np.cumsum(n) + n, n) + np.arange(int(n.sum()))


def write_container(path: Path, magic: bytes, head: dict, chunks) -> None:
    """A cache file: ``magic`` and the JSON ``head`` padded to ``HEADER`` bytes, then ``chunks``
    (bytes-like); written to a temporary file and ``os.replace``-d, so a reader never sees half a file
    and two processes writing the same file leave one whole."""
    raw = magic + json.dumps(head, sort_keys=True).encode()
    if len(raw) > HEADER:  # pragma: no cover - headers are a few hundred bytes
        raise ValueError("cache header too long")
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f"{path.name}.{os.getpid()}.{threading.get_ident()}.tmp")
    try:
        with open(tmp, "wb") as fh:
            fh.write(raw.ljust(HEADER, b"\0"))
            for c in chunks:
                fh.write(c)
        os.replace(tmp, path)
    finally:
        tmp.unlink(missing_ok=True)


def map_container(path: Path, magic: bytes, fmt: int, key: str, kind: str):
    """(mmap, head, file size) of a cache file written by ``write_container``; ValueError when it is
    too short, not ours, or of another format, key or kind."""
    with open(path, "rb") as fh:
        size = os.fstat(fh.fileno()).st_size
        if size < HEADER:
            raise ValueError("truncated header")
        mm = mmap.mmap(fh.fileno(), 0, access=mmap.ACCESS_READ)
    head_raw = bytes(mm[:HEADER]).rstrip(b"\0")
    if not head_raw.startswith(magic):
        raise ValueError("not a cache file of this kind")
    head = json.loads(head_raw[len(magic):].decode())
    if head.get("format") != fmt or head.get("key") != key or head.get("kind") != kind:
        raise ValueError("another format, key or kind")
    return mm, head, size
