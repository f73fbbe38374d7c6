"""The one thread that owns the llama.cpp context, fed by a queue with two priorities.

Jobs run one at a time. Within a priority they run in arrival order (FIFO: a teach queued after
an answer runs after it); a background job (Open WebUI's title or tags request) waits while any
foreground job (a user's answer, a teach) is queued, so it never delays the user's next answer
by more than the one background job already running when that answer arrives.
"""
from __future__ import annotations

import asyncio
import concurrent.futures
import heapq
import itertools
import threading

FOREGROUND, BACKGROUND = 0, 1


class Worker:
    def __init__(self, name: str = "miita-llama"):
        self._heap: list = []
        self._seq = itertools.count()
        self._cv = threading.Condition()
        self._closed = False
        self._thread = threading.Thread(target=self._loop, name=name, daemon=True)
        self._thread.start()

    def submit(self, fn, *args, priority: int = FOREGROUND) -> concurrent.futures.Future:
        fut: concurrent.futures.Future = concurrent.futures.Future()
        with self._cv:
            if self._closed:
                raise RuntimeError("the worker is closed")
            heapq.heappush(self._heap, (priority, next(self._seq), fut, fn, args))
            self._cv.notify()
        return fut

    async def run(self, fn, *args, priority: int = FOREGROUND):
        return await asyncio.wrap_future(self.submit(fn, *args, priority=priority))

    def _loop(self) -> None:
        while True:
            with self._cv:
                while not self._heap and not self._closed:
                    self._cv.wait()
                if not self._heap:
                    return
                _, _, fut, fn, args = heapq.heappop(self._heap)
            if not fut.set_running_or_notify_cancel():
                continue
            try:
                fut.set_result(fn(*args))
            except BaseException as exc:  # noqa: BLE001 -- handed to the awaiting request
                fut.set_exception(exc)

    def fail_pending(self, exc_factory) -> int:
        """Fail every queued job that has not started with ``exc_factory()`` (the server is stopping:
        whoever awaits one gets an answer now instead of after the queue); returns how many."""
        with self._cv:
            items, self._heap = self._heap, []
        n = 0
        for _, _, fut, _, _ in items:
            if fut.set_running_or_notify_cancel():
                fut.set_exception(exc_factory())
                n += 1
        return n

    def close(self) -> None:
        """Finish the queued jobs, then stop."""
        with self._cv:
            self._closed = True
            self._cv.notify()
        self._thread.join()
