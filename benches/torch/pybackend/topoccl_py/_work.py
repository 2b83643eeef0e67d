"""Work objects and the per-process-group call queue.

Every call of a process group runs in the order it was issued, on every rank alike: calls go
to one FIFO per process group, drained by one worker thread. A synchronous call
(``async_op=False``) that finds the worker idle and nothing queued runs in the caller's own
thread instead (no thread hand-off, which costs several times a small all_reduce); see
``CallQueue`` for why that keeps the order. A future's callbacks run on the
worker, right after the call they follow; calls they make run there at once (the same place
in the sequence on every rank).
"""

from __future__ import annotations

import datetime
import os
import queue
import threading
from typing import Any, Callable

import torch
import torch.distributed as dist

from ._lib import TIMEOUT, NcclError

_WorkBase = getattr(dist, "_Work", None) or torch._C._distributed_c10d.Work


class Work(_WorkBase):
    """The handle of one call: ``wait()`` blocks until it ran (raising its error, if any),
    ``get_future()`` gives a torch Future completed with the call's output tensors."""

    def __init__(self, result: Any = None, op: str = ""):
        super().__init__()
        self._op = op
        self._result = result
        self._exc: BaseException | None = None
        self._done = False
        self._cv: threading.Condition | None = None
        self._lock = threading.Lock()
        self._fut: torch.futures.Future | None = None
        # Made inside a coalescing block, which has not ended yet.
        self._deferred = False
        # The call queue that runs it (set when queued): waiting on its own worker would hang.
        self._queue: "CallQueue | None" = None

    # Completion (called once, by whichever thread ran the call) --------------------------

    def _complete(self, exc: BaseException | None = None) -> None:
        with self._lock:
            self._exc = exc
            self._done = True
            cv, fut = self._cv, self._fut
        if cv is not None:
            with cv:
                cv.notify_all()
        if fut is not None:
            _settle(fut, self._result, exc)

    # Work API ------------------------------------------------------------------------------

    def wait(self, timeout: Any = None) -> bool:
        if self._deferred:
            raise RuntimeError(
                f"topoccl: wait() on {self._op} inside a coalescing block (batch_isend_irecv, "
                "_coalescing_manager) before the block ended: it runs when the block ends"
            )
        if not self._done:
            ex = self._queue
            if ex is not None and ex._thread is threading.current_thread():
                raise RuntimeError(
                    f"topoccl: wait() on {self._op} from the process group's own worker thread (a future "
                    "callback?) would never return: callbacks run on that thread and must not wait for calls "
                    "of the same group"
                )
            secs = _seconds(timeout)
            with self._lock:
                if not self._done and self._cv is None:
                    self._cv = threading.Condition(threading.Lock())
                cv = self._cv
            if cv is not None:
                with cv:
                    if not cv.wait_for(lambda: self._done, secs):
                        raise NcclError(
                            f"topoccl: {self._op or 'operation'} did not complete within {secs:.3f} s "
                            "(work.wait timeout)",
                            TIMEOUT,
                        )
        if self._exc is not None:
            raise self._exc
        return True

    def get_future(self) -> torch.futures.Future:
        with self._lock:
            if self._fut is None:
                self._fut = torch.futures.Future()
                if self._done:
                    _settle(self._fut, self._result, self._exc)
            return self._fut

    def is_completed(self) -> bool:
        return self._done

    def is_success(self) -> bool:
        return self._done and self._exc is None

    def exception(self):
        return self._exc

    def result(self) -> list:
        self.wait()
        r = self._result
        return list(r) if isinstance(r, (list, tuple)) else ([] if r is None else [r])

    def synchronize(self) -> None:
        self.wait()

    def __repr__(self) -> str:
        state = "failed" if self._exc is not None else ("done" if self._done else "pending")
        return f"<topoccl.Work {self._op} {state}>"


def _settle(fut: torch.futures.Future, result: Any, exc: BaseException | None) -> None:
    try:
        if exc is not None:
            fut.set_exception(exc)
        else:
            fut.set_result(result if result is not None else [])
    except RuntimeError:
        # Already completed, or a callback of the user's raised: the work's own state holds.
        pass


def _seconds(timeout: Any) -> float | None:
    if timeout is None:
        return None
    if isinstance(timeout, datetime.timedelta):
        s = timeout.total_seconds()
    else:
        s = float(timeout)
    # c10d's "no timeout" is a negative or a huge duration.
    if s <= 0 or s > 1e8:
        return None
    return s


class CallQueue:
    """Runs tasks one at a time, in submission order.

    A synchronous call runs in the calling thread when nothing is queued or running
    (:meth:`try_inline`), else it is queued (:meth:`enqueue`) like an asynchronous one. Order
    argument: a call is only queued while ``pending > 0``, i.e. after every call still
    unfinished, and the worker takes ``_exec`` before running each one, so it waits for an
    inline call in progress; an inline call takes ``_exec`` under ``_mu`` at a moment nothing
    is pending.
    """

    def __init__(self, name: str, inline: str | None = None):
        self.name = name
        if inline is None:
            inline = os.environ.get("TOPOCCL_PY_INLINE", "1").strip().lower()
        # "1": synchronous calls may run inline (default); "0": every call goes through the
        # worker. Asynchronous calls always go through the worker: they return before they
        # complete (an irecv issued before an isend must not block the caller).
        self.inline = inline not in ("0", "false", "no", "off")
        self._mu = threading.Lock()
        self._exec = threading.Lock()
        self._pending = 0
        self._q: queue.SimpleQueue = queue.SimpleQueue()
        self._thread: threading.Thread | None = None
        self._closed = False

    def on_worker(self) -> bool:
        """Whether the caller is this queue's worker thread (a future callback)."""
        t = self._thread
        return t is not None and t.ident == threading.get_ident()

    def try_inline(self) -> bool:
        """Claims the queue for a call in the caller's thread, if nothing is queued or
        running (then the caller runs it and calls :meth:`end_inline`)."""
        if not self.inline:
            return False
        with self._mu:
            if self._closed:
                raise NcclError(f"topoccl: process group {self.name} was shut down")
            if self._pending == 0 and self._exec.acquire(False):
                self._pending = 1
                return True
        return False

    def end_inline(self) -> None:
        self._exec.release()
        with self._mu:
            self._pending -= 1

    def enqueue(self, task: Callable[[], None]) -> None:
        """Queues ``task`` for the worker thread (which reports its errors itself)."""
        with self._mu:
            if self._closed:
                raise NcclError(f"topoccl: process group {self.name} was shut down")
            self._pending += 1
            if self._thread is None:
                self._thread = threading.Thread(target=self._loop, name=f"topoccl-{self.name}", daemon=True)
                self._thread.start()
            self._q.put(task)

    def _loop(self) -> None:
        while True:
            task = self._q.get()
            if task is None:
                return
            with self._exec:
                try:
                    task()
                except BaseException:  # noqa: BLE001 - tasks report their own errors
                    pass
            with self._mu:
                self._pending -= 1

    def close(self, drain: bool = True) -> None:
        """Stops taking calls; with ``drain``, waits for the queued ones to finish."""
        with self._mu:
            if self._closed:
                return
            self._closed = True
            t = self._thread
            if t is not None:
                self._q.put(None)
        if t is not None and drain and t is not threading.current_thread():
            t.join()

    @property
    def idle(self) -> bool:
        return self._pending == 0
