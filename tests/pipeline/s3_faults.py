"""An HTTP proxy in front of the moto S3 server that injects the faults a real store and network give: a 500
(InternalError), a 503 SlowDown (throttling), a connection reset in the middle of an upload, and a response
body cut short (the headers promise N bytes, fewer come, the connection closes). Clients (s3fs in the driver,
the pool workers, every Ray node) point ``AWS_ENDPOINT_URL`` at the proxy; a test arms rules and checks that
each fired.

    proxy = FaultProxy(moto_url); proxy.start()
    proxy.arm("PUT", r"/\\.packer/encode/chunk-00001\\.arrow\\.tmp-", "reset", times=1)
"""

from __future__ import annotations

import http.client
import re
import socket
import struct
import threading
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from urllib.parse import urlsplit

KINDS = ("500", "503", "reset", "short")
_ERROR = {"500": (500, "InternalError", "We encountered an internal error. Please try again."),
          "503": (503, "SlowDown", "Please reduce your request rate.")}


@dataclass
class Rule:
    method: str
    pattern: re.Pattern
    kind: str
    times: int  # requests it still fails
    fired: int = 0


class FaultProxy:
    def __init__(self, upstream: str):
        u = urlsplit(upstream)
        self.upstream = (u.hostname, u.port)
        self.rules: list[Rule] = []
        self.lock = threading.Lock()
        self.log: list[tuple[str, str, str]] = []  # (method, path, kind) of each injected fault
        proxy = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *args) -> None:
                pass

            def _any(self) -> None:
                proxy._handle(self)

            do_GET = do_PUT = do_POST = do_HEAD = do_DELETE = _any  # noqa: N815

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"

    def start(self) -> FaultProxy:
        threading.Thread(target=self.server.serve_forever, daemon=True).start()
        return self

    def stop(self) -> None:
        self.server.shutdown()
        self.server.server_close()

    def arm(self, method: str, pattern: str, kind: str, times: int = 1) -> Rule:
        assert kind in KINDS
        rule = Rule(method, re.compile(pattern), kind, times)
        with self.lock:
            self.rules.append(rule)
        return rule

    def clear(self) -> None:
        with self.lock:
            self.rules.clear()
            self.log.clear()

    def _match(self, method: str, path: str) -> str | None:
        with self.lock:
            for r in self.rules:
                if r.times > 0 and r.method == method and r.pattern.search(path):
                    r.times -= 1
                    r.fired += 1
                    self.log.append((method, path, r.kind))
                    return r.kind
        return None

    def _handle(self, h: BaseHTTPRequestHandler) -> None:
        length = int(h.headers.get("Content-Length") or 0)
        kind = self._match(h.command, h.path)
        if kind == "reset":  # half the upload arrives, then the connection is reset (RST, no response)
            h.rfile.read(length // 2)
            h.connection.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
            h.close_connection = True
            h.connection.close()
            return
        body = h.rfile.read(length) if length else b""
        if kind in _ERROR:
            status, code, message = _ERROR[kind]
            xml = (f'<?xml version="1.0" encoding="UTF-8"?><Error><Code>{code}</Code><Message>{message}</Message>'
                   f"<Resource>{h.path}</Resource><RequestId>injected</RequestId></Error>").encode()
            h.send_response(status)
            h.send_header("Content-Type", "application/xml")
            h.send_header("Content-Length", str(len(xml)))
            h.end_headers()
            if h.command != "HEAD":
                h.wfile.write(xml)
            return
        conn = http.client.HTTPConnection(*self.upstream, timeout=60)
        try:
            headers = {k: v for k, v in h.headers.items() if k.lower() not in ("connection", "transfer-encoding")}
            conn.request(h.command, h.path, body=body, headers=headers)
            resp = conn.getresponse()
            data = resp.read()
            h.send_response_only(resp.status, resp.reason)
            for k, v in resp.getheaders():
                if k.lower() not in ("connection", "transfer-encoding", "content-length", "date", "server"):
                    h.send_header(k, v)
            length_out = resp.getheader("Content-Length") if h.command == "HEAD" else str(len(data))
            h.send_header("Content-Length", length_out or "0")
            h.end_headers()
            if h.command == "HEAD":
                return
            if kind == "short" and len(data) > 1:  # the promised length, half the bytes, then the end
                h.wfile.write(data[: len(data) // 2])
                h.wfile.flush()
                h.close_connection = True
                h.connection.shutdown(socket.SHUT_RDWR)
                return
            h.wfile.write(data)
        finally:
            conn.close()
