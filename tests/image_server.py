"""A loopback HTTP server that misbehaves on request: slow bodies, endless bodies, redirects."""

from __future__ import annotations

import threading
import time
import urllib.parse
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer


class ImageServer:
    """Routes: ``/image.png`` (the given bytes), ``/trickle`` (a byte every 0.2 s),
    ``/endless`` (zeros until the client hangs up, no length), ``/redirect?to=URL``, ``/loop``
    (redirects to itself),
    anything else 404. ``hits`` counts requests per path."""

    def __init__(self, image: bytes):
        self.image = image
        self.hits: dict[str, int] = {}
        server = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args):  # keep test output clean
                pass

            def do_GET(self):  # noqa: N802 - http.server's naming
                parts = urllib.parse.urlsplit(self.path)
                server.hits[parts.path] = server.hits.get(parts.path, 0) + 1
                try:
                    if parts.path == "/image.png":
                        self._send(200, server.image, "image/png")
                    elif parts.path == "/trickle":
                        self.send_response(200)
                        self.send_header("Content-Length", str(len(server.image)))
                        self.end_headers()
                        for i in range(0, len(server.image), 64):
                            self.wfile.write(server.image[i : i + 64])
                            self.wfile.flush()
                            time.sleep(0.2)
                    elif parts.path == "/endless":
                        self.send_response(200)
                        self.end_headers()
                        chunk = b"\0" * 65536
                        for _ in range(300 * 16):  # up to 300 MB
                            self.wfile.write(chunk)
                    elif parts.path in ("/redirect", "/loop"):
                        query = urllib.parse.parse_qs(parts.query)
                        target = query["to"][0] if parts.path == "/redirect" else "/loop"
                        self.send_response(302)
                        self.send_header("Location", target)
                        self.send_header("Content-Length", "0")
                        self.end_headers()
                    else:
                        self._send(404, b"not found", "text/plain")
                except (BrokenPipeError, ConnectionResetError):
                    pass  # the client gave up, as it should

            def _send(self, status, body, kind):
                self.send_response(status)
                self.send_header("Content-Type", kind)
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.httpd.daemon_threads = True
        self.port = self.httpd.server_address[1]
        self.thread = threading.Thread(target=self.httpd.serve_forever, daemon=True)

    def url(self, path: str) -> str:
        return f"http://127.0.0.1:{self.port}{path}"

    def __enter__(self) -> ImageServer:
        self.thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()
