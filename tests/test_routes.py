"""The chat's image route (``speceyes_graph.deploy.routes``) on its own: it serves an image
only to a caller whose own request for the thread's state succeeds and holds the image's
key, and asks for nothing else. The server it asks is a stand-in here (an httpx mock of the
thread API); tests/test_chat_ui.py and tests/test_aegra.py ask the real servers."""

from __future__ import annotations

import httpx
import pytest
from starlette.testclient import TestClient

from speceyes_tools.blobs import blob_key

PNG = b"\x89PNG\r\n\x1a\n" + b"\x00" * 64
KEY = blob_key(PNG)


@pytest.fixture
def route(monkeypatch):
    """The route's app, its store holding the image, and the thread API it asks: thread
    ``mine`` holds the key for the caller with ``Authorization: me``, nothing else."""
    from speceyes_graph.deploy import routes
    from speceyes_graph.integrations import studio
    from speceyes_tools.images import ImageStore

    store = ImageStore()
    store.put(PNG)
    monkeypatch.setattr(studio, "served_store", lambda: store)
    asked: list[httpx.Request] = []

    def thread_api(request: httpx.Request) -> httpx.Response:
        asked.append(request)
        if request.url.raw_path == b"/threads/mine/state" and request.headers.get("authorization") == "me":  # fmt: skip
            return httpx.Response(200, json={"values": {"messages": [{"metadata": {"speceyes_image": KEY}}]}})  # fmt: skip
        return httpx.Response(404, json={"detail": "not found"})

    real = httpx.AsyncClient
    monkeypatch.setattr(
        routes.httpx, "AsyncClient", lambda **kw: real(transport=httpx.MockTransport(thread_api), **kw)
    )  # fmt: skip
    return TestClient(routes.app), asked


def test_the_image_goes_to_a_reader_of_a_thread_that_holds_it(route):
    client, asked = route
    url = f"/speceyes/images/{KEY[7:]}?thread_id=mine"
    ok = client.get(url, headers={"Authorization": "me"})
    assert ok.status_code == 200 and ok.content == PNG and ok.headers["content-type"] == "image/png"
    assert client.get(url, headers={"Authorization": "someone else"}).status_code == 404
    other = f"/speceyes/images/{'0' * 64}?thread_id=mine"  # a key the thread does not hold
    assert client.get(other, headers={"Authorization": "me"}).status_code == 404


@pytest.mark.parametrize(
    "path",
    [
        "/speceyes/images/not-a-digest?thread_id=mine",
        f"/speceyes/images/{KEY[7:]}",  # no thread
        f"/speceyes/images/{KEY[7:]}?thread_id=../../store/items",
    ],
)
def test_anything_else_is_not_found_and_asks_no_other_endpoint(route, path):
    client, asked = route
    assert client.get(path, headers={"Authorization": "me"}).status_code == 404
    assert all(r.url.raw_path.startswith(b"/threads/") and r.url.raw_path.endswith(b"/state") and r.url.raw_path.count(b"/") == 3 for r in asked)  # fmt: skip
