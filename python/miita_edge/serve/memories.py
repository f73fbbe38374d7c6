"""The memories one server serves, and the single worker that owns the llama.cpp context.

Concurrency: every piece of model work (answering, teaching, forgetting, opening a memory) is a job
on one worker thread (``worker.Worker``), so the one llama.cpp context serves requests one at a time
in arrival order (background tasks after the queued foreground jobs). A job first brings its memory
up to the committed version on disk (another process may have written), then runs start to end on
that version: a teach's commit is itself a job, so it can never land in the middle of an answer, and each
response names the version it used. Writes go through the facade (``Miita.ingest``/``forget``),
under the store's lock, committed atomically; a write that finds the memory changed (or locked) by
another process reopens it and retries. A teach decodes its rows in small worker jobs before that
commit (``jobs.py``), so answers run between its batches.

Memories under ``--memory-root`` are whatever that directory holds: the ones created by an earlier
run are served again after a restart, and ``--max-memories`` counts what is on disk there. No
response names a server path: errors from the library are rewritten with memory names (``public``).
"""
from __future__ import annotations

import threading
from pathlib import Path

from ..errors import InputError, StoreConflict
from ..memory import store as store_mod
from ..memory.budget import parse_budget
from ..miita import Miita
from ..runtime.engine import Engine, EngineConfig
from .errors import APIError, as_api_error, bounded, bounded_list, scrub_paths
from .jobs import Jobs
from .settings import NAME_RE, Settings
from .worker import FOREGROUND, Worker


def committed_version(store: store_mod.Store) -> int:
    name = store._read_current()
    return 0 if name is None else int(name[1:])


def memories_under(root: Path | None) -> dict[str, Path]:
    """The memories on disk under ``root``: each subdirectory with a memory's name and a committed
    version (sorted by name). Read at start and at each create, so what another run (or process)
    created there counts too."""
    if root is None or not Path(root).is_dir():
        return {}
    found = {}
    for p in sorted(Path(root).iterdir()):
        if NAME_RE.fullmatch(p.name) and p.is_dir() and store_mod.Store(p).exists():
            found[p.name] = p
    return found


class Registry:
    def __init__(self, settings: Settings):
        self.settings = settings
        self.worker = Worker()
        # A stop ends a reply only after its first non-blank character: the bundled Gemma opens 90 of
        # tests/data/offtopic.txt's 202 questions with a newline, which would end the reply as "".
        self.engine = Engine(settings.model, EngineConfig(n_threads=settings.threads, n_ctx=settings.n_ctx,
                                                          stop_after_text=True))
        stem = self.engine.info.path.name
        for suffix in (".gguf", ".GGUF"):
            stem = stem.removesuffix(suffix)
        self.model_id = stem.lower().replace("_", "-")
        # --memory names first; then what --memory-root holds (a --memory of the same name wins)
        self.dirs: dict[str, Path] = {**memories_under(settings.memory_root), **settings.memories}
        self.open: dict[str, Miita] = {}
        self.frozen: Miita | None = None  # no memory: the plain template, nothing stored
        self.jobs = Jobs(settings.max_teach_jobs)
        # set when the server starts to stop: answers stop at their next token, queued work is
        # refused, teach jobs are cancelled at their next batch (nothing committed)
        self.closing = threading.Event()

    def begin_shutdown(self) -> None:
        """On the event loop, at the stop signal: so that the server stops in seconds, not after its queue."""
        self.closing.set()
        self.worker.fail_pending(shutting_down)
        for job in self.jobs.active():
            self.jobs.cancel(job)

    def close(self) -> None:
        self.closing.set()
        self.worker.fail_pending(shutting_down)
        self.worker.close()
        self.engine.close()

    async def run(self, fn, *args, priority: int = FOREGROUND):
        """Queue ``fn`` on the worker that owns the context; await its result. A failure comes back
        as the ``APIError`` a client sees, without server paths."""
        if self.closing.is_set():
            raise shutting_down()
        try:
            return await self.worker.run(fn, *args, priority=priority)
        except APIError:
            raise
        except Exception as exc:  # noqa: BLE001 -- every other failure, as the client sees it
            raise self.public(as_api_error(exc)) from None

    def public(self, err: APIError) -> APIError:
        """``err`` with every server path replaced: a memory directory by the memory's name, the
        memory root and the model file by what the client calls them."""
        names: dict[str, str] = {}
        places = [(p, n) for n, p in self.dirs.items()] + [(self.engine.info.path, self.model_id)]
        if self.settings.memory_root is not None:
            places.append((self.settings.memory_root, "--memory-root"))
        for path, name in places:
            for form in {str(path), str(Path(path).expanduser().resolve())}:
                names[form] = name
        err.message = scrub_paths(err.message, names)
        return err

    def check_budget(self, text: str) -> None:
        """A budget a client sets (create, teach): ``none`` only with ``--allow-unlimited-budget``,
        since an unlimited memory can grow until the disk is full."""
        if parse_budget(text).unlimited and not self.settings.allow_unlimited_budget:
            raise APIError(403, f"budget {bounded(text)}: an unlimited budget needs the server flag "
                           "--allow-unlimited-budget; give a size (e.g. 64KiB) or a share (e.g. 1%)",
                           "unlimited_budget_not_allowed", "budget")

    # -------------------------------------------------------------- naming
    def resolve(self, model: str) -> str | None:
        """The memory a request's ``model`` names (None: the frozen model); 404 if unknown."""
        if model in (self.model_id, "miita-edge"):
            return None
        name = model.rsplit(":", 1)[1] if ":" in model else model  # MODEL:NAME (any model prefix) or NAME
        if name in self.dirs:
            return name
        raise APIError(404, f"model {bounded(model)} not found: served are {bounded_list(self.model_ids())}",
                       "model_not_found", "model")

    def model_ids(self) -> list[str]:
        return [self.model_id] + [f"{self.model_id}:{n}" for n in self.dirs]

    def known(self, name: str) -> Path:
        if name not in self.dirs:
            raise APIError(404, f"memory {bounded(name)} not found: served are {bounded_list(self.dirs)}",
                           "memory_not_found")
        return self.dirs[name]

    # -------------------------------------------------------------- worker-side (run via self.run)
    def memory(self, name: str | None) -> Miita:
        """The memory at its committed version (reopened when another writer moved it)."""
        if name is None:
            if self.frozen is None:
                import tempfile

                self.frozen = Miita(memory=Path(tempfile.mkdtemp(prefix="miita-frozen-")), engine=self.engine)
            return self.frozen
        m = self.open.get(name)
        if m is None or committed_version(m.store) != m.version:
            m = Miita(memory=self.dirs[name], engine=self.engine)
            self.open[name] = m
        return m

    def write(self, name: str, op):
        """Run ``op(miita)`` (an ingest or a forget) on the newest version; retry when another
        process committed between our reopen and the store's lock."""
        import time

        for attempt in range(50):
            m = self.memory(name)
            try:
                return m, op(m)
            except StoreConflict as exc:
                busy = exc.locked
                if attempt == 49:
                    raise
                self.open.pop(name, None)
                if busy:  # another process is writing: wait for its commit (up to ~10 s in all)
                    time.sleep(0.2)
        raise AssertionError("unreachable")

    def create(self, name: str, budget: str, template: str, preset: str) -> dict:
        from ..method.templates import get_template

        if name in self.dirs:
            raise APIError(409, f"memory {name!r} already exists", "memory_exists", "name")
        self.check_budget(budget)
        get_template(template)
        root = self.settings.memory_root
        if root is None:
            raise APIError(400, "this server has no --memory-root: new memories cannot be created", "no_memory_root")
        on_disk = memories_under(root)
        if name in on_disk:  # created there by another process since this one started
            raise APIError(409, f"memory {name!r} already exists under --memory-root", "memory_exists", "name")
        if len(on_disk) >= self.settings.max_memories:
            raise APIError(409, f"--memory-root holds {len(on_disk)} memories, the most this server creates "
                           f"(--max-memories {self.settings.max_memories})", "too_many_memories")
        path = Path(root) / name
        m = Miita(memory=path, template=template, preset=preset, engine=self.engine)
        if m.store.exists():
            raise APIError(409, f"memory {name!r} already exists under --memory-root", "memory_exists", "name")
        m.budget_spec = budget
        with m.store.writer() as w:  # commit an empty version: the memory exists for every process
            m.version = w.commit(m.bank.to_arrays(), m.manifest()).version
        self.dirs[name] = path
        self.open[name] = m
        return info(name, m)


def shutting_down() -> APIError:
    return APIError(503, "the server is shutting down", "shutting_down")


def info(name: str, m: Miita) -> dict:
    """``Miita.info()`` with the memory's name where the library puts its directory."""
    out = m.info() if m.store.exists() else {"version": 0, "examples": 0, "prototypes": 0, "anchors": 0}
    out.update(name=name, memory=name)
    return out


__all__ = ["Registry", "committed_version", "info", "InputError"]
