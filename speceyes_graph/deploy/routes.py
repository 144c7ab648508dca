"""The HTTP routes a server serves beside the graphs (``langgraph.json``'s ``http.app``).

``GET /speceyes/images/{digest}?thread_id={thread}``: the image a person sent in a chat,
for UIs that render URL blocks (each thumbnail the served chat keeps names this URL in its
metadata). Who may fetch it is decided the way the thread is: the route asks the server
itself, with the caller's own headers, for that thread's state, and serves the image only
if that answer holds the image's key. So whatever the deployment's auth lets a caller read
of threads (owner scoping, tokens, an open server's everything), it lets them read of the
images in them, and nothing else; and image keys are SHA-256 digests of the bytes, so none
is guessed without having the image. Both LangGraph's servers and Aegra serve it (the
``serve`` extra brings FastAPI, which Aegra requires of a custom app).
"""

from __future__ import annotations

import asyncio
import re
from urllib.parse import quote

import httpx
from fastapi import FastAPI
from starlette.requests import Request
from starlette.responses import PlainTextResponse, Response

__all__ = ["app", "image"]

_DIGEST = re.compile(r"[0-9a-f]{64}")
_NOT_FORWARDED = {"host", "content-length", "connection", "accept-encoding", "transfer-encoding"}


async def image(request: Request) -> Response:
    """The image under ``digest`` if the caller may read ``thread_id`` and it holds it."""
    digest = request.path_params["digest"]
    thread = request.query_params.get("thread_id", "")
    if not _DIGEST.fullmatch(digest) or not thread:
        return PlainTextResponse("not found", status_code=404)
    key = f"blob://{digest}"
    host, port = request.scope.get("server") or ("127.0.0.1", 80)
    headers = {k: v for k, v in request.headers.items() if k.lower() not in _NOT_FORWARDED}
    async with httpx.AsyncClient(base_url=f"http://{host}:{port}", timeout=30) as client:
        # the thread id quoted whole: a caller's "../" reaches no other endpoint
        state = await client.get(f"/threads/{quote(thread, safe='')}/state", headers=headers)
    if state.status_code != 200 or key not in state.text:
        return PlainTextResponse("not found", status_code=404)  # the same for "not yours"
    from speceyes_graph.integrations.studio import served_store  # absolute: loaded by path
    from speceyes_tools.codec import sniff_mime

    try:
        data = await asyncio.to_thread(served_store().read, key)
    except Exception:  # pruned by age or size since the turn
        return PlainTextResponse("this image is no longer kept", status_code=410)
    return Response(
        data, media_type=sniff_mime(data), headers={"Cache-Control": "private, max-age=3600"}
    )


# A FastAPI app (Aegra takes no other kind; LangGraph's servers take any Starlette app), with
# no docs or OpenAPI routes of its own: the server's own /docs and /openapi.json stay theirs.
app = FastAPI(docs_url=None, redoc_url=None, openapi_url=None)
app.add_api_route("/speceyes/images/{digest}", image, methods=["GET"])
