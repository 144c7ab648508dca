"""The image policy: what a caller may point the server at, and what errors reveal."""

import base64
import os

import pytest
from conftest import write_scene

from helpers import deepeyes_agent, judge, speculator
from speceyes_graph import create_speceyes_graph
from speceyes_tools import ImageLoadError, ImagePolicy, ImagePolicyError, ImageStore
from speceyes_tools.sources import redact

STRICT = ImagePolicy.strict()


def data_url(path):
    return "data:image/png;base64," + base64.b64encode(open(path, "rb").read()).decode()


def test_strict_refuses_local_files_without_revealing_whether_they_exist(scene):
    store = ImageStore(policy=STRICT)
    errors = []
    for ref in (scene, "/etc/passwd", "/no/such/file.png", "file:///etc/shadow", "../../x.png"):
        with pytest.raises(ImagePolicyError) as info:
            store.intern(ref)
        errors.append(str(info.value))
    assert len(set(errors)) == 1  # one message for every path: existence is not revealed
    assert "local file paths are not accepted here" in errors[0]
    assert "data: URLs, https URLs of public hosts" in errors[0]


def test_strict_accepts_data_urls_and_keeps_them_as_blobs(scene):
    store = ImageStore(policy=STRICT)
    ref = store.intern(data_url(scene))
    assert ref.startswith("blob://") and store.get(ref).shape == (720, 1280, 3)


def test_allowed_folders_only(tmp_path):
    inside = tmp_path / "images"
    inside.mkdir()
    ok = write_scene(inside / "ok.png")
    outside = write_scene(tmp_path / "secret.png")
    (inside / "link.png").symlink_to(outside)
    store = ImageStore(policy=ImagePolicy.strict(file_roots=[inside]))
    assert store.get(ok).shape == (720, 1280, 3)
    for ref in (outside, str(inside / ".." / "secret.png"), str(inside / "link.png")):
        with pytest.raises(ImagePolicyError, match="outside the folders"):
            store.intern(ref)
    with pytest.raises(ImageLoadError, match="not found"):  # inside the root: may be said
        store.intern(str(inside / "missing.png"))


def test_private_addresses_are_refused_unless_allowed(image_server):
    url = image_server.url("/image.png")
    strict_http = ImagePolicy.strict().with_(allow_http=True)  # only the address check left
    with pytest.raises(ImagePolicyError, match="private or local address"):
        ImageStore(policy=strict_http).intern(url)
    assert image_server.hits.get("/image.png") is None  # refused before any request
    with pytest.raises(ImagePolicyError, match="http URLs are not accepted"):
        ImageStore(policy=STRICT).intern(url)
    # the library default (local use) fetches from your own machine
    assert ImageStore().get(url).shape == (720, 1280, 3)
    # and a deployment can allow-list one internal host
    allowed = strict_http.with_(allowed_hosts=frozenset({f"127.0.0.1:{image_server.port}"}))
    assert ImageStore(policy=allowed).intern(url).startswith("blob://")


def test_redirects_are_checked_at_every_hop(image_server):
    here = f"127.0.0.1:{image_server.port}"
    policy = ImagePolicy.strict().with_(allow_http=True, allowed_hosts=frozenset({here}))
    # the allowed host redirects to another local address: refused at the second hop
    target = f"http://localhost:{image_server.port}/image.png"
    with pytest.raises(ImagePolicyError, match="private or local address"):
        ImageStore(policy=policy).intern(image_server.url(f"/redirect?to={target}"))
    # a redirect within the allowed host is followed
    ok = image_server.url("/redirect?to=/image.png")
    assert ImageStore(policy=policy).get(ok).shape == (720, 1280, 3)
    # and redirect loops end
    with pytest.raises(ImageLoadError, match="more than 3 redirects"):
        ImageStore().intern(image_server.url("/loop"))
    assert image_server.hits["/loop"] == 4


def test_errors_never_repeat_credentials_or_query_strings(image_server):
    url = f"http://alice:hunter2@127.0.0.1:{image_server.port}/missing.png?token=s3cret"
    with pytest.raises(ImageLoadError) as info:
        ImageStore().intern(url)
    message = str(info.value)
    assert "HTTP 404" in message and "hunter2" not in message and "s3cret" not in message
    assert (
        "alice" not in redact(url)
        and redact("data:image/png;base64,AAAA") == "data:image/png;base64,..."
    )


def test_size_caps_on_files_and_data_urls(scene):
    small = ImagePolicy(max_bytes=1000)
    with pytest.raises(ImageLoadError, match="the limit is 0 MiB|MiB"):
        ImageStore(policy=small).get(scene)
    with pytest.raises(ImageLoadError, match="larger than"):
        ImageStore(policy=small).intern(data_url(scene))


def test_cache_follows_the_file_not_the_name(tmp_path):
    path = tmp_path / "changing.png"
    write_scene(path, colour=(220, 30, 30))
    store = ImageStore()
    assert tuple(store.get(str(path))[150, 150]) == (220, 30, 30)
    write_scene(path, colour=(30, 30, 220))  # rewritten under the same name
    os.utime(path, ns=(1, 1))  # even with an old modification time, the size/mtime pair changes
    assert tuple(store.get(str(path))[150, 150]) == (30, 30, 220)
    assert store.cache.decodes == 2


def test_the_served_graph_is_strict(monkeypatch, tmp_path, scene):
    """studio.py's store: data: URLs yes, local paths no (unless allow-listed)."""
    import importlib

    monkeypatch.setenv("SPECEYES_MODELS", "example")
    monkeypatch.setenv("SPECEYES_BLOB_DIR", str(tmp_path / "blobs"))
    monkeypatch.setenv("SPECEYES_ON_ERROR", "record")
    import speceyes_graph.integrations.studio as studio

    studio = importlib.reload(studio)
    g = studio.served_graph("speceyes")
    refused = g.invoke({"question": "What is the color of the large circle?", "images": [scene]})
    assert "local file paths are not accepted" in refused["error"]
    ok = g.invoke({"question": "What is the color of the square?", "images": [data_url(scene)]})
    assert ok["error"] is None and ok["answer"]
    assert any((tmp_path / "blobs").rglob("*"))  # the pasted image lives in the blob folder


def test_graph_uses_the_store_policy_for_tools_too(scene):
    """A zoom on a refused reference cannot happen: intake refuses the query first."""
    store = ImageStore(policy=STRICT)
    g = create_speceyes_graph(
        judge=judge("yes"), speculator=speculator(), agent=deepeyes_agent(), store=store
    ).compile()
    out = g.invoke({"question": "q", "images": [scene]})
    assert out["error"].startswith("input: ImagePolicyError") and out["agent_steps"] == []
