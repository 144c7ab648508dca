"""A loopback HTTP server answering like vLLM's OpenAI-compatible chat endpoint.

Responses follow vLLM's exact JSON shape (choices[].message with content / tool_calls,
choices[].logprobs.content[] with token, logprob, bytes and top_logprobs, usage). A
``respond(model, request) -> dict`` function decides the reply; the server records every
request and how many were in flight at once.
"""

from __future__ import annotations

import json
import threading
import time
import uuid
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import numpy as np


def logprobs_content(tokens, separability, k, seed=0):
    rng = np.random.default_rng(seed)
    content = []
    for token, s in zip(tokens, separability, strict=True):
        comp = np.sort(rng.normal(0, 1, 63))[::-1]
        top1 = comp.mean() + s * (comp.std() + 1e-6)
        logits = np.concatenate([[top1], comp])
        lp = logits - (logits.max() + np.log(np.exp(logits - logits.max()).sum()))
        top = [
            {
                "token": token if i == 0 else f"t{i}",
                "logprob": float(v),
                "bytes": list((token if i == 0 else f"t{i}").encode()),
            }
            for i, v in enumerate(lp[:k])
        ]
        content.append(
            {
                "token": token,
                "logprob": top[0]["logprob"],
                "bytes": list(token.encode()),
                "top_logprobs": top,
            }
        )
    return {"content": content}


def completion(model, content=None, tool_calls=None, logprobs=None):
    message = {
        "role": "assistant",
        "content": content,
        "tool_calls": tool_calls or [],
        "reasoning_content": None,
    }
    return {
        "id": f"chatcmpl-{uuid.uuid4().hex}",
        "object": "chat.completion",
        "created": int(time.time()),
        "model": model,
        "choices": [
            {
                "index": 0,
                "message": message,
                "logprobs": logprobs,
                "finish_reason": "tool_calls" if tool_calls else "stop",
                "stop_reason": None,
            }
        ],
        "usage": {
            "prompt_tokens": 100,
            "total_tokens": 105,
            "completion_tokens": 5,
            "prompt_tokens_details": None,
        },
        "prompt_logprobs": None,
    }


class ReplayServer:
    """``models``: entries for ``GET /v1/models`` (vLLM's shape: id, root, max_model_len),
    or a dict sent as the whole listing (a router's own shape); without them the server has
    no such route, as some OpenAI-compatible servers."""

    def __init__(self, respond, models=None):
        self.respond = respond
        self.models = models
        self.requests: list[dict] = []
        self.in_flight = 0
        self.max_in_flight = 0
        self._lock = threading.Lock()
        server = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args):  # quiet
                pass

            def do_GET(self):
                if server.models is None or not self.path.endswith("/models"):
                    self.send_error(404)
                    return
                listing = server.models
                if not isinstance(listing, dict):
                    listing = {"object": "list", "data": listing}
                data = json.dumps(listing).encode()
                self.send_response(200)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def do_POST(self):
                body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
                with server._lock:
                    server.requests.append(body)
                    server.in_flight += 1
                    server.max_in_flight = max(server.max_in_flight, server.in_flight)
                try:
                    status, payload, delay = server.respond(body)
                    time.sleep(delay)
                    data = json.dumps(payload).encode()
                    self.send_response(status)
                    self.send_header("Content-Type", "application/json")
                    self.send_header("Content-Length", str(len(data)))
                    self.end_headers()
                    self.wfile.write(data)
                except (BrokenPipeError, ConnectionResetError):
                    pass
                finally:
                    with server._lock:
                        server.in_flight -= 1

        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.httpd.daemon_threads = True
        self.thread = threading.Thread(target=self.httpd.serve_forever, daemon=True)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.httpd.server_address[1]}/v1"

    def __enter__(self):
        self.thread.start()
        return self

    def __exit__(self, *exc):
        self.httpd.shutdown()
        self.httpd.server_close()
