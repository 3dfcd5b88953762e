"""The tap acknowledges the broker only once a record is durable, on the wire.

Against the real Mosquitto, through a relay that records the packets each
way (tests/tap/wire.py). The capture log's fsync is held (as in
tests/capture/test_writer.py) or made to fail; the tap is killed with
SIGKILL while nothing it appended is on disk. paho 2.2 on its own answers a
QoS 2 PUBLISH with PUBREC at arrival, before the tap sees the message: each
of these tests fails with that behaviour.
"""

import errno
import signal
import subprocess
import sys
import threading
import uuid
from pathlib import Path

import pytest

from bridge.capture import CaptureWriteError
from bridge.capture import partition as partition_mod
from bridge.mqtt import decode_packet
from bridge.tap import PAHO_VERIFIED, PahoVersionError, TapError, check_paho
from tests.capture.util import FsyncGate
from tests.tap.util import Running, publish, records, tap_config
from tests.tap.wire import DISCONNECT, PUBACK, PUBCOMP, PUBLISH, PUBREC, UNSUBSCRIBE, Relay
from tests.waiting import wait_for

pytestmark = pytest.mark.broker

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture
def relay(mosquitto):
    r = Relay(mosquitto)
    yield r
    r.close()


def _prefix():
    return "lgtap/" + uuid.uuid4().hex[:8]


def _by_topic(recs):
    out = {}
    for r in recs:
        pkt, _ = decode_packet(r.value, 5)
        out.setdefault(pkt.topic, []).append((pkt, dict(r.headers)))
    return out


def test_paho_outside_the_verified_releases_is_refused():
    check_paho()  # the installed paho-mqtt is one TapClient was verified against
    assert PAHO_VERIFIED == ((2, 2),)
    for other in ("2.1.0", "2.3.0", "3.0.0", "garbage"):
        with pytest.raises(PahoVersionError, match=rf"^paho-mqtt {other} is installed, but lakegate tap's QoS 2 "
                                                   r"handling .* verified only for paho-mqtt 2\.2\.x"):
            check_paho(other)


def test_puback_and_pubrec_leave_only_after_the_record_is_durable(mosquitto, relay, tmp_path, monkeypatch):
    host, port = mosquitto
    prefix = _prefix()
    cfg = tap_config(tmp_path, "127.0.0.1", relay.port, partitions=1)
    running = Running(cfg, prefix)
    tap = running.tap
    relay.probe = lambda: tap.log.durable_offsets()[0]  # records durable when the tap's packet is seen
    gate = FsyncGate()
    monkeypatch.setattr(partition_mod.os, "fdatasync", gate)
    try:
        publish(host, port, [(f"{prefix}/q1", b"one", 1, False, None), (f"{prefix}/q2", b"two", 2, False, None),
                             (f"{prefix}/q0", b"zero", 0, False, None)])
        wait_for(lambda: tap.log.stats["appends"] == 3, what="the tap appended all three messages")
        assert gate.entered.wait(10), "the flusher never reached fsync"
        # barrier: a packet the tap sends after it handled both PUBLISH packets;
        # anything it had sent before reaches the relay first
        tap._client.unsubscribe(f"{prefix}/barrier")
        wait_for(lambda: relay.packets(from_tap=True, type=UNSUBSCRIBE), what="the barrier UNSUBSCRIBE")
        early = [p for p in relay.packets(from_tap=True) if p.type in (PUBACK, PUBREC, PUBCOMP)]
        assert early == [], "the tap acknowledged before the record was durable"
        assert tap.stats.acked == 0 and tap.log.durable_offsets() == [0]
        gate.open.set()
        wait_for(lambda: relay.packets(from_tap=True, type=PUBCOMP), what="the QoS 2 flow completed")
        ids = {p.qos: p.packet_id for p in relay.packets(from_tap=False, type=PUBLISH)}
        [puback] = relay.packets(from_tap=True, type=PUBACK)
        [pubrec] = relay.packets(from_tap=True, type=PUBREC)
        assert (puback.packet_id, pubrec.packet_id) == (ids[1], ids[2])
    finally:
        gate.open.set()
        running.stop()
    offset = {decode_packet(r.value, 5)[0].topic: r.offset for r in records(cfg.capture_dir)}
    assert sorted(offset) == sorted(f"{prefix}/q{q}" for q in (0, 1, 2))
    assert puback.probe > offset[f"{prefix}/q1"], "PUBACK left before its record was durable"
    assert pubrec.probe > offset[f"{prefix}/q2"], "PUBREC left before its record was durable"
    assert running.error is None


def test_qos2_resent_after_a_reconnect_before_pubrec_is_captured_again_marked_dup(mosquitto, relay, tmp_path,
                                                                                monkeypatch):
    host, port = mosquitto
    prefix = _prefix()
    cfg = tap_config(tmp_path, "127.0.0.1", relay.port)
    running = Running(cfg, prefix)
    tap = running.tap
    gate = FsyncGate()
    monkeypatch.setattr(partition_mod.os, "fdatasync", gate)
    try:
        publish(host, port, [(f"{prefix}/once", b"payload", 2, False, None)])
        wait_for(lambda: tap.log.stats["appends"] == 1 and gate.entered.is_set(), what="the message appended")
        [first] = relay.packets(from_tap=False, type=PUBLISH)
        assert not first.dup
        dropped = relay.drop()  # the tap's connection goes away before its PUBREC could
        # Mosquitto re-sends the PUBLISH (DUP) on the resumed session; the tap
        # knows the id awaits PUBREL
        wait_for(lambda: tap.log.stats["appends"] == 2, what="the re-sent PUBLISH captured")
        [again] = relay.packets(from_tap=False, type=PUBLISH, conn=dropped + 1)
        assert again.dup and again.packet_id == first.packet_id
        gate.open.set()
        wait_for(lambda: relay.packets(from_tap=True, type=PUBCOMP, conn=dropped + 1), what="the QoS 2 flow completed")
        assert relay.packets(from_tap=True, type=PUBREC, conn=dropped) == []
        assert len(relay.packets(from_tap=True, type=PUBREC, conn=dropped + 1)) == 1
        assert (tap.stats.duplicates, tap.stats.stale) == (1, 1)
        # the id was released: a new message is a new message
        publish(host, port, [(f"{prefix}/next", b"payload", 2, False, None)])
        wait_for(lambda: len(relay.packets(from_tap=True, type=PUBCOMP)) == 2, what="the next QoS 2 flow")
    finally:
        gate.open.set()
        running.stop()
    got = _by_topic(records(cfg.capture_dir))
    assert sorted(got) == [f"{prefix}/next", f"{prefix}/once"]
    (orig, h1), (dup, h2) = got[f"{prefix}/once"]
    assert orig == dup and orig.packet_id == first.packet_id
    assert "dup" not in h1 and h2["dup"] == b"1" and h2["origin"] == b"tap"
    [(_, h3)] = got[f"{prefix}/next"]
    assert "dup" not in h3
    assert running.error is None


def test_failed_capture_is_not_acknowledged_stops_the_tap_and_is_redelivered(mosquitto, relay, tmp_path,
                                                                             monkeypatch):
    host, port = mosquitto
    prefix = _prefix()
    cfg = tap_config(tmp_path, "127.0.0.1", relay.port)
    running = Running(cfg, prefix)

    def io_error(fd):
        raise OSError(errno.EIO, "Input/output error")

    monkeypatch.setattr(partition_mod.os, "fdatasync", io_error)
    msgs = [(f"{prefix}/q1", b"one", 1, False, None), (f"{prefix}/q2", b"two", 2, False, None)]
    publish(host, port, msgs)
    running.thread.join(20)
    assert not running.thread.is_alive(), "the tap kept running after a failed capture"
    assert isinstance(running.error, TapError) and isinstance(running.error.__cause__, CaptureWriteError)
    assert "Input/output error" in str(running.error)
    # the relay records what it forwards on its own threads: the tap's thread
    # can end before the relay has read the DISCONNECT, its last packet (and,
    # once that is recorded, everything the tap sent before it)
    wait_for(lambda: relay.packets(from_tap=True, type=DISCONNECT), what="the tap's DISCONNECT")
    assert [p for p in relay.packets(from_tap=True) if p.type in (PUBACK, PUBREC, PUBCOMP)] == []
    [disconnect] = relay.packets(from_tap=True, type=DISCONNECT)
    assert disconnect.body[:1] == b"\x80"  # Unspecified error; the session is kept
    assert records(cfg.capture_dir) == []
    monkeypatch.undo()
    # started again (same client id, same log): the broker re-sends both
    running = Running(cfg, prefix)
    try:
        wait_for(lambda: running.tap.stats.acked == 2, what="both messages captured and acknowledged")
    finally:
        running.stop()
    got = _by_topic(records(cfg.capture_dir))
    assert sorted(got) == sorted(m[0] for m in msgs)
    assert all(len(v) == 1 for v in got.values())
    assert running.error is None


def _lines(proc, out):
    for line in proc.stdout:
        out.append(line.strip())


def test_tap_killed_before_its_records_were_durable_loses_no_qos2_message(mosquitto, tmp_path, lakegate_cmd):
    host, port = mosquitto
    prefix = _prefix()
    cid = "tap-" + uuid.uuid4().hex[:8]
    broker = f"mqtt://{host}:{port}"
    child = subprocess.Popen([sys.executable, "-m", "tests.tap.tap_child", str(tmp_path), broker, cid, f"{prefix}/#"],
                             cwd=ROOT, stdout=subprocess.PIPE, text=True)
    out: list[str] = []
    threading.Thread(target=_lines, args=(child, out), daemon=True).start()
    try:
        wait_for(lambda: "ready" in out or child.poll() is not None, what="tap child subscribed")
        assert "ready" in out, f"tap child exited with {child.returncode}"
        n = 10  # within Mosquitto's default max_inflight_messages (20)
        topics = [f"{prefix}/m{i}" for i in range(n)]
        publish(host, port, [(t, b"p%d" % i, 2, False, None) for i, t in enumerate(topics)])
        # every QoS 2 flow of the publisher is complete, and the tap holds every message
        wait_for(lambda: out.count("appended") == n, what="the tap appended every message")
    finally:
        child.kill()
        child.wait(10)
    assert records(tmp_path / "capture") == []
    # started again, as an operator would: the broker re-sends every message
    proc = subprocess.Popen(lakegate_cmd + ["tap", "--broker", broker, "--topic", f"{prefix}/#",
                                            "--set", f"data_dir={tmp_path}", "--set", f"tap.client_id={cid}",
                                            "--set", "capture.partitions=1"],
                            cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        wait_for(lambda: len(records(tmp_path / "capture")) >= n or proc.poll() is not None, timeout=60,
                 what="the restarted tap captured every message")
    finally:
        proc.send_signal(signal.SIGTERM)
        stdout, stderr = proc.communicate(timeout=30)
    assert proc.returncode == 0, stderr
    got = _by_topic(records(tmp_path / "capture"))
    assert sorted(got) == sorted(topics), "a message the publisher completed is missing from the log"
    for topic, copies in got.items():
        assert len(copies) == 1, f"{topic} captured {len(copies)} times"
        assert copies[0][1]["origin"] == b"tap"


def test_tap_command_exits_1_with_one_line_when_the_capture_log_is_in_use(mosquitto, tmp_path, lakegate_cmd):
    from bridge.capture import CaptureLog

    host, port = mosquitto
    with CaptureLog.open(tmp_path / "capture"):
        proc = subprocess.run(lakegate_cmd + ["tap", "--broker", f"mqtt://{host}:{port}", "--set", f"data_dir={tmp_path}"],
                              cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert proc.returncode == 1
    assert proc.stderr.startswith("lakegate: tap: capture log ") and "is in use by another writer" in proc.stderr
    assert len(proc.stderr.strip().splitlines()) == 1
