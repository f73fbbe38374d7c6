"""A versioned, atomic, memory-mapped store: each version is one file of numpy arrays plus a manifest.

Why this exists: the memory bank must survive being killed at any instant (a phone app
swiped away, an OOM kill, a power cut) without ever leaving a half-written memory that
loads as garbage, and it must open in O(1) without copying the arrays into RAM. So every
commit writes a complete, immutable version file and then flips a one-line pointer.

Layout of a store ``DIR``::

    DIR/CURRENT          "v00000007\\n": the name of the committed version
    DIR/v00000007        one immutable version: one file, every array and the manifest
                         (format 3, ``store_format`` documents its bytes)
    DIR/.lock            flock target for the single writer; holds the writer's pid

A memory written in format 2 (every array's name spelled out in the header) is read as it is, and
the next commit writes it in format 3. One written before format 2 has a version *directory*
instead (``v00000007/`` with one ``.npy`` per array and ``manifest.json``, ``store_format_v1``): it
is still read, and the next commit writes a format-3 file and removes the directory like any older
version.

Atomicity argument (why a crash at any point leaves the last committed version readable):

1. Readers only ever open the version named by ``CURRENT``.
2. A writer never modifies a version that ``CURRENT`` names, or has ever named: it writes
   a *fresh* version file, fsyncs it, and then the directory (so the new name is durable).
3. Only then does it publish, by writing ``CURRENT.tmp``, fsyncing it, and ``os.replace``-ing
   it onto ``CURRENT`` (an atomic rename on POSIX: any observer, and the disk after a crash,
   sees either the old or the new name, never a mix), then fsyncing ``DIR`` so the rename
   itself is durable.
4. Older versions are deleted only after step 3 has completed, so the version ``CURRENT``
   names always exists in full.

A SIGKILL before the ``os.replace`` leaves ``CURRENT`` naming the previous, untouched
version (plus a stale half-written file, which the next writer removes under the
lock; readers never delete anything). A SIGKILL after it leaves the new, complete version.
Because the version file is fsynced before the pointer moves, the same holds for a
power cut, not just a process kill. On top of that, each version file carries a CRC32 of all
its other bytes (header, manifest, payloads), so corruption from outside (a truncated copy,
bit rot, a hand edit) is reported as a :class:`StoreError` instead of being mapped and read as
garbage -- the size the header implies is checked against the file *before* mapping, because
an array mapped past the end of its file would be a SIGBUS.
"""
from __future__ import annotations

import copy
import fcntl
import os
import shutil
import stat
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Iterator

import numpy as np

from ..errors import StoreConflict, StoreError
from .store_format import (CURRENT, CURRENT_TMP, _compact, FORMAT_VERSION, NEWEST_FORMAT, LOCK, MAX_VERSION, READ_RETRIES, VERSION_RE, Damaged,
                           encode_meta, encoded_size, file_crc32, fsync_dir, ordered_specs, read_format, read_version_file,
                           version_name, write_file, write_version_file)
from .store_format_v1 import Vanished, read_manifest_format, read_version_dir

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
    format_version: int = FORMAT_VERSION  # 1 or 2: an older version, rewritten as FORMAT_VERSION by the next commit
    #: each array's identity in this version ({name: {dtype, shape, crc32}}, the CRC32 of the whole
    #: version file, which covers every array): what derived caches (the ANN index) are keyed on.
    #: Empty for format 1, whose versions are then not cached.
    entries: dict = field(default_factory=dict)


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

    @contextmanager
    def transaction(self, opened_version: int, action: str, state: object, names: tuple[str, ...]
                    ) -> Iterator["Writer"]:
        """The store's lock, held while ``state`` (an object whose attributes ``names`` are what a
        commit is made of) is changed on copies: if another writer committed since the caller read
        ``opened_version``, StoreConflict before anything changes (merging into a bank read before
        that commit would drop its examples); if the block raises, or sets ``writer.keep = False``,
        the attributes get their old values back. The caller commits with ``writer.commit``."""
        with self.writer() as writer:
            current = self.read().version if self.exists() else 0
            if current != opened_version:
                raise StoreConflict(f"memory {self.path} changed since it was opened (version {opened_version} -> "
                                    f"{current}: another writer committed); nothing was written: open it again and "
                                    f"rerun this {action}")
            saved = {n: getattr(state, n) for n in names}
            for n, v in saved.items():
                setattr(state, n, copy.deepcopy(v))
            writer.keep = True
            try:
                yield writer
            except BaseException:
                writer.keep = False
                raise
            finally:
                if not writer.keep:
                    for n, v in saved.items():
                        setattr(state, n, v)

    def refuse_foreign(self) -> None:
        """Before a first commit: StoreError unless the directory is absent, empty or holds only the
        store's own debris (the writer's lock, an unpublished pointer or version, e.g. after a first
        ingest that failed; the next writer cleans those up)."""
        if not self.path.exists():
            return
        if not self.path.is_dir():
            raise self._fail("is not a directory")
        if not (self.path / CURRENT).exists() and any(
                p.name not in (LOCK, CURRENT_TMP) and not VERSION_RE.fullmatch(p.name) for p in self.path.iterdir()):
            raise self._fail("directory exists but is not a miita-edge memory")

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

    def read(self) -> Snapshot:
        """Open the committed version: its size checked against its header before it is mapped, its
        CRC32 before anything is returned (a format-1 version: every file against its manifest).

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
        """Open version ``name``: a format-2 file, or a format-1 directory (legacy reader)."""
        vpath = self.path / name
        try:
            mode = os.stat(vpath).st_mode
        except FileNotFoundError:
            raise self._vanished(name, f"{CURRENT} points at {name}, which") from None
        except OSError as exc:  # e.g. a symlink loop
            raise self._fail(f"cannot open {name} ({exc.strerror})") from None
        try:
            if stat.S_ISDIR(mode):
                arrays, meta, size = read_version_dir(vpath, name, verify=verify)
                fmt = 1
            elif stat.S_ISREG(mode):
                arrays, meta, size, fmt = read_version_file(vpath, name, verify=verify)
                crc = "%08x" % file_crc32(vpath)
            else:
                raise Damaged(f"{name} is neither a version file nor a version directory")
        except Damaged as exc:  # Newer too: "... has format_version 4, this miita-edge reads 1/2/3 ..."
            raise self._fail(str(exc)) from None
        except Vanished as exc:
            raise self._vanished(name, str(exc)) from None
        except FileNotFoundError:
            raise self._vanished(name, name) from None
        except (OSError, ValueError) as exc:  # unreadable, unmappable
            raise self._fail(f"cannot read {name} ({getattr(exc, 'strerror', None) or _compact(str(exc), 60)})") from None
        entries = {}
        if fmt != 1:
            entries = {k: {"dtype": v.dtype.str, "shape": list(v.shape), "crc32": crc} for k, v in arrays.items()}
        return Snapshot(version=int(name[1:]), arrays=arrays, manifest=meta, bytes_on_disk=size, format_version=fmt,
                        entries=entries)


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
        self.keep = True  # Store.transaction: False puts the caller's state back

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
                raise StoreConflict(f"memory {path} is locked by another writer (pid {_read_pid(fd)}); nothing was "
                                 f"written: run this again when that writer has finished", locked=True) from None
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
        vpath = self.store.path / name
        try:
            fv = read_manifest_format(vpath) if vpath.is_dir() else read_format(vpath)
        except OSError:
            return  # damaged or missing: overwriting is the repair
        if fv is not None and fv > NEWEST_FORMAT:
            raise self.store._fail(f"unknown format_version {fv}, this miita-edge writes {FORMAT_VERSION}; "
                                   f"refusing to overwrite")

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

        Order: write + fsync the version file, fsync DIR, write + fsync CURRENT.tmp, rename onto
        CURRENT, fsync DIR, and only then delete older versions. Bad arguments raise ValueError
        before anything touches the disk.
        """
        if self._fd is None:
            raise RuntimeError("Writer.commit() outside its `with` block")
        ordered_specs(arrays)  # validates names and dtypes
        encode_meta(manifest)  # validates the manifest
        version = self._current + 1
        if version > MAX_VERSION:
            raise self.store._fail("version counter exhausted; copy the memory to a new directory")
        path = self.store.path
        vname = version_name(version)
        vpath = path / vname
        try:
            _remove_path(vpath)  # left by an earlier failed commit of this same writer
            write_version_file(vpath, arrays, manifest, version)
            fsync_dir(path)
            write_file(path / CURRENT_TMP, [f"{vname}\n".encode("ascii")])
        except OSError as exc:
            _best_effort_remove(vpath)  # unpublished, so nobody can be reading it
            _best_effort_remove(path / CURRENT_TMP)  # e.g. created, then the disk was full
            raise self.store._fail(f"cannot write {vname} ({exc.strerror or exc})") from None
        try:
            os.replace(path / CURRENT_TMP, path / CURRENT)  # the commit point
        except OSError as exc:
            _best_effort_remove(vpath)  # rename failed: CURRENT still names the old version
            raise self.store._fail(f"cannot publish {vname} ({exc.strerror or exc})") from None
        self._current = version  # visible to readers from here on: never delete vpath now
        try:
            fsync_dir(path)
        except OSError as exc:
            raise self.store._fail(f"{vname} is published but may not be durable ({exc.strerror or exc})") from None
        try:
            self._remove_unpublished(keep=vname)
        except OSError:
            pass  # old versions are garbage now; the next writer removes what is left
        return self.store._load_version(vname, verify=False)


def _remove_path(path: Path) -> None:
    """Remove a file, link or directory tree at ``path``, if anything is there."""
    if path.is_dir() and not path.is_symlink():
        shutil.rmtree(path)
    elif path.exists() or path.is_symlink():
        os.unlink(path)


def _best_effort_remove(path: Path) -> None:
    try:
        _remove_path(path)
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
