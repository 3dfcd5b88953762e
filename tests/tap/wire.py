"""A TCP relay between the tap and the real Mosquitto that records the MQTT
control packets going each way (type, flags, packet id; never payloads), so
that a test can see on the wire what the tap acknowledged and when.

``Relay(upstream).port`` is where the tap connects; every connection gets a
number (1, 2, ...). ``drop()`` closes the current connection on both sides
(the tap sees its broker go away and reconnects). ``probe``, when set, is
called as each packet from the tap is seen, before it is passed on, and its
value is kept with the packet.
"""

from __future__ import annotations

import socket
import threading
from dataclasses import dataclass

PUBLISH, PUBACK, PUBREC, PUBREL, PUBCOMP, SUBSCRIBE, UNSUBSCRIBE, DISCONNECT = 3, 4, 5, 6, 7, 8, 10, 14
_WITH_ID = {PUBACK, PUBREC, PUBREL, PUBCOMP, SUBSCRIBE, 9, UNSUBSCRIBE, 11}


@dataclass
class Packet:
    conn: int
    from_tap: bool
    type: int
    flags: int
    packet_id: int | None
    body: bytes
    probe: object = None

    @property
    def dup(self) -> bool:
        return bool(self.flags & 0x08)

    @property
    def qos(self) -> int:
        return (self.flags >> 1) & 0x03


def _split(buf: bytearray) -> list[tuple[int, bytes]]:
    """Take the complete packets off the front of ``buf``: (first byte, body)."""
    out = []
    while len(buf) >= 2:
        length, mult, i = 0, 1, 1
        while True:
            if i >= len(buf):
                return out
            b = buf[i]
            length += (b & 0x7F) * mult
            mult *= 128
            i += 1
            if not b & 0x80:
                break
        if len(buf) < i + length:
            return out
        out.append((buf[0], bytes(buf[i:i + length])))
        del buf[:i + length]
    return out


def _packet_id(ptype: int, flags: int, body: bytes) -> int | None:
    if ptype == PUBLISH:
        if not (flags >> 1) & 0x03:
            return None
        tlen = int.from_bytes(body[:2], "big")
        return int.from_bytes(body[2 + tlen:4 + tlen], "big")
    if ptype in _WITH_ID:
        return int.from_bytes(body[:2], "big")
    return None


class Relay:
    def __init__(self, upstream: tuple[str, int]) -> None:
        self.upstream = upstream
        self._srv = socket.create_server(("127.0.0.1", 0))
        self.port = self._srv.getsockname()[1]
        self._lock = threading.Lock()
        self._packets: list[Packet] = []
        self._current: list[socket.socket] = []
        self.connections = 0
        self.probe = None
        self._closed = False
        threading.Thread(target=self._accept, name="relay-accept", daemon=True).start()

    # -- what was seen -------------------------------------------------------
    def packets(self, *, from_tap: bool | None = None, type: int | None = None, conn: int | None = None,
                packet_id: int | None = None) -> list[Packet]:
        with self._lock:
            return [p for p in self._packets
                    if (from_tap is None or p.from_tap == from_tap) and (type is None or p.type == type)
                    and (conn is None or p.conn == conn) and (packet_id is None or p.packet_id == packet_id)]

    # -- control ---------------------------------------------------------------
    def drop(self) -> int:
        """Close the current connection on both sides; returns its number."""
        with self._lock:
            socks, n = list(self._current), self.connections
        for s in socks:
            try:
                s.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass
            s.close()
        return n

    def close(self) -> None:
        self._closed = True
        self._srv.close()
        self.drop()

    # -- pumps -----------------------------------------------------------------
    def _accept(self) -> None:
        while not self._closed:
            try:
                down, _ = self._srv.accept()
            except OSError:
                return
            try:
                up = socket.create_connection(self.upstream, timeout=10)
                up.settimeout(None)
            except OSError:
                down.close()
                continue
            with self._lock:
                self.connections += 1
                n = self.connections
                self._current = [down, up]
            threading.Thread(target=self._pump, args=(down, up, n, True), daemon=True).start()
            threading.Thread(target=self._pump, args=(up, down, n, False), daemon=True).start()

    def _pump(self, src: socket.socket, dst: socket.socket, conn: int, from_tap: bool) -> None:
        buf = bytearray()
        try:
            while True:
                data = src.recv(65536)
                if not data:
                    break
                buf += data
                for first, body in _split(buf):
                    ptype, flags = first >> 4, first & 0x0F
                    pkt = Packet(conn, from_tap, ptype, flags, _packet_id(ptype, flags, body), body)
                    if from_tap and self.probe is not None:
                        pkt.probe = self.probe()
                    with self._lock:
                        self._packets.append(pkt)
                dst.sendall(data)
        except OSError:
            pass
        finally:
            for s in (src, dst):
                try:
                    s.shutdown(socket.SHUT_RDWR)
                except OSError:
                    pass
                s.close()
