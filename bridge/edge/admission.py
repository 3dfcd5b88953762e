"""Admission of password checks: which CONNECT's scrypt check runs when.

A password check costs about 0.1 s of CPU and 32 MiB on purpose, so a burst
of wrong-password CONNECTs (600 in 0.1 s, each socket closed at once) would
otherwise queue minutes of hashing in front of every legitimate client. The
:class:`AuthQueue` decides, on the event loop, for each CONNECT that needs a
check:

* **refuse at once** (:meth:`AuthQueue.submit` returns the reason, the server
  answers CONNACK 0x89 Server busy, 3.x 0x03 Server unavailable
  [``LG-edge-auth-busy``]) when ``edge.auth_max_pending`` checks already wait
  for a worker, or the remote address already has
  ``edge.auth_max_pending_per_address`` checks waiting or running;
* **refuse at once** as well while the remote address is **backing off**:
  after its n-th failed check in a row (wrong user name or password), n >= 3
  (two typos are free), an address is refused for
  ``min(0.1 s * 2**(n-3), edge.auth_failure_backoff_s)`` (0.1 s, 0.2 s,
  0.4 s... up to the cap); a successful check clears its record, and so does
  ``2 * auth_failure_backoff_s`` without a failure;
* otherwise **queue** it. At most ``edge.auth_workers`` checks run at a time,
  in their own threads. An address with failures on record is *suspect*:
  its checks wait behind those of other addresses and use at most
  ``auth_workers - 1`` workers, so one worker stays free for addresses with
  a clean record;
* **skip** a queued check whose connection is gone by the time a worker is
  free (``alive()`` false): no hashing for clients that already left. A
  check that did run counts for its address's record whether or not its
  client is still there to hear the answer.

Pure bookkeeping plus one executor; the server owns sockets and CONNACKs.
"""

from __future__ import annotations

import collections
import time
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Callable

__all__ = ["AuthQueue"]

#: Addresses remembered for their last failure (oldest forgotten first).
_MAX_REMEMBERED = 65536
#: Failed checks in a row an address may have before it backs off.
_FREE_FAILURES = 3
#: Refusal after the third failed check of an address; doubles with each failure.
_BACKOFF_BASE_S = 0.1


class _Job:
    __slots__ = ("host", "check", "alive", "done", "suspect")

    def __init__(self, host: str, check: Callable[[], bool], alive: Callable[[], bool],
                 done: Callable[[Future | None], None], suspect: bool) -> None:
        self.host = host
        self.check = check
        self.alive = alive
        self.done = done
        self.suspect = suspect


class AuthQueue:
    """Bounded, address-aware queue of password checks (see the module docstring).

    Not thread-safe: call every method on the event loop; ``call_soon_threadsafe``
    brings a finished check back to it. ``done(fut)`` is called on the loop
    with the finished future, or with ``None`` when the check was skipped
    because the connection had gone.
    """

    def __init__(self, workers: int, max_pending: int, max_per_address: int,
                 backoff_max_s: float, call_soon_threadsafe: Callable,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.workers = workers
        self.max_pending = max_pending
        self.max_per_address = max_per_address
        self.backoff_max_s = backoff_max_s
        self._call_soon_threadsafe = call_soon_threadsafe
        self._clock = clock
        self._executor = ThreadPoolExecutor(workers, thread_name_prefix="lakegate-auth")
        self._clean: collections.deque[_Job] = collections.deque()
        self._suspect: collections.deque[_Job] = collections.deque()
        self._per_host: collections.Counter[str] = collections.Counter()
        #: host -> (failures in a row, time of the last one), oldest first
        self._failures: collections.OrderedDict[str, tuple[int, float]] = collections.OrderedDict()
        self.running = 0
        self.running_suspect = 0
        self.stats = {"checked": 0, "skipped": 0, "refused_busy": 0, "refused_address": 0,
                      "refused_backoff": 0}

    # ------------------------------------------------------------ state
    @property
    def pending(self) -> int:
        """Checks waiting for a worker."""
        return len(self._clean) + len(self._suspect)

    def _record(self, host: str) -> tuple[int, float] | None:
        rec = self._failures.get(host)
        if rec is not None and self._clock() - rec[1] > 2 * self.backoff_max_s:
            del self._failures[host]
            return None
        return rec

    def suspect(self, host: str) -> bool:
        """True when ``host`` has failed checks on record."""
        return self._record(host) is not None

    def backoff_left(self, host: str) -> float:
        """Seconds ``host`` is still refused for after its failures (0: none)."""
        rec = self._record(host)
        if rec is None:
            return 0.0
        n, at = rec
        if n < _FREE_FAILURES:
            return 0.0
        wait = min(_BACKOFF_BASE_S * 2 ** min(n - _FREE_FAILURES, 30), self.backoff_max_s)
        return max(0.0, at + wait - self._clock())

    def failed(self, host: str) -> None:
        """A check from ``host`` failed (wrong user name or password)."""
        if self.backoff_max_s <= 0:
            return
        rec = self._failures.pop(host, None)
        self._failures[host] = ((rec[0] if rec else 0) + 1, self._clock())
        while len(self._failures) > _MAX_REMEMBERED:
            self._failures.popitem(last=False)

    def succeeded(self, host: str) -> None:
        """A check from ``host`` succeeded: its failures are forgiven."""
        self._failures.pop(host, None)

    # ------------------------------------------------------------ queue
    def submit(self, host: str, check: Callable[[], bool], alive: Callable[[], bool],
               done: Callable[[Future | None], None]) -> str | None:
        """Queue ``check`` (run in a worker thread) for a connection from
        ``host``. Returns None when queued, else why it is refused at once."""
        left = self.backoff_left(host)
        if left > 0:
            self.stats["refused_backoff"] += 1
            n = self._failures[host][0]
            return (f"{n} failed password checks in a row from this address: refused for "
                    f"{left:.1f} s more (edge.auth_failure_backoff_s = {self.backoff_max_s:g})")
        if self._per_host[host] >= self.max_per_address:
            self.stats["refused_address"] += 1
            return (f"{self._per_host[host]} password checks from this address in progress "
                    f"(edge.auth_max_pending_per_address = {self.max_per_address})")
        if self.pending >= self.max_pending:
            self.stats["refused_busy"] += 1
            return (f"{self.pending} password checks waiting "
                    f"(edge.auth_max_pending = {self.max_pending})")
        suspect = self.suspect(host)
        self._per_host[host] += 1
        (self._suspect if suspect else self._clean).append(_Job(host, check, alive, done, suspect))
        self._dispatch()
        return None

    def _release(self, job: _Job) -> None:
        n = self._per_host[job.host] - 1
        if n > 0:
            self._per_host[job.host] = n
        else:
            del self._per_host[job.host]

    def _next(self) -> _Job | None:
        if self._clean:
            return self._clean.popleft()
        if self._suspect and (self.running_suspect < max(1, self.workers - 1)):
            return self._suspect.popleft()
        return None

    def _dispatch(self) -> None:
        while self.running < self.workers:
            job = self._next()
            if job is None:
                return
            if not job.alive():
                self._release(job)
                self.stats["skipped"] += 1
                job.done(None)
                continue
            self.running += 1
            if job.suspect:
                self.running_suspect += 1
            self.stats["checked"] += 1
            fut = self._executor.submit(job.check)
            fut.add_done_callback(lambda f, job=job: self._threadsafe(job, f))

    def _threadsafe(self, job: _Job, fut: Future) -> None:
        try:
            self._call_soon_threadsafe(self._finished, job, fut)
        except RuntimeError:  # the loop is closed (process ending)
            pass

    def _finished(self, job: _Job, fut: Future) -> None:
        self.running -= 1
        if job.suspect:
            self.running_suspect -= 1
        self._release(job)
        # The address's record counts every check that ran, also one whose
        # client hung up meanwhile (a flood closes each socket at once: were
        # its failures not counted, it would never back off). A check that
        # raised (a broken hash entry) counts as failed.
        if fut.exception() is None and fut.result():
            self.succeeded(job.host)
        else:
            self.failed(job.host)
        try:
            job.done(fut)
        finally:
            self._dispatch()

    def close(self) -> None:
        """Drop queued checks (their connections are being closed) and stop the workers."""
        self._clean.clear()
        self._suspect.clear()
        self._executor.shutdown(wait=False, cancel_futures=True)
