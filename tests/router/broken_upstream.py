"""A fake replica that breaks its answers: for the router's mid-answer failure tests.

``GET /health`` answers 200 until the first answer was broken, 503 after (as a replica
that died); ``GET /v1/cache/info`` answers ``info`` (a real replica's, so the router
admits it). ``POST`` answers with ``events`` complete SSE events and half of another
(a chunked body), or with the first half of a JSON body, then closes the connection
without ending the body: the client sees an incomplete read, as when the replica is
killed mid-answer.
"""
from __future__ import annotations

import json
import socket
import threading

EVENT = 'data: {"id":"cmpl-x","object":"text_completion","choices":[{"index":0,' \
        '"text":"t%d","finish_reason":null}]}\n\n'


class BrokenUpstream:
    """The fake replica on a loopback port, served by a daemon thread.

    Args:
        events: complete SSE events sent before the break.
        info: the ``GET /v1/cache/info`` answer.
    """

    def __init__(self, events: int = 3, info: dict | None = None):
        self.events = events
        self.info = json.dumps(info or {}).encode()
        self.broken = 0
        self.sock = socket.create_server(("127.0.0.1", 0))
        self.base = f"http://127.0.0.1:{self.sock.getsockname()[1]}"
        self.thread = threading.Thread(target=self._serve, daemon=True)
        self.thread.start()

    def sent_events(self) -> list[str]:
        """The ``data:`` lines of the complete events it sends."""
        return [(EVENT % k).strip() for k in range(self.events)]

    def close(self) -> None:
        self.sock.close()

    def _serve(self) -> None:
        while True:
            try:
                conn, _ = self.sock.accept()
            except OSError:
                return
            threading.Thread(target=self._one, args=(conn,), daemon=True).start()

    def _one(self, conn: socket.socket) -> None:
        with conn:
            head, body = self._read(conn)
            if head.startswith(b"GET /health"):
                status = b"503 Service Unavailable" if self.broken else b"200 OK"
                conn.sendall(b"HTTP/1.1 " + status + b"\r\ncontent-length: 2\r\n"
                             b"connection: close\r\n\r\nok")
                return
            if head.startswith(b"GET /v1/cache/info"):
                conn.sendall(b"HTTP/1.1 200 OK\r\ncontent-type: application/json\r\n"
                             b"content-length: %d\r\nconnection: close\r\n\r\n%s"
                             % (len(self.info), self.info))
                return
            self.broken += 1
            if json.loads(body).get("stream"):
                conn.sendall(b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\n"
                             b"transfer-encoding: chunked\r\n\r\n")
                chunks = [(EVENT % k).encode() for k in range(self.events)]
                chunks.append((EVENT % self.events).encode()[:20])  # half an event
                for c in chunks:
                    conn.sendall(b"%x\r\n%s\r\n" % (len(c), c))
            else:
                conn.sendall(b"HTTP/1.1 200 OK\r\ncontent-type: application/json\r\n"
                             b"content-length: 1000\r\n\r\n{\"id\": \"cmpl-x\", ")
            conn.shutdown(socket.SHUT_RDWR)  # no last chunk: an incomplete body

    @staticmethod
    def _read(conn: socket.socket) -> tuple[bytes, bytes]:
        data = b""
        while b"\r\n\r\n" not in data:
            got = conn.recv(65536)
            if not got:
                return data, b""
            data += got
        head, _, body = data.partition(b"\r\n\r\n")
        length = 0
        for line in head.split(b"\r\n")[1:]:
            name, _, value = line.partition(b":")
            if name.strip().lower() == b"content-length":
                length = int(value)
        while len(body) < length:
            got = conn.recv(65536)
            if not got:
                break
            body += got
        return head, body
