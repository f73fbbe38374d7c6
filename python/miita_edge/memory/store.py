"""A versioned, atomic, memory-mapped directory of numpy arrays plus a JSON manifest.

Why this exists: the memory bank must survive being killed at any instant (a phone app
swiped away, an OOM kill, a power cut) without ever leaving a half-written memory that
loads as garbage, and it must open in O(1) without copying the arrays into RAM. So every
commit writes a complete, immutable version directory and then flips a one-line pointer.

Layout of a store ``DIR``::

    DIR/CURRENT          "v00000007\\n": the name of the committed version directory
    DIR/v00000007/       one immutable version
        <name>.npy       one standard .npy file per array (C order, header format 1.0)
        manifest.json    compact JSON: store metadata + the user's manifest under "meta"
    DIR/.lock            flock target for the single writer; holds the writer's pid

Atomicity argument (why a crash at any point leaves the last committed version readable):

1. Readers only ever open the directory named by ``CURRENT``.
2. A writer never modifies a directory that ``CURRENT`` names, or has ever named: it writes
   a *fresh* directory, fsyncs every file in it and then the directory itself.
3. Only then does it publish, by writing ``CURRENT.tmp``, fsyncing it, and ``os.replace``-ing
   it onto ``CURRENT`` (an atomic rename on POSIX: any observer, and the disk after a crash,
   sees either the old or the new name, never a mix), then fsyncing ``DIR`` so the rename
   itself is durable.
4. Older versions are deleted only after step 3 has completed, so the version ``CURRENT``
   names always exists in full.

A SIGKILL before the ``os.replace`` leaves ``CURRENT`` naming the previous, untouched
version (plus a stale half-written directory, which the next writer removes under the
lock; readers never delete anything). A SIGKILL after it leaves the new, complete version.
Because every file of a version is fsynced before the pointer moves, the same holds for a
power cut, not just a process kill. On top of that, the manifest records each file's size
and CRC32, so corruption from outside (a truncated copy, bit rot, a hand edit) is reported
as a :class:`StoreError` instead of being mapped and read as garbage -- sizes are checked
*before* mapping, because mapping a file shorter than its header claims would be a SIGBUS.
"""
from __future__ import annotations

import fcntl
import json
import math
import os
import re
import shutil
import zlib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
from numpy.lib import format as npy_format

from ..errors import StoreError
from .store_format import (CRC_CHUNK, CURRENT, CURRENT_TMP, FORMAT_VERSION, LOCK, MANIFEST, MAX_NAME, MAX_VERSION,
                           NAME_RE, NUMERIC_KINDS, READ_RETRIES, VERSION_RE, check_array, check_meta,
                           encode_manifest, encoded_size, fsync_dir, map_open, npy_header, version_name, write_file,
                           write_npy)

__all__ = ["FORMAT_VERSION", "Snapshot", "Store", "Writer", "encoded_size"]

@dataclass(frozen=True, eq=False)
class Snapshot:
    """One committed version, opened read-only.

    ``eq=False``: the fields hold arrays, whose ``==`` is elementwise, so value equality
    of snapshots would be ill-defined; identity is what callers can rely on.
    """

    version: int
    arrays: dict[str, np.ndarray]
    manifest: dict
    bytes_on_disk: int
    #: each array's store entry (dtype, shape, bytes, crc32): what derived caches are keyed on
    entries: dict = field(default_factory=dict)


def _compact(value: Any, limit: int = 80) -> str:
    """One-line rendering of a JSON value for error messages, shortened if long."""
    try:
        text = json.dumps(value, separators=(",", ":"), sort_keys=True, ensure_ascii=True, default=repr)
    except (TypeError, ValueError):
        text = repr(value)
    text = text.replace("\n", " ")
    return text if len(text) <= limit else text[: limit - 3] + "..."


def _first_difference(key: str, actual: Any, expected: Any) -> tuple[str, Any, Any]:
    """Descend into nested dicts to name the innermost differing key (e.g. fingerprint.layer)."""
    while isinstance(actual, dict) and isinstance(expected, dict):
        diff = [k for k in sorted(set(actual) | set(expected), key=str) if actual.get(k, _MISSING) != expected.get(k, _MISSING)]
        if len(diff) != 1 or diff[0] not in actual or diff[0] not in expected:
            break
        key = f"{key}.{diff[0]}"
        actual, expected = actual[diff[0]], expected[diff[0]]
    return key, actual, expected


class _Missing:
    def __repr__(self) -> str:
        return "<missing>"


_MISSING = _Missing()


class _Retry(Exception):
    """Internal: the version being read vanished because CURRENT moved; start over."""


# --------------------------------------------------------------------------- store


class Store:
    """A memory directory. Constructing one does no I/O; readers never lock or modify."""

    def __init__(self, path: str | os.PathLike) -> None:
        self.path = Path(path)

    def __repr__(self) -> str:
        return f"Store({str(self.path)!r})"

    def exists(self) -> bool:
        """True when a committed version is present (CURRENT exists); validity is read()'s job."""
        return (self.path / CURRENT).is_file()

    def writer(self, *, wait: bool = False) -> "Writer":
        """The single writer, as a context manager; the lock is taken on ``__enter__``."""
        return Writer(self, wait=wait)

    # ---------------------------------------------------------------- reading

    def _fail(self, problem: str) -> StoreError:
        return StoreError(f"memory {self.path}: {problem}")

    def _read_current(self) -> str | None:
        """The version dir name CURRENT names, None if there is no CURRENT."""
        try:
            raw = (self.path / CURRENT).read_bytes()
        except FileNotFoundError:
            return None
        except NotADirectoryError:
            raise self._fail("is not a directory") from None
        except OSError as exc:
            raise self._fail(f"cannot read {CURRENT} ({exc.strerror})") from None
        text = raw.decode("ascii", errors="replace").strip()
        if not VERSION_RE.fullmatch(text):
            raise self._fail(f"{CURRENT} is corrupt (expected a version name, got {_compact(text, 40)})")
        return text

    def read(self, *, expect: dict | None = None) -> Snapshot:
        """Open the committed version, verifying every file against the manifest.

        ``expect``: manifest keys whose values must match (e.g. the model fingerprint), so a
        memory built for another model is refused with a message naming the key.

        Concurrency: a writer may commit and delete the version we picked between reading
        CURRENT and opening its files. Versions are immutable and only ever deleted after
        CURRENT moved past them, so a missing file while CURRENT has moved means "retry",
        while a missing file with CURRENT unchanged is genuine damage.
        """
        for _ in range(READ_RETRIES):
            if not self.path.exists():
                raise self._fail("does not exist")
            if not self.path.is_dir():
                raise self._fail("is not a directory")
            name = self._read_current()
            if name is None:
                raise self._fail(f"is not a memory store (no {CURRENT} file: nothing committed)")
            try:
                snap = self._load_version(name, verify=True)
            except _Retry:
                continue
            if expect:
                self._check_expect(snap.manifest, expect)
            return snap
        raise self._fail(f"kept changing while being read ({READ_RETRIES} attempts); is a writer looping?")

    def _moved(self, name: str) -> bool:
        try:
            return self._read_current() != name
        except StoreError:
            return True

    def _vanished(self, name: str, what: str) -> Exception:
        """A file of version ``name`` is missing: a race (retry) or damage (error)."""
        if self._moved(name):
            return _Retry()
        return self._fail(f"{what} is missing")

    def _load_version(self, name: str, *, verify: bool) -> Snapshot:
        vdir = self.path / name
        if not vdir.is_dir():
            raise self._vanished(name, f"{CURRENT} points at {name}, which")
        try:
            raw = (vdir / MANIFEST).read_bytes()
        except FileNotFoundError:
            raise self._vanished(name, f"{name}/{MANIFEST}") from None
        except OSError as exc:
            raise self._fail(f"cannot read {name}/{MANIFEST} ({exc.strerror})") from None
        doc = self._parse_manifest(name, raw)
        # Every file of a version is listed in its manifest: an array file the manifest does not
        # list means the manifest lost an entry (an edit, a bad copy), and reading the rest would
        # silently drop that array (found by the corruption campaign).
        try:
            present = set(os.listdir(vdir))
        except FileNotFoundError:
            raise self._vanished(name, f"{name}") from None
        except OSError as exc:
            raise self._fail(f"cannot list {name} ({exc.strerror})") from None
        extra = present - {MANIFEST} - {f"{a}.npy" for a in doc["arrays"]}
        if extra:
            shown = ", ".join(sorted(extra))
            raise self._fail(f"{name} holds files its manifest does not list ({shown[:80]})")
        arrays: dict[str, np.ndarray] = {}
        total = len(raw)
        for aname, entry in doc["arrays"].items():
            arrays[aname] = self._load_array(name, aname, entry, verify=verify)
            total += entry["bytes"]
        return Snapshot(version=int(doc["version"]), arrays=arrays, manifest=doc["meta"], bytes_on_disk=total,
                        entries=doc["arrays"])

    def _parse_manifest(self, name: str, raw: bytes) -> dict:
        """Decode and structurally validate manifest.json, format_version first."""
        where = f"{name}/{MANIFEST}"
        try:
            doc = json.loads(raw.decode("utf-8"))
        except (UnicodeDecodeError, ValueError, RecursionError):  # RecursionError: absurdly deep nesting
            raise self._fail(f"{where} is corrupt (not valid JSON)") from None
        if not isinstance(doc, dict):
            raise self._fail(f"{where} is malformed (not a JSON object)")
        fv = doc.get("format_version")
        if not isinstance(fv, int) or isinstance(fv, bool):
            raise self._fail(f"{where} is malformed (no integer format_version)")
        if fv != FORMAT_VERSION:
            newer = " (written by a newer miita-edge; upgrade)" if fv > FORMAT_VERSION else ""
            raise self._fail(f"unknown format_version {fv}, this miita-edge reads {FORMAT_VERSION}{newer}")

        def bad(why: str) -> StoreError:
            return self._fail(f"{where} is malformed ({why})")

        version = doc.get("version")
        if not isinstance(version, str) or "v" + version != name:
            raise bad(f"version {_compact(version, 20)} does not match directory {name}")
        if not isinstance(doc.get("meta"), dict):
            raise bad("meta is not an object")
        entries = doc.get("arrays")
        if not isinstance(entries, dict):
            raise bad("arrays is not an object")
        for aname, e in entries.items():
            if not NAME_RE.fullmatch(aname) or len(aname) > MAX_NAME:
                raise bad(f"bad array name {_compact(aname, 40)}")
            if not isinstance(e, dict):
                raise bad(f"entry for {aname} is not an object")
            invalid = bad(f"entry for {aname} lacks a valid dtype/shape/bytes/crc32")
            try:
                descr, shape, crc, nbytes = e["dtype"], e["shape"], e["crc32"], e["bytes"]
                if not (isinstance(descr, str) and isinstance(shape, list) and isinstance(crc, str)):
                    raise invalid
                dtype = npy_format.descr_to_dtype(descr)
            except (KeyError, TypeError, ValueError):
                raise invalid from None
            if dtype.kind not in NUMERIC_KINDS or dtype.fields is not None:
                raise bad(f"{aname} has non-numeric dtype {_compact(descr, 20)}")
            if not all(isinstance(d, int) and not isinstance(d, bool) and d >= 0 for d in shape):
                raise invalid
            if not re.fullmatch(r"[0-9a-f]{8}", crc):
                raise invalid
            try:
                header_len = len(npy_header(descr, tuple(shape)))
            except ValueError:  # e.g. a header beyond the .npy 1.0 limit
                raise invalid from None
            expected = header_len + math.prod(shape) * dtype.itemsize
            if nbytes != expected:
                raise bad(f"{aname} records {nbytes!r} bytes but dtype/shape imply {expected}")
        return doc

    def _load_array(self, name: str, aname: str, entry: dict, *, verify: bool) -> np.ndarray:
        """Size-check, CRC-check, then map one array read-only.

        The size check comes first and is what makes mapping safe: a file shorter than its
        header claims would map fine and then SIGBUS on access.
        """
        rel = f"{name}/{aname}.npy"
        fpath = self.path / name / f"{aname}.npy"
        want = entry["bytes"]
        try:
            with open(fpath, "rb") as fh:
                size = os.fstat(fh.fileno()).st_size
                if size != want:
                    kind = "truncated" if size < want else "oversized"
                    raise self._fail(f"{rel} is {kind} ({size} bytes, manifest says {want})")
                if verify:
                    crc = 0
                    while chunk := fh.read(CRC_CHUNK):
                        crc = zlib.crc32(chunk, crc)
                    if "%08x" % crc != entry["crc32"]:
                        raise self._fail(f"{rel} is corrupt (CRC32 mismatch)")
                fh.seek(0)
                if math.prod(entry["shape"]) == 0:
                    # Nothing to map; mapping an empty data section is refused by some numpy versions.
                    arr = np.load(fh, allow_pickle=False)
                    arr.flags.writeable = False
                else:
                    # Same open file description as the CRC pass: a concurrent unlink cannot
                    # swap the inode between verification and mapping.
                    arr = map_open(fh)
        except FileNotFoundError:
            raise self._vanished(name, rel) from None
        except StoreError:
            raise
        except (OSError, ValueError) as exc:
            raise self._fail(f"{rel} is corrupt ({_compact(str(exc), 60)})") from None
        if arr.dtype != npy_format.descr_to_dtype(entry["dtype"]) or list(arr.shape) != entry["shape"]:
            raise self._fail(f"{rel} does not match its manifest entry (dtype/shape)")
        return arr

    def _check_expect(self, manifest: dict, expect: dict) -> None:
        for key, want in expect.items():
            have = manifest.get(key, _MISSING)
            if have != want:
                path, a, b = _first_difference(str(key), have, want)
                shown_a = "missing" if a is _MISSING else _compact(a)
                shown_b = "missing" if b is _MISSING else _compact(b)
                raise self._fail(f"{path} is {shown_a}, expected {shown_b}")


# --------------------------------------------------------------------------- writer


class Writer:
    """Exclusive writer: holds ``flock(DIR/.lock)`` from ``__enter__`` to ``__exit__``.

    Why flock: it is released by the kernel when the process dies, even by SIGKILL, so a
    crashed writer can never leave the memory permanently locked.
    """

    def __init__(self, store: Store, *, wait: bool = False) -> None:
        self.store = store
        self.wait = wait
        self._fd: int | None = None
        self._current: int = 0  # version CURRENT names; 0 = nothing committed yet

    def __enter__(self) -> "Writer":
        if self._fd is not None:
            raise RuntimeError("Writer is not re-entrant")
        path = self.store.path
        try:
            path.mkdir(parents=True, exist_ok=True)
        except FileExistsError:
            raise self.store._fail("is not a directory") from None
        except OSError as exc:
            raise self.store._fail(f"cannot create directory ({exc.strerror})") from None
        try:
            fd = os.open(path / LOCK, os.O_RDWR | os.O_CREAT, 0o644)
        except OSError as exc:
            raise self.store._fail(f"cannot open {LOCK} ({exc.strerror})") from None
        try:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | (0 if self.wait else fcntl.LOCK_NB))
            except BlockingIOError:
                # Said in full: a user who ran two ingests at once must know that this one changed
                # nothing and what to do (the concurrency campaign, docs/reliability.md).
                raise StoreError(f"memory {path} is locked by another writer (pid {_read_pid(fd)}); nothing was "
                                 f"written: run this again when that writer has finished") from None
            except OSError as exc:
                raise self.store._fail(f"cannot lock {LOCK} ({exc.strerror or exc})") from None
            _write_pid(fd)
            self._fd = fd
            try:
                self._recover()
            except OSError as exc:  # e.g. debris in a read-only directory: the committed version is intact
                raise self.store._fail(f"cannot remove an unfinished earlier write ({exc.strerror or exc}: "
                                       f"{exc.filename or '?'})") from None
        except BaseException:
            self._fd = None
            os.close(fd)
            raise
        return self

    def __exit__(self, *exc_info: object) -> None:
        if self._fd is not None:
            fd, self._fd = self._fd, None
            os.close(fd)  # closing the last fd of the open file description drops the flock

    def _recover(self) -> None:
        """Under the lock: learn the current version and remove debris of crashed writers.

        Anything version-shaped that CURRENT does not name was never published (or is an
        old version whose deletion was interrupted), so no reader can be using it.
        """
        store = self.store
        name = store._read_current()
        self._current = int(name[1:]) if name else 0
        if name:
            self._refuse_newer_format(name)
        self._remove_unpublished(keep=name)

    def _refuse_newer_format(self, name: str) -> None:
        """Never overwrite (and so delete) a memory written by a newer miita-edge."""
        try:
            doc = json.loads((self.store.path / name / MANIFEST).read_bytes())
        except (OSError, ValueError):
            return  # damaged or missing: overwriting is the repair
        fv = doc.get("format_version") if isinstance(doc, dict) else None
        if isinstance(fv, int) and fv > FORMAT_VERSION:
            raise self.store._fail(f"unknown format_version {fv}, this miita-edge writes {FORMAT_VERSION}; refusing to overwrite")

    def _remove_unpublished(self, keep: str | None) -> None:
        path = self.store.path
        removed = False
        for entry in os.scandir(path):
            if entry.name == CURRENT_TMP:
                os.unlink(entry.path)
                removed = True
            elif VERSION_RE.fullmatch(entry.name) and entry.name != keep:
                if entry.is_dir(follow_symlinks=False):
                    shutil.rmtree(entry.path)
                else:
                    os.unlink(entry.path)
                removed = True
        if removed:
            fsync_dir(path)

    def commit(self, arrays: dict[str, np.ndarray], manifest: dict) -> Snapshot:
        """Atomically publish a new version; see the module docstring for the argument.

        Order: write + fsync each .npy, write + fsync manifest.json, fsync the version dir,
        write + fsync CURRENT.tmp, rename onto CURRENT, fsync DIR, and only then delete
        older versions. Bad arguments raise ValueError before anything touches the disk.
        """
        if self._fd is None:
            raise RuntimeError("Writer.commit() outside its `with` block")
        check_meta(manifest)
        checked = {name: check_array(name, arr) for name, arr in arrays.items()}
        try:
            json_meta = json.dumps(manifest, ensure_ascii=True, allow_nan=False)
        except (TypeError, ValueError) as exc:
            raise ValueError(f"manifest is not JSON-serializable: {exc}") from None
        if json.loads(json_meta) != manifest:
            raise ValueError("manifest does not round-trip through JSON (tuples, non-str keys?)")
        version = self._current + 1
        if version > MAX_VERSION:
            raise self.store._fail("version counter exhausted; copy the memory to a new directory")
        path = self.store.path
        vname = version_name(version)
        vdir = path / vname
        try:
            if vdir.exists():  # left by an earlier failed commit of this same writer
                shutil.rmtree(vdir)
            vdir.mkdir()
            crcs = {name: write_npy(vdir / f"{name}.npy", arr) for name, arr in checked.items()}
            raw = encode_manifest(checked, crcs, manifest, version)
            write_file(vdir / MANIFEST, [raw])
            fsync_dir(vdir)
            write_file(path / CURRENT_TMP, [f"{vname}\n".encode("ascii")])
        except OSError as exc:
            _best_effort_rmtree(vdir)  # unpublished, so nobody can be reading it
            _best_effort_unlink(path / CURRENT_TMP)  # e.g. created, then the disk was full
            raise self.store._fail(f"cannot write {vname} ({exc.strerror or exc})") from None
        try:
            os.replace(path / CURRENT_TMP, path / CURRENT)  # the commit point
        except OSError as exc:
            _best_effort_rmtree(vdir)  # rename failed: CURRENT still names the old version
            raise self.store._fail(f"cannot publish {vname} ({exc.strerror or exc})") from None
        self._current = version  # visible to readers from here on: never delete vdir now
        try:
            fsync_dir(path)
        except OSError as exc:
            raise self.store._fail(f"{vname} is published but may not be durable ({exc.strerror or exc})") from None
        try:
            self._remove_unpublished(keep=vname)
        except OSError:
            pass  # old versions are garbage now; the next writer removes what is left
        return self.store._load_version(vname, verify=False)


def _best_effort_rmtree(path: Path) -> None:
    try:
        shutil.rmtree(path)
    except OSError:
        pass


def _best_effort_unlink(path: Path) -> None:
    try:
        os.unlink(path)
    except OSError:
        pass


def _write_pid(fd: int) -> None:
    """Record the writer's pid in the lock file, best effort: it only serves the "locked by
    another writer (pid N)" message, so a full disk or a file-size limit must not fail the write
    for it. pwrite before truncating: overwriting the existing bytes needs no new disk block."""
    pid = f"{os.getpid()}\n".encode()
    try:
        os.pwrite(fd, pid, 0)
        os.ftruncate(fd, len(pid))
    except OSError:
        try:
            os.ftruncate(fd, 0)  # no stale pid of an earlier writer: the message says "unknown"
        except OSError:
            pass


def _read_pid(fd: int) -> str:
    try:
        text = os.pread(fd, 32, 0).decode("ascii", errors="replace").strip()
    except OSError:
        return "unknown"
    return text if text.isdigit() else "unknown"
