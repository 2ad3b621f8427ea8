"""A TCP proxy on 127.0.0.1 in front of a Redis server that damages its replies on request, the
way a faulty middlebox or network would: Redis tier tests point the store at ``proxy.url``.

Requests go to the server untouched. Replies are read as RESP2 items; a bulk string of at least
``min_bulk`` bytes (a stored value or a range of one, not "OK" or a key name) is passed through,
or, by ``mode``:

- ``"half"``: rewritten as a valid bulk string of its first half (the length prefix says so);
- ``"one_short"``: rewritten without its last byte;
- ``"cut"``: its length prefix and first half are sent, then both connections are closed.
"""

from __future__ import annotations

import contextlib
import socket
import threading

MODES = ("pass", "half", "one_short", "cut")


class TruncatingProxy:
    """Listens on a free loopback port and forwards to the Redis server at ``port``."""

    def __init__(self, port: int, min_bulk: int = 1024) -> None:
        self._upstream = ("127.0.0.1", port)
        self.min_bulk = min_bulk
        self.mode = "pass"
        self.damaged = 0  # replies changed or cut
        self.replies = 0  # bulk replies of at least min_bulk bytes seen, damaged or not
        self._listener = socket.create_server(("127.0.0.1", 0))
        self.port = self._listener.getsockname()[1]
        self.url = f"redis://127.0.0.1:{self.port}/0"
        self._sockets: list[socket.socket] = []
        self._lock = threading.Lock()
        threading.Thread(target=self._accept, daemon=True).start()

    def close(self) -> None:
        """Stop listening and close every connection."""
        with contextlib.suppress(OSError):
            self._listener.close()
        with self._lock:
            for sock in self._sockets:
                _shut(sock)

    def _accept(self) -> None:
        while True:
            try:
                client, _ = self._listener.accept()
            except OSError:
                return  # closed
            try:
                upstream = socket.create_connection(self._upstream)
            except OSError:  # the server is gone: so is this connection
                _shut(client)
                continue
            with self._lock:
                self._sockets += [client, upstream]
            threading.Thread(target=_pump, args=(client, upstream), daemon=True).start()
            threading.Thread(target=self._replies, args=(upstream, client), daemon=True).start()

    def _replies(self, upstream: socket.socket, client: socket.socket) -> None:
        reader = upstream.makefile("rb")
        try:
            while line := reader.readline():
                out, cut = line, False
                if line.startswith(b"$") and int(line[1:-2]) >= 0:
                    out, cut = self._bulk(line, reader.read(int(line[1:-2]) + 2))
                client.sendall(out)
                if cut:
                    break
        except OSError:
            pass
        finally:
            _shut(client)
            _shut(upstream)

    def _bulk(self, line: bytes, body: bytes) -> tuple[bytes, bool]:
        """What to send for one bulk string (``body`` ends with CRLF), and whether to close the
        connections after it."""
        n = len(body) - 2
        if n < self.min_bulk:
            return line + body, False
        self.replies += 1
        mode = self.mode
        if mode == "pass":
            return line + body, False
        self.damaged += 1
        if mode == "cut":
            return line + body[: n // 2], True
        keep = n // 2 if mode == "half" else n - 1
        return b"$%d\r\n" % keep + body[:keep] + b"\r\n", False


def _pump(source: socket.socket, dest: socket.socket) -> None:
    try:
        while data := source.recv(65536):
            dest.sendall(data)
    except OSError:
        pass
    finally:
        _shut(source)
        _shut(dest)


def _shut(sock: socket.socket) -> None:
    with contextlib.suppress(OSError):
        sock.shutdown(socket.SHUT_RDWR)
    with contextlib.suppress(OSError):
        sock.close()
