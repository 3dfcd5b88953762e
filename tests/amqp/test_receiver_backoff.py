"""How soon the AMQP downlink's receiver tries its peer again (issue 39
item 6): what is sent to a topic address while it is away reaches no one,
so however long the outage, it is back within RECONNECT_MAX_S of the peer.
Forwarding's backoff (amqp.retry_backoff_s doubling to 30 s) is unchanged."""

from __future__ import annotations

import time

from bridge.amqp.receiver import DownlinkReceiver
from bridge.amqp.retry import MAX_BACKOFF_S, RECONNECT_MAX_S, backoff, reconnect_backoff
from bridge.config import load_config


def _cfg(*sets: str):
    return load_config(None, ["amqp.url=amqp://127.0.0.1:1", *sets], env={}).amqp


def test_the_downlink_tries_again_within_reconnect_max_s_however_long_the_outage():
    r = DownlinkReceiver(_cfg(), lambda *a: None)
    waits = []
    for _ in range(12):  # a 30 s outage and more: 12 failed attempts in a row
        r.on_disconnected(None)
        waits.append(r.reconnect_at - time.monotonic())
    assert max(waits) <= RECONNECT_MAX_S + 0.05
    assert waits[0] < waits[2]  # still growing at first (0.5, 1, 2 s)
    assert r.stats["reconnects"] == 12


def test_forwardings_backoff_is_unchanged_and_a_longer_setting_is_kept():
    cfg = _cfg()
    assert backoff(cfg, 12) == MAX_BACKOFF_S and reconnect_backoff(cfg, 12) == RECONNECT_MAX_S
    assert reconnect_backoff(_cfg("amqp.retry_backoff_s=5"), 12) == 5.0
