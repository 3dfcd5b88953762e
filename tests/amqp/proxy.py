"""A TCP relay on loopback that can turn into a black hole.

``BlackHoleProxy(port)`` listens on an ephemeral loopback port and relays
each connection to ``127.0.0.1:port``. While :attr:`black_hole` is set the
connections stay open but every byte is dropped, both ways, and new
connections are accepted but never connected through: what a peer behind
a dead network path looks like (TCP open, no data).
"""

from __future__ import annotations

import selectors
import socket
import threading

__all__ = ["BlackHoleProxy"]


class BlackHoleProxy:
    def __init__(self, target_port: int) -> None:
        self.target_port = target_port
        self.black_hole = threading.Event()
        self._stop = threading.Event()
        self._srv = socket.socket()
        self._srv.bind(("127.0.0.1", 0))
        self._srv.listen(16)
        self._srv.setblocking(False)
        self.port = self._srv.getsockname()[1]
        self.url = f"amqp://127.0.0.1:{self.port}"
        self._sel = selectors.DefaultSelector()
        self._sel.register(self._srv, selectors.EVENT_READ, None)
        self._socks: list[socket.socket] = [self._srv]
        self.accepted = 0
        self._thread = threading.Thread(target=self._run, name="black-hole-proxy", daemon=True)

    def __enter__(self) -> "BlackHoleProxy":
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(10)
        for s in self._socks:
            s.close()
        self._sel.close()

    def _close_pair(self, a: socket.socket, b: socket.socket | None) -> None:
        for s in (a, b):
            if s is None:
                continue
            try:
                self._sel.unregister(s)
            except (KeyError, ValueError):
                pass
            s.close()

    def _run(self) -> None:
        while not self._stop.is_set():
            for key, _ in self._sel.select(0.05):
                sock, peer = key.fileobj, key.data
                if sock is self._srv:
                    client, _ = self._srv.accept()
                    self.accepted += 1
                    self._socks.append(client)
                    if self.black_hole.is_set():
                        self._sel.register(client, selectors.EVENT_READ, None)  # read and drop
                        continue
                    upstream = socket.create_connection(("127.0.0.1", self.target_port))
                    self._socks.append(upstream)
                    self._sel.register(client, selectors.EVENT_READ, upstream)
                    self._sel.register(upstream, selectors.EVENT_READ, client)
                    continue
                try:
                    data = sock.recv(65536)
                except OSError:
                    data = b""
                if not data:
                    self._close_pair(sock, peer)
                    continue
                if peer is not None and not self.black_hole.is_set():
                    try:
                        peer.sendall(data)
                    except OSError:
                        self._close_pair(sock, peer)
