"""The edge server's housekeeping of sessions that outlive connections.

* Wills: captured now, or after the Will Delay Interval unless a connection
  resumes the session first (``pending_wills``), and Wills recovered from
  before a restart;
* persistent sessions: expiry, and the store's bounds
  (``edge.max_persistent_sessions``, ``edge.max_stored_qos2_ids``);
* the session snapshot (``bridge.edge.persist``) every
  :data:`~bridge.edge.persist.SNAPSHOT_INTERVAL_S` seconds, with the Wills a
  crash would leave owed.

:class:`SessionHousekeeping` is a part of
:class:`~bridge.edge.server.EdgeServer` and works on its attributes.
"""

from __future__ import annotations

import asyncio
import gc
import logging
import time

from bridge.capture.errors import CaptureError
from bridge.capture.commits import hold_offsets
from bridge.edge.journal import session_doc
from bridge.edge.persist import SNAPSHOT_INTERVAL_S, hold_floor, write_snapshot
from bridge.edge.session import WillMessage

__all__ = ["SessionHousekeeping"]

log = logging.getLogger("bridge.edge")

#: housekeeping rounds (SNAPSHOT_INTERVAL_S each: 10 minutes) between two
#: full passes of the cyclic garbage collector (``_gc_round``)
GC_FULL_EVERY = 60


class SessionHousekeeping:
    """Wills, session expiry and snapshots of the :class:`~bridge.edge.server.EdgeServer`."""

    # ------------------------------------------------------------ wills
    def _will(self, w: WillMessage) -> None:
        if w.delay_s <= 0 or self._stopping:
            self._capture_will(w)
            return
        old = self.pending_wills.pop(w.client_id, None)
        if old is not None:
            old[0].cancel()
            self._capture_will(old[1])
        handle = self.loop.call_later(w.delay_s, self._will_due, w.client_id)
        self.pending_wills[w.client_id] = (handle, w)

    def _will_due(self, client_id: str) -> None:
        pending = self.pending_wills.pop(client_id, None)
        if pending is not None:
            self._capture_will(pending[1])

    def _capture_will(self, w: WillMessage) -> None:
        try:
            ack = self.log.append(w.conn_id, w.key, w.frame, w.headers)
        except CaptureError as exc:
            self.log_failed(exc)
            return
        if self.router.tree or w.frame[0] & 1:  # subscribers, or a retained Will
            level = next((int(v) for k, v in w.headers if k == "proto"), 4)
            self._route(w.frame, level, None, w.client_id, ack)
        log.info("%s client=%s: will captured (%d bytes)", w.conn_id, w.client_id, len(w.frame))

    # ------------------------------------------------------------ snapshots
    def _configure_store(self) -> None:
        e = self.edge
        self.store.configure(e.persistent_session_expiry_s, e.max_persistent_sessions,
                             e.max_stored_qos2_ids)

    def drop_session(self, cid: str, why: str) -> None:
        """Forget a session's subscriptions and queue (``Router.drop``). No
        single session's failure stops the caller (a connection's clean-up,
        a CONNECT, the housekeeping loop): the error is logged once with the
        session's id, and the router has forgotten the session all the same."""
        try:
            self.router.drop(cid, defer=True)
        except Exception as exc:
            log.error("client=%s: clean-up of the session (%s) failed, the session is dropped "
                      "all the same: %s: %s", cid, why, type(exc).__name__, exc)
        if self.router.tree.leaving and not self._sweeping:
            self._sweeping = True
            self.loop.call_soon(self._sweep_subscriptions)

    def _sweep_subscriptions(self) -> None:
        """One slice of the subscriptions ended sessions left in the tree
        (``SubscriptionTree.sweep``), then the next in the next turn of the
        event loop, so that 20 clients of 1,000 filters leaving together do
        not hold it [LG-edge-turn-budget]."""
        try:
            more = self.router.tree.sweep()
        except Exception:  # a bug must not leave the sweep stopped for good
            log.exception("sweeping the subscriptions of ended sessions failed")
            more = False
        if more:
            self.loop.call_soon(self._sweep_subscriptions)
        else:
            self._sweeping = False

    def _expire_sessions(self) -> None:
        """Drop expired sessions, then those beyond the store's bounds (logged)."""
        gone = self.store.expire(time.time())
        for cid in gone:
            self.drop_session(cid, "expired")
        if gone:
            log.info("%d persistent sessions expired (first: client=%s)", len(gone), gone[0])
        dropped = self.store.bound()
        for cid, _n in dropped:
            self.drop_session(cid, "over the store's bounds")
        if dropped:
            e = self.edge
            log.warning("%d persistent sessions dropped, the longest disconnected first, with %d "
                        "QoS 2 ids awaiting PUBREL: over edge.max_persistent_sessions = %d or "
                        "edge.max_stored_qos2_ids = %d (first: client=%s); a PUBREL for a "
                        "dropped id gets PUBCOMP 0x92 (MQTT 5), a re-sent PUBLISH is captured "
                        "again", len(dropped), sum(n for _c, n in dropped),
                        e.max_persistent_sessions, e.max_stored_qos2_ids, dropped[0][0])

    async def _snapshot_loop(self) -> None:
        """Every SNAPSHOT_INTERVAL_S: expiry, drop logging, the snapshot.
        Supervised: an error in one round is logged (once per kind of error
        in a row) and the next round goes on; nothing stops this loop but
        the server's shutdown."""
        last = None
        while True:
            await asyncio.sleep(SNAPSHOT_INTERVAL_S)
            try:
                self._gc_round()
                self._expire_sessions()
                self._log_drops()
                if self.log.next_seq != self._snapshot_seq or \
                        getattr(self, "feed_done", None) and self.feed_done != self._snapshot_feed:
                    await self.snapshot()
                last = None
            except asyncio.CancelledError:
                raise
            except Exception as exc:  # keep serving; the next round retries
                said = f"{type(exc).__name__}: {exc}"
                if said != last:
                    log.error("edge housekeeping (expiry, snapshot) failed, retried in %g s: %s",
                              SNAPSHOT_INTERVAL_S, said)
                last = said

    def _gc_round(self) -> None:
        """The cyclic collector's full pass, every :data:`GC_FULL_EVERY`
        rounds: the edge turns automatic full passes off
        (``gc_tuning.GC_THRESHOLD2``), which stopped its event loop for
        250-320 ms under a retained flood, at any time; one here, every 10
        minutes, collects the cycles that reached the oldest generation."""
        self._gc_rounds = getattr(self, "_gc_rounds", 0) + 1
        if self._gc_rounds % GC_FULL_EVERY == 0:
            t0 = time.monotonic()
            found = gc.collect()
            log.info("edge: full garbage collection: %d objects collected in %.0f ms", found,
                     (time.monotonic() - t0) * 1000)

    def owed_wills(self) -> dict[str, dict]:
        """The Wills a crash now would leave owed, as the snapshot stores
        them: delayed Wills still pending, and the Will of every open
        connection (see ``bridge.edge.persist``)."""
        out = {cid: w.to_json() for cid, (_handle, w) in self.pending_wills.items()}
        for conn in self.conns:
            w = conn.session.owed_will() if conn.session is not None else None
            if w is not None:
                out[w.client_id] = w.to_json()
        return out

    async def snapshot(self) -> None:
        """Write the persistent sessions with the capture offsets they reflect,
        once everything appended so far is durable (expired sessions and
        those beyond the store's bounds dropped first)."""
        self._expire_sessions()
        doc = self.store.to_json()
        router = self.router
        for cid, entry in doc.items():
            entry.update(session_doc(router, self.store.sessions[cid]))
        wills = self.owed_wills()
        offsets = self.feed_offsets(self.log.next_offsets())  # a cluster edge: what it applied of the others'
        seq = self.log.next_seq
        state_dir = self.config.edge_state_dir
        stream = self.log.stream
        root = self.log.root
        hold = hold_floor(doc, offsets)

        def work() -> None:
            self.log.flush()
            write_snapshot(state_dir, doc, offsets, stream, wills)
            # retention keeps what the snapshot refers to, and the replay after it
            hold_offsets(root, "edge-sessions", dict(enumerate(hold)))

        await asyncio.to_thread(work)
        self._snapshot_seq = seq
        self._snapshot_feed = dict(getattr(self, "feed_done", None) or {})
