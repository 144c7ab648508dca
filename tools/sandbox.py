"""Run model-written Python in an OS-level sandbox: bubblewrap, one fresh process per run.

Thyme-style agents answer by writing Python that crops, rotates or measures the image. That
code is untrusted input, so it never runs in this process (the published harness ``exec``\\ s
it in-process behind a regex blocklist). :class:`Sandbox` runs each execution in a new
process under Linux namespaces (``bwrap`` from the ``bubblewrap`` package):

- **nothing to reach**: no network (a private, unconfigured network namespace), its own PID,
  IPC and UTS namespaces, all capabilities dropped, a new session, killed with its parent;
- **nothing to read**: a read-only view of the Python interpreter, its standard library and
  the allowed libraries (NumPy, Pillow, OpenCV by default) and nothing else: no ``/etc``,
  no home, no project files, no other installed packages;
- **nothing to keep**: ``/mnt/data`` and ``/tmp`` are private size-limited tmpfs mounts that
  vanish with the process; the query's image is a read-only copy in it;
- **bounded**: wall clock (the published 10 s), CPU time, address space, file size, open
  files, and a seccomp filter that refuses ``fork``/``exec`` (threads still work); process
  count is also capped with ``RLIMIT_NPROC`` where the kernel enforces it (not for root);
- **no secrets**: the environment is cleared.

Only images the code wrote under ``/mnt/data/temp_processed_images`` come back, each decoded
and checked here (format, pixels, bytes) before anyone sees it; stdout and stderr come back
cut to a cap. If bubblewrap is missing or cannot create namespaces, :class:`SandboxUnavailable`
says so and nothing runs: there is no fallback to in-process execution.

Start-up cost is hidden with a few *warm* processes: each is started ahead, has imported the
libraries, and waits for exactly one request; it is never reused. ``python
scripts/bench_sandbox.py`` prints the start-to-first-instruction overhead.
"""

from __future__ import annotations

import atexit
import functools
import glob
import importlib.metadata
import importlib.util
import io
import json
import os
import platform
import re
import shutil
import signal
import struct
import subprocess
import sys
import sysconfig
import threading
import time
from collections import deque
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import cast

import numpy as np

from .deadlines import time_left
from .images import ImageLoadError, decode_image

__all__ = [
    "Sandbox",
    "SandboxImage",
    "SandboxLimits",
    "SandboxResult",
    "SandboxUnavailable",
    "default_sandbox",
]

RUNNER = Path(__file__).with_name("sandbox_runner.py")
MAGIC = b"\nSPECEYES-RESULT "
INPUT_DIR = "/mnt/data/images"
OUTPUT_DIR = "/mnt/data/temp_processed_images"


class SandboxUnavailable(RuntimeError):
    """bubblewrap is missing or cannot sandbox here; model code will not run."""


@dataclass(frozen=True)
class SandboxLimits:
    """Per-execution limits. ``wall_s`` is the published Thyme limit (10 s)."""

    wall_s: float = 10.0
    cpu_s: float = 10.0
    memory_bytes: int = 1 << 30  # address space beyond the preloaded libraries
    processes: int = 64  # RLIMIT_NPROC (fork/exec are refused anyway)
    scratch_bytes: int = 256 << 20  # each of the /mnt/data and /tmp tmpfs mounts
    file_bytes: int = 64 << 20  # largest file the code may write
    stdout_bytes: int = 64 << 10  # stdout and stderr kept, each
    code_bytes: int = 256 << 10
    max_images: int = 8
    image_bytes: int = 32 << 20  # per returned image file
    image_pixels: int = 64_000_000  # per returned image, decoded

    def for_runner(self) -> dict:
        return {
            k: getattr(self, k)
            for k in (
                "cpu_s", "memory_bytes", "processes", "file_bytes", "stdout_bytes",
                "max_images", "image_bytes",
            )
        }  # fmt: skip


@dataclass
class SandboxImage:
    name: str  # relative to the output folder
    pixels: np.ndarray  # RGB uint8, validated


@dataclass
class SandboxResult:
    """What one execution did. ``error`` is None only when the code ran to completion and
    everything it produced was within the limits."""

    stdout: str = ""
    stderr: str = ""
    error: str | None = None
    images: list[SandboxImage] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    code: str = ""  # as executed, after the harness's rewrites
    latency_s: float = 0.0  # request to result
    overhead_s: float | None = None  # request to the code's first instruction
    timed_out: bool = False
    sealed: bool = False  # the seccomp filter was installed

    @property
    def ok(self) -> bool:
        return self.error is None

    def trace(self) -> dict:
        """JSON-safe summary (no pixels) for agent steps and logs."""
        out = asdict(self)
        out["images"] = [
            {"name": im.name, "size": list(im.pixels.shape[1::-1])} for im in self.images
        ]
        return out


@functools.lru_cache(maxsize=1)
def _distributions() -> Mapping[str, list[str]]:
    return importlib.metadata.packages_distributions()  # a scan of site-packages: once


@functools.lru_cache(maxsize=32)
def _dist_dirs(module: str) -> list[Path]:
    """The top-level folders a library's distribution installs (its package and its bundled
    shared libraries, e.g. ``numpy`` and ``numpy.libs``)."""
    spec = importlib.util.find_spec(module)
    if spec is None or not spec.submodule_search_locations:
        return []
    package = Path(next(iter(spec.submodule_search_locations)))
    site = package.parent
    dirs = {package}
    for dist in _distributions().get(module, []):
        for f in importlib.metadata.distribution(dist).files or []:
            top = f.parts[0]
            if top.startswith("..") or top.endswith((".dist-info", ".egg-info")):
                continue
            if (site / top).is_dir():
                dirs.add(site / top)
    return sorted(dirs)


def _is_under(path: Path, roots: Sequence[Path]) -> bool:
    return any(path == r or r in path.parents for r in roots)


def bwrap_command(
    limits: SandboxLimits,
    libraries: Sequence[str] = ("numpy", "PIL", "cv2"),
    bwrap: str = "bwrap",
) -> list[str]:
    """The bubblewrap command line of one sandboxed runner (see the module docstring)."""
    exe = Path(os.path.realpath(sys.executable))
    base = Path(sys.base_prefix)
    stdlib = Path(sysconfig.get_paths(vars={"base": sys.base_prefix})["stdlib"])
    cmd = [
        # --as-pid-1: the runner itself is PID 1, so there is no helper process of
        # bubblewrap's inside for the code to trace or signal
        bwrap, "--unshare-all", "--die-with-parent", "--new-session", "--as-pid-1",
        "--cap-drop", "ALL",
        "--clearenv", "--setenv", "PATH", "/usr/bin:/bin", "--setenv", "HOME", "/tmp",
        "--setenv", "LANG", "C.UTF-8", "--setenv", "OMP_NUM_THREADS", "1",
        "--setenv", "OPENBLAS_NUM_THREADS", "1", "--setenv", "MKL_NUM_THREADS", "1",
        "--proc", "/proc", "--dev", "/dev",
    ]  # fmt: skip
    usr = Path("/usr")
    system = [usr]
    cmd += ["--ro-bind", "/usr", "/usr"]
    for name in ("lib", "lib64", "lib32", "bin", "sbin"):
        top = Path("/") / name
        if top.is_symlink():
            cmd += ["--symlink", os.readlink(top), str(top)]
        elif top.is_dir():
            cmd += ["--ro-bind", str(top), str(top)]
            system.append(top)
    if Path("/etc/ld.so.cache").exists():  # the loader's index of /usr/lib; no secrets
        cmd += ["--ro-bind", "/etc/ld.so.cache", "/etc/ld.so.cache"]
    # the interpreter, its shared library and the standard library; its site-packages hidden
    for path in (exe, Path(sysconfig.get_config_var("LIBDIR") or ""), stdlib):
        if path.parts and path.exists() and not _is_under(path, system):
            cmd += ["--ro-bind", str(path), str(path)]
    for site in {
        Path(sysconfig.get_paths(vars={"base": sys.base_prefix, "platbase": sys.base_prefix})[k])
        for k in ("purelib", "platlib")
    }:
        if site.is_dir() and _is_under(site, [stdlib, base]):
            cmd += ["--tmpfs", str(site), "--remount-ro", str(site)]
    # Debian's package folders (apt's and pip's); only those: /usr/local/lib also holds
    # the standard library and libpython of a Python built there (the python Docker images)
    for pattern in ("/usr/lib/python3*/dist-packages", "/usr/local/lib/python3*/dist-packages"):
        for folder in sorted(glob.glob(pattern)):
            cmd += ["--tmpfs", folder, "--remount-ro", folder]
    # the allowed libraries, in a site folder of their own
    cmd += ["--tmpfs", "/sandbox", "--ro-bind", str(RUNNER), "/sandbox/runner.py"]
    cmd += ["--dir", "/sandbox/site"]
    for module in libraries:
        for d in _dist_dirs(module):
            cmd += ["--ro-bind", str(d), f"/sandbox/site/{d.name}"]
    cmd += ["--remount-ro", "/sandbox"]
    # private scratch space, size-limited
    size = str(limits.scratch_bytes)
    cmd += [
        "--size",
        size,
        "--tmpfs",
        "/tmp",
        "--dir",
        "/mnt",
        "--size",
        size,
        "--tmpfs",
        "/mnt/data",
    ]
    # nothing else writable: bubblewrap's own root and /dev are unbounded tmpfs mounts
    cmd += ["--remount-ro", "/", "--remount-ro", "/dev"]
    cmd += ["--chdir", "/mnt/data", str(exe), "-I", "-S", "-B", "/sandbox/runner.py"]
    return cmd


class _Process:
    """One sandboxed runner: started ahead, used once."""

    def __init__(self, command: list[str], cap: int):
        self.cap = cap
        self.popen = subprocess.Popen(
            command,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            start_new_session=True,
            close_fds=True,
            env={},  # nothing of the host's environment, not even in bubblewrap's own process
        )
        self.out = bytearray()
        self.err = bytearray()
        self.overflow = False
        self.ready = threading.Event()
        self.done = threading.Event()
        self._readers = [
            threading.Thread(target=self._read_out, daemon=True),
            threading.Thread(target=self._read_err, daemon=True),
        ]
        for t in self._readers:
            t.start()

    def _read_out(self) -> None:
        # stdout=PIPE with the default buffering: a BufferedReader (read1), never None
        stream = cast(io.BufferedReader, self.popen.stdout)
        try:
            while chunk := stream.read1(1 << 16):
                if len(self.out) + len(chunk) > self.cap:
                    self.overflow = True  # keep draining, keep nothing more
                    continue
                self.out += chunk
                if not self.ready.is_set() and b"READY\n" in self.out:
                    self.ready.set()
        except (OSError, ValueError):
            pass
        finally:
            self.ready.set()
            self.done.set()

    def _read_err(self) -> None:
        # stderr=PIPE with the default buffering: a BufferedReader (read1), never None
        stream = cast(io.BufferedReader, self.popen.stderr)
        try:
            while chunk := stream.read1(1 << 16):
                if len(self.err) < 1 << 16:
                    self.err += chunk[: (1 << 16) - len(self.err)]
        except (OSError, ValueError):
            pass

    def kill(self) -> None:
        if self.popen.poll() is None:
            try:
                os.killpg(self.popen.pid, signal.SIGKILL)
            except (ProcessLookupError, PermissionError):
                pass
        try:
            self.popen.wait(timeout=5)
        except subprocess.TimeoutExpired:  # pragma: no cover - a stuck kernel
            pass
        for reader in self._readers:  # read what it wrote to the end before the pipes close
            reader.join(timeout=1)
        for stream in (self.popen.stdin, self.popen.stdout, self.popen.stderr):
            if stream is None:  # never: all three are pipes
                continue
            try:
                stream.close()
            except OSError:
                pass

    def startup_error(self) -> str:
        text = self.err.decode("utf-8", "replace").strip()
        return text or f"the sandbox exited with status {self.popen.returncode}"


class Sandbox:
    """Runs code in bubblewrap sandboxes; at most ``max_concurrent`` at once, ``warm``
    processes started ahead. Thread-safe; one instance serves every query of a graph.

    ``run(code, image=...)`` never raises for anything the code does: every failure comes
    back as ``SandboxResult.error``. It raises :class:`SandboxUnavailable` when no sandbox
    can be started at all.
    """

    def __init__(
        self,
        limits: SandboxLimits | None = None,
        *,
        warm: int = 2,
        max_concurrent: int | None = None,
        libraries: Sequence[str] = ("numpy", "PIL", "cv2"),
        bwrap: str | None = None,
    ):
        self.limits = limits or SandboxLimits()
        if platform.system() != "Linux":
            raise SandboxUnavailable("the code sandbox needs Linux namespaces (bubblewrap)")
        found = shutil.which(bwrap or "bwrap")  # an explicit path too: it must be executable
        if not found:
            where = f" at {bwrap}" if bwrap else ""
            raise SandboxUnavailable(
                f"bubblewrap (bwrap) is not installed{where}: `apt-get install bubblewrap` "
                "(Debian/Ubuntu) or `dnf install bubblewrap`; model-written code is never run "
                "without it"
            )
        self.command = bwrap_command(self.limits, libraries, found)
        self.warm = max(0, warm)
        self.max_concurrent = max_concurrent or max(1, os.cpu_count() or 1)
        self._slots = threading.BoundedSemaphore(self.max_concurrent)
        self._idle: deque[_Process] = deque()
        self._lock = threading.Lock()
        self._closed = False
        self._wanted = threading.Event()  # wakes the one thread that starts warm processes
        self._warmer: threading.Thread | None = None
        self._checked = False
        cap = (
            self.limits.max_images * (self.limits.image_bytes + 4096) + 4 * self.limits.stdout_bytes
        )
        self._cap = cap + (1 << 20)
        self.started = 0  # processes started, for benchmarks
        atexit.register(self.close)

    # --- processes ----------------------------------------------------------------------

    def _spawn(self) -> _Process:
        self.started += 1
        return _Process(self.command, self._cap)

    def _keep_warm(self) -> None:
        """Start every warm process from this one long-lived thread: bubblewrap's
        ``--die-with-parent`` is tied to the *thread* that started it, so a process started by
        a short-lived thread is killed as soon as that thread ends."""
        while not self._closed:
            self._wanted.wait()
            self._wanted.clear()
            self._refill()

    def _refill(self) -> None:
        with self._lock:
            missing = 0 if self._closed else self.warm - len(self._idle)
        for _ in range(max(0, missing)):
            proc = self._spawn()
            with self._lock:
                if self._closed:
                    proc.kill()
                    return
                self._idle.append(proc)

    def _take(self) -> _Process:
        with self._lock:
            while self._idle:
                proc = self._idle.popleft()
                if proc.popen.poll() is None:
                    break
                proc.kill()
            else:
                proc = None
        if self.warm:
            with self._lock:
                if self._warmer is None and not self._closed:
                    self._warmer = threading.Thread(
                        target=self._keep_warm, daemon=True, name="sandbox-warm"
                    )
                    self._warmer.start()
            self._wanted.set()
        return proc or self._spawn()

    def check(self) -> None:
        """Start one sandbox and run ``pass`` (once per instance); raise
        :class:`SandboxUnavailable` with bubblewrap's own message if that fails."""
        if self._checked:
            return
        result = self.run("pass", _checking=True)
        if result.error:
            raise SandboxUnavailable(f"the code sandbox does not work here: {result.error}")
        self._checked = True

    def close(self) -> None:
        with self._lock:
            self._closed = True
            idle, self._idle = list(self._idle), deque()
        self._wanted.set()  # the warm thread ends
        for proc in idle:
            proc.kill()

    def __enter__(self) -> Sandbox:
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    # --- one execution ------------------------------------------------------------------

    def run(
        self,
        code: str,
        image: bytes | None = None,
        *,
        image_name: str = "image.png",
        image_size: tuple[int, int] | None = None,
        timeout: float | None = None,
        _checking: bool = False,
    ) -> SandboxResult:
        """Execute ``code`` with ``image`` (encoded bytes) readable at
        ``/mnt/data/images/<image_name>`` (the code also finds it as ``image_path``).

        ``image_size`` (width, height) lets the published harness clamp literal crop boxes.
        The wall limit is the smaller of ``limits.wall_s``, ``timeout`` and the time left
        before the current query deadline."""
        if self._closed:
            raise SandboxUnavailable("this sandbox was closed")
        if not _checking and not self._checked:
            self.check()
        t0 = time.perf_counter()
        if (
            not isinstance(code, str)
            or len(code.encode("utf-8", "replace")) > self.limits.code_bytes
        ):
            return SandboxResult(
                error=f"the code is not a string of at most {self.limits.code_bytes} bytes",
                latency_s=time.perf_counter() - t0,
            )
        wall = min(x for x in (self.limits.wall_s, timeout, time_left()) if x is not None)
        name = (
            re.sub(r"[^A-Za-z0-9._-]", "_", Path(image_name).name)[:100].lstrip(".") or "image.png"
        )
        request = {
            "code": code,
            "image_name": name,
            "image_size": list(image_size) if image_size else None,
            "image_bytes": len(image or b""),
            "limits": self.limits.for_runner(),
        }
        header = json.dumps(request).encode()
        with self._slots:
            asked = time.time()  # overhead_s counts from here: a cold start is overhead too
            proc = self._take()
            try:
                return self._execute(proc, header, image or b"", wall, t0, asked)
            finally:
                proc.kill()

    def _execute(
        self, proc: _Process, header: bytes, image: bytes, wall: float, t0: float, asked: float
    ) -> SandboxResult:
        if not proc.ready.wait(timeout=max(wall, 10.0)) or b"READY\n" not in proc.out:
            proc.kill()
            if b"READY\n" not in proc.out:
                raise SandboxUnavailable(f"the sandbox did not start: {proc.startup_error()}")
        stdin = proc.popen.stdin
        assert stdin is not None  # stdin=PIPE
        try:
            stdin.write(struct.pack(">I", len(header)) + header + image)
            stdin.close()
        except (BrokenPipeError, OSError):
            pass  # the process died: reported below
        try:
            proc.popen.wait(timeout=max(0.0, wall))
            timed_out = False
        except subprocess.TimeoutExpired:
            timed_out = True
        proc.kill()
        proc.done.wait(timeout=5)
        result = self._parse(proc, asked)
        result.latency_s = time.perf_counter() - t0
        if timed_out:
            result.timed_out = True
            result.error = f"the code did not finish within the time limit ({wall:.1f} s)"
        elif result.error is None and proc.popen.returncode not in (0, None) and not result.stdout:
            result.error = _exit_reason(proc.popen.returncode)
        return result

    def _parse(self, proc: _Process, asked: float) -> SandboxResult:
        data = bytes(proc.out)
        at = data.find(MAGIC, data.find(b"READY\n"))
        if at < 0:
            return SandboxResult(error=_exit_reason(proc.popen.returncode))
        try:
            start = at + len(MAGIC)
            length = int(data[start : start + 16], 16)
            body_at = start + 17
            header = json.loads(data[body_at : body_at + length])
            blobs_at = body_at + length
            if not isinstance(header, dict):
                raise ValueError("not an object")
        except (ValueError, UnicodeDecodeError) as exc:
            return SandboxResult(error=f"the sandbox returned a malformed result: {exc}")
        limits = self.limits
        result = SandboxResult(
            stdout=str(header.get("stdout") or "")[: limits.stdout_bytes],
            stderr=str(header.get("stderr") or "")[: limits.stdout_bytes],
            error=str(header["error"])[:4000] if header.get("error") else None,
            notes=[str(n)[:300] for n in (header.get("notes") or [])[:20]],
            code=str(header.get("code") or ""),
            sealed=bool(header.get("sealed")),
        )
        started = header.get("started")
        if isinstance(started, (int, float)):
            result.overhead_s = max(0.0, started - asked)
        problems = []
        for key, label in (("stdout_size", "stdout"), ("stderr_size", "stderr")):
            size = header.get(key)
            if isinstance(size, int) and size > limits.stdout_bytes:
                problems.append(
                    f"{label} was {size} bytes; only the first {limits.stdout_bytes} were kept"
                )
        offset = blobs_at
        for entry in (header.get("images") or [])[: limits.max_images]:
            try:
                name, size = str(entry[0])[:200], int(entry[1])
            except (TypeError, ValueError, IndexError):
                problems.append("the sandbox listed an image it did not describe")
                break
            blob = data[offset : offset + size]
            offset += size
            if size > limits.image_bytes or len(blob) != size:
                problems.append(f"{name}: {size} bytes is over the limit of {limits.image_bytes}")
                continue
            try:
                pixels = decode_image(blob, name, max_pixels=limits.image_pixels)
            except ImageLoadError as exc:
                problems.append(f"{name} is not a usable image: {exc}")
                continue
            result.images.append(SandboxImage(name, pixels))
        if proc.overflow:
            problems.append("the sandbox wrote more output than allowed; the rest was dropped")
        problems += result.notes
        if problems and result.error is None:
            result.error = "; ".join(problems)
        return result


def _exit_reason(code: int | None) -> str:
    if code is None:
        return "the sandbox ended without a result"
    if code < 0 or code > 128:  # killed by a signal (bubblewrap reports 128 + signal)
        sig = -code if code < 0 else code - 128
        reasons: dict[int, str] = {
            signal.SIGXCPU: "it used up its CPU time",
            signal.SIGKILL: "it was killed (time or memory limit)",
            signal.SIGSEGV: "it crashed (segmentation fault)",
            signal.SIGXFSZ: "it wrote a file over the size limit",
        }
        why = reasons.get(sig, f"signal {sig}")
        return f"the code's process ended without a result: {why}"
    return f"the code's process ended without a result (exit status {code})"


_DEFAULT: Sandbox | None = None
_DEFAULT_LOCK = threading.Lock()


def default_sandbox() -> Sandbox:
    """One shared :class:`Sandbox` per process (created on first use)."""
    global _DEFAULT
    with _DEFAULT_LOCK:
        if _DEFAULT is None:
            _DEFAULT = Sandbox()
        return _DEFAULT
