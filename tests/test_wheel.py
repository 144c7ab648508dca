"""The package as a pip user gets it: the wheel's licence and its type information.

The wheel is built once for the module (``uv build``, as a release is) and installed, without
its dependencies, into a fresh virtual environment that reaches this project's environment
for them (one ``.pth`` line): the installed ``speceyes_graph`` and ``speceyes_tools`` are the
wheel's files, not the repository's, and a user's type checker finds them as it would after
``pip install speceyes-graph``.
"""

from __future__ import annotations

import shutil
import site
import subprocess
import sys
import textwrap
import zipfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


def uv() -> str:
    found = shutil.which("uv") or str(Path(sys.executable).with_name("uv"))
    assert Path(found).exists(), "uv is not installed: run `bash scripts/setup.sh`"
    return found


def build(kind: str, source: Path, out: Path) -> Path:
    """``uv build --wheel`` or ``--sdist`` of ``source`` (the repository, or an sdist)."""
    done = subprocess.run(
        [uv(), "build", f"--{kind}", "-o", str(out), str(source)],
        capture_output=True, text=True, timeout=600,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    (found,) = out.glob("speceyes_graph-*.whl" if kind == "wheel" else "speceyes_graph-*.tar.gz")
    return found


@pytest.fixture(scope="module")
def wheel(tmp_path_factory) -> Path:
    return build("wheel", ROOT, tmp_path_factory.mktemp("wheel"))


@pytest.fixture(scope="module")
def installed(wheel, tmp_path_factory) -> Path:
    """The Python of a fresh environment holding the wheel (dependencies: this one's)."""
    venv = tmp_path_factory.mktemp("venv") / "env"
    for command in (
        [uv(), "venv", "-q", "--python", sys.executable, str(venv)],
        [uv(), "pip", "install", "-q", "--no-deps", "--python", str(venv / "bin" / "python"),
         str(wheel)],
    ):  # fmt: skip
        done = subprocess.run(command, capture_output=True, text=True, timeout=600)
        assert done.returncode == 0, done.stderr[-3000:]
    python = venv / "bin" / "python"
    own = subprocess.run(
        [str(python), "-c", "import site; print(site.getsitepackages()[0])"],
        capture_output=True, text=True, check=True,
    ).stdout.strip()  # fmt: skip
    (Path(own) / "dependencies.pth").write_text("\n".join(site.getsitepackages()) + "\n")
    return python


def test_the_wheel_carries_its_licence(wheel):
    with zipfile.ZipFile(wheel) as z:
        info = next(n for n in z.namelist() if n.endswith(".dist-info/METADATA"))
        metadata = z.read(info).decode()
        licence = z.read(info.replace("METADATA", "licenses/LICENSE")).decode()
        names = set(z.namelist())
    assert "License-Expression: Apache-2.0" in metadata.splitlines()
    assert "License-File: LICENSE" in metadata.splitlines()
    assert licence == (ROOT / "LICENSE").read_text()
    assert "Apache License" in licence and "Version 2.0, January 2004" in licence
    assert {"speceyes_graph/py.typed", "speceyes_tools/py.typed"} <= names


USER_SCRIPT = """
from speceyes_graph import SpecEyesInput, SpecEyesOutput, create_speceyes_graph
from speceyes_graph.demo import demo_models
from speceyes_tools.images import ImageStore


def ask(question: str, image: str) -> str | None:
    models = demo_models()
    graph = create_speceyes_graph(speculator=models["small"], agent=models["large"]).compile()
    query: SpecEyesInput = {"question": question, "images": [image]}
    out: SpecEyesOutput = graph.invoke(query, version="v2").value
    store: ImageStore = ImageStore()
    del store
    return out.get("answer")
"""

MISTAKE = """

def route_count(question: str, image: str) -> int:
    query: SpecEyesInput = {"question": question, "images": [image]}
    out = create_speceyes_graph().compile().invoke(query, version="v2").value  # SpecEyesOutput
    return out["answer"]  # a str (or None), not an int
"""


def mypy(python: Path, script: Path) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "mypy", "--python-executable", str(python), "--strict",
         "--cache-dir", str(script.parent / ".mypy_cache"), script.name],
        capture_output=True, text=True, timeout=600, cwd=script.parent,
    )  # fmt: skip


def test_a_users_script_type_checks_against_the_installed_package(installed, tmp_path):
    """mypy --strict, from a folder outside the repository: the annotated script passes; the
    same with a deliberate mistake fails, on the mistake's line."""
    good, bad = tmp_path / "good.py", tmp_path / "bad.py"
    good.write_text(textwrap.dedent(USER_SCRIPT))
    bad.write_text(textwrap.dedent(USER_SCRIPT) + textwrap.dedent(MISTAKE))
    checked = mypy(installed, good)
    assert checked.returncode == 0, checked.stdout + checked.stderr
    checked = mypy(installed, bad)
    mistake_line = (
        bad.read_text()
        .splitlines()
        .index('    return out["answer"]  # a str (or None), not an int')
    )
    assert checked.returncode == 1, checked.stdout
    errors = [line for line in checked.stdout.splitlines() if ": error:" in line]
    assert len(errors) == 1 and errors[0].startswith(f"bad.py:{mistake_line + 1}:"), errors
    assert "return-value" in errors[0]


def test_the_sdist_builds_the_same_wheel_and_leaves_the_tests_out(wheel, tmp_path):
    """The sdist leaves tests/ out on purpose (MANIFEST.in says why) and builds a wheel
    with the same files as the repository's."""
    import tarfile

    sdist = build("sdist", ROOT, tmp_path)
    with tarfile.open(sdist) as t:
        top = {name.split("/", 2)[1] for name in t.getnames() if name.count("/") >= 1}
    assert {"LICENSE", "README.md", "pyproject.toml", "speceyes_graph", "tools"} <= top
    assert "tests" not in top
    rebuilt = build("wheel", sdist, tmp_path / "from-sdist")
    with zipfile.ZipFile(wheel) as a, zipfile.ZipFile(rebuilt) as b:
        assert sorted(a.namelist()) == sorted(b.namelist())


def test_an_install_runs_the_demo_and_serves_from_its_own_config(installed, tmp_path, demo_local):
    """From a folder outside the repository, with only the installed wheel: the demo runs,
    ``speceyes serve-config`` writes the server configs, and ``langgraph dev`` started from
    them answers a query through ``langgraph_sdk`` as ``graph.invoke`` does."""
    import base64
    import json
    import os
    import signal
    import time
    import urllib.request

    from langgraph_sdk import get_sync_client

    from speceyes_graph import create_speceyes_graph
    from speceyes_graph.demo import DEMO_GRAPH_SETTINGS, demo_queries
    from speceyes_graph.models.servers import free_port

    speceyes = installed.with_name("speceyes")
    env = {k: v for k, v in os.environ.items() if not k.startswith("SPECEYES_")}
    env.update(PYTHONPATH="", LANGSMITH_TRACING="false", LANGGRAPH_CLI_NO_ANALYTICS="1")
    demo = subprocess.run(
        [str(speceyes), "demo", "--n", "12", "-o", "demo"],
        cwd=tmp_path, env=env, capture_output=True, text=True, timeout=600,
    )  # fmt: skip
    assert demo.returncode == 0, demo.stderr[-3000:]
    assert json.loads((tmp_path / "demo" / "summary.json").read_text())["errors"] == 0

    done = subprocess.run(
        [str(speceyes), "serve-config", "server"],
        cwd=tmp_path, env=env, capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    config = tmp_path / "server" / "langgraph.json"
    aegra = json.loads((tmp_path / "server" / "aegra.json").read_text())
    serve_py = Path(aegra["graphs"]["speceyes"].rsplit(":", 1)[0])
    assert serve_py.exists() and str(ROOT) not in str(serve_py)  # the installed file

    port = free_port()
    log = open(tmp_path / "dev.log", "w+")
    server = subprocess.Popen(
        [str(installed), "-m", "langgraph_cli", "dev", "--config", str(config), "--port",
         str(port), "--host", "127.0.0.1", "--no-browser", "--no-reload"],
        cwd=tmp_path / "server", env=env, stdout=log, stderr=subprocess.STDOUT,
        start_new_session=True,
    )  # fmt: skip
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.time() + 240
        while server.poll() is None and time.time() < deadline:
            try:
                urllib.request.urlopen(url + "/ok", timeout=2)
                break
            except OSError:
                time.sleep(1)
        log.seek(0)
        assert server.poll() is None and time.time() < deadline, log.read()[-3000:]
        (q,) = demo_queries(tmp_path / "q", 1, micro_share=0.0)
        image = "data:image/png;base64," + base64.b64encode(Path(q.image).read_bytes()).decode()
        query = {"question": q.question, "images": [image], "options": q.options}
        client = get_sync_client(url=url)
        thread = client.threads.create()["thread_id"]
        out = client.runs.wait(thread, "speceyes", input=query)
    finally:
        os.killpg(server.pid, signal.SIGTERM)
        server.wait(timeout=30)
    graph = create_speceyes_graph(
        speculator=demo_local["small"], agent=demo_local["large"], **DEMO_GRAPH_SETTINGS
    ).compile()
    assert out["error"] is None and out["answer"] == graph.invoke(query)["answer"]
