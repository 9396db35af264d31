"""A pool of scorer processes with a per-task timeout, whose dead or stuck workers are replaced.

Why processes: a scorer that hangs in user code (``time.sleep``, a sandbox that never answers,
a regex that backtracks forever) cannot be interrupted inside the trainer's process; a worker
process can be killed.  :meth:`ScorerPool.map` hands one task at a time to each worker, and

* a task that runs longer than ``timeout_s`` has its worker killed (SIGKILL, reaped later without
  waiting) and gets :attr:`Outcome.timed_out`; a fresh fork takes the slot when a task needs it;
* a worker that dies (``os._exit`` or a segfault in the scorer, the OOM killer) gives its task
  :attr:`Outcome.error` = ``"worker process died (exit code N)"`` and is replaced;
* an exception in the scorer is caught in the worker and returned as :attr:`Outcome.error`;
  ``sys.exit`` or ``KeyboardInterrupt`` in the scorer also sets :attr:`Outcome.exited` (the
  managers stop the run on it: :mod:`rlforge.rewards.exits`).

Workers are ``fork`` children of the trainer (as PyTorch's DataLoader workers and verl's
``PrimeRewardManager`` pool are), started on the first :meth:`map`, so the scorer function itself
is inherited, never pickled: a function defined in a test or loaded from
``custom_reward_function.path`` works as is.  Arguments and results travel by pickle.  The
workers are daemonic: they end with the trainer, and a scorer cannot start a
``multiprocessing`` pool of its own (``subprocess`` works).  A scorer should not use torch's
intra-op thread pool in a forked worker (it may hang, as in any fork).

Source: the idea of verl's ``PrimeRewardManager`` (``verl/workers/reward_manager/prime.py``:
a process pool with a per-sample timeout and score 0 on failure); this pool differs in replacing
killed workers instead of tearing the whole pool down.
"""

from __future__ import annotations

import multiprocessing as mp
import signal
import time
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from multiprocessing.connection import Connection, wait
from typing import Any

from rlforge.rewards.exits import USER_EXITS, exit_reason


@dataclass
class Outcome:
    """Result of one task: ``value`` when ``ok``; else ``error`` (a message; ``raised``: the scorer raised,
    and ``error`` is ``"<ExceptionType>: <message>"``) or ``timed_out``.  ``exited``: the scorer tried to
    end its process (``SystemExit``/``KeyboardInterrupt``), and ``error`` is
    :func:`rlforge.rewards.exits.exit_reason`."""

    ok: bool
    value: Any = None
    error: str = ""
    timed_out: bool = False
    raised: bool = False
    exited: bool = False


def _worker_main(fn: Callable[..., Any], conn: Connection, parent_end: Connection | None) -> None:
    """Worker loop: receive ``(index, kwargs)``, send ``(index, ok, value_or_message, exited)``; None stops."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C is the trainer's to handle
    if parent_end is not None:
        parent_end.close()
    while True:
        try:
            msg = conn.recv()
        except (EOFError, OSError):
            return
        if msg is None:
            return
        index, kwargs = msg
        try:
            out = fn(**kwargs)
            conn.send((index, True, out, False))
        except USER_EXITS as e:  # SIGINT is ignored here: this came from the user's code
            conn.send((index, False, exit_reason(e), True))
        except BaseException as e:  # noqa: BLE001 - anything else the user's code raises is its sample's error
            conn.send((index, False, f"{type(e).__name__}: {e}", False))


@dataclass
class _Worker:
    proc: Any
    conn: Connection


class ScorerPool:
    """``num_workers`` forked processes that call ``fn(**kwargs)``, one task each at a time.

    Args:
        fn: the scorer, called with keywords.
        num_workers: processes (>= 1).
        timeout_s: limit per task in seconds, counted from when a worker takes it; None = no limit.

    Counters :attr:`num_replaced` (workers killed or found dead and replaced since creation).
    """

    def __init__(self, fn: Callable[..., Any], num_workers: int, timeout_s: float | None = None) -> None:
        if num_workers < 1:
            raise ValueError(f"num_workers must be >= 1, got {num_workers}")
        self.fn = fn
        self.num_workers = int(num_workers)
        self.timeout_s = None if timeout_s is None else float(timeout_s)
        self.num_replaced = 0
        self._ctx = mp.get_context("fork")
        self._workers: list[_Worker | None] = []
        self._dying: list[_Worker] = []

    def _start_worker(self) -> _Worker:
        parent_end, child_end = self._ctx.Pipe(duplex=True)
        proc = self._ctx.Process(target=_worker_main, args=(self.fn, child_end, parent_end), daemon=True,
                                 name="rlforge-scorer")
        proc.start()
        child_end.close()
        return _Worker(proc, parent_end)

    def _retire(self, slot: int) -> None:
        """Kill the worker in ``slot`` (SIGKILL, no waiting: it is reaped later) and leave the slot empty;
        a fresh fork fills it when a task needs it."""
        w = self._workers[slot]
        if w is None:
            return
        if w.proc.is_alive():
            w.proc.kill()
        w.conn.close()
        self._dying.append(w)
        self._workers[slot] = None
        self.num_replaced += 1

    def _reap(self) -> None:
        """Join retired workers that have exited (never blocks)."""
        alive = []
        for w in self._dying:
            w.proc.join(timeout=0)
            if w.proc.exitcode is None:
                alive.append(w)
        self._dying = alive

    def map(self, tasks: Sequence[dict[str, Any]]) -> list[Outcome]:
        """Run ``fn(**task)`` for every task; outcomes in task order.  Never raises for a task's failure."""
        self._reap()
        self._workers += [None] * (self.num_workers - len(self._workers))
        results: list[Outcome | None] = [None] * len(tasks)
        pending = deque(range(len(tasks)))
        busy: dict[int, tuple[int, float]] = {}  # worker slot -> (task index, deadline)
        while pending or busy:
            for slot in range(self.num_workers):
                if slot in busy or not pending:
                    continue
                if self._workers[slot] is None:
                    self._workers[slot] = self._start_worker()
                w = self._workers[slot]
                idx = pending.popleft()
                try:
                    w.conn.send((idx, dict(tasks[idx])))
                except Exception as e:  # noqa: BLE001 - an argument that cannot be pickled
                    results[idx] = Outcome(False, error=f"cannot send the sample to a worker: {type(e).__name__}: {e}")
                    continue
                deadline = time.monotonic() + self.timeout_s if self.timeout_s is not None else float("inf")
                busy[slot] = (idx, deadline)
            if not busy:
                continue
            nearest = min(d for _, d in busy.values())
            wait_s = None if nearest == float("inf") else max(0.0, nearest - time.monotonic())
            handles: list[Any] = []
            for slot in busy:
                handles += [self._workers[slot].conn, self._workers[slot].proc.sentinel]
            wait(handles, timeout=wait_s)
            now = time.monotonic()
            for slot in list(busy):
                idx, deadline = busy[slot]
                outcome = self._collect(slot)
                if outcome is None and now >= deadline:
                    outcome = Outcome(False, error=f"timed out after {self.timeout_s:g} s", timed_out=True)
                    self._retire(slot)
                if outcome is not None:
                    results[idx] = outcome
                    del busy[slot]
        return [r if r is not None else Outcome(False, error="not scored") for r in results]

    def _collect(self, slot: int) -> Outcome | None:
        """The answer of the worker in ``slot`` if it has one; an error outcome if it died; else None."""
        w = self._workers[slot]
        try:
            if w.conn.poll():
                _, ok, value, exited = w.conn.recv()
                return Outcome(True, value=value) if ok else Outcome(False, error=str(value), raised=True,
                                                                     exited=exited)
        except (EOFError, OSError):
            pass
        else:
            if w.proc.is_alive():
                return None
        w.proc.join(timeout=5)
        code = w.proc.exitcode
        self._retire(slot)
        return Outcome(False, error=f"worker process died (exit code {code})")

    def close(self) -> None:
        """Stop every worker (idle ones exit on their own; busy or stuck ones are killed)."""
        live = [w for w in self._workers if w is not None]
        for w in live:
            try:
                w.conn.send(None)
            except OSError:
                pass
        for w in live + self._dying:
            w.proc.join(timeout=1)
            if w.proc.is_alive():
                w.proc.kill()
                w.proc.join(timeout=5)
            w.conn.close()
        self._workers, self._dying = [], []
