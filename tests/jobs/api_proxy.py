"""A TCP proxy in front of a test Ray head's Jobs API that a test can take down or make silent: what the submitter
sees of a head pod that restarts (connections refused, then reset) or of one that accepts connections and never
answers. Listens on a port it holds from the start (bound once, never chosen first and bound later)."""

from __future__ import annotations

import contextlib
import socket
import threading
from urllib.parse import urlsplit

UP, DOWN, SILENT = "up", "down", "silent"


class ApiProxy:
    def __init__(self, upstream: str) -> None:
        parts = urlsplit(upstream)
        self.upstream = (parts.hostname or "127.0.0.1", parts.port or 80)
        self.mode = UP
        self._listener = socket.create_server(("127.0.0.1", 0))
        self.address = f"http://127.0.0.1:{self._listener.getsockname()[1]}"
        self._held: list[socket.socket] = []
        self._closed = False
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        while not self._closed:
            try:
                conn, _ = self._listener.accept()
            except OSError:
                return
            if self.mode == DOWN:
                conn.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, b"\x01\x00\x00\x00\x00\x00\x00\x00")
                conn.close()  # reset at once
            elif self.mode == SILENT:
                self._held.append(conn)  # accepted, never answered
            else:
                threading.Thread(target=self._relay, args=(conn,), daemon=True).start()

    def _relay(self, conn: socket.socket) -> None:
        try:
            upstream = socket.create_connection(self.upstream, timeout=10)
        except OSError:
            conn.close()
            return
        upstream.settimeout(None)

        def pipe(source: socket.socket, sink: socket.socket) -> None:
            with contextlib.suppress(OSError):
                while data := source.recv(65536):
                    sink.sendall(data)
            with contextlib.suppress(OSError):
                sink.shutdown(socket.SHUT_WR)

        back = threading.Thread(target=pipe, args=(upstream, conn), daemon=True)
        back.start()
        pipe(conn, upstream)
        back.join()
        conn.close()
        upstream.close()

    def close(self) -> None:
        self._closed = True
        self._listener.close()
        for conn in self._held:
            conn.close()
