"""The code sandbox (:mod:`speceyes_tools.sandbox`) against good, failing and hostile code.

Every hostile case asserts two things: the result records a clear error (``result.error``
names the cause), and nothing happened outside the sandbox (no connection reached a host
server, no host file was read or written, no process was left behind, the test process and
the next execution are fine).

These tests need bubblewrap (``apt-get install bubblewrap``; ``scripts/setup.sh`` installs
it). Without it they FAIL on purpose instead of skipping: the sandbox is a security
boundary, and a CI that silently skipped it would prove nothing.
"""

from __future__ import annotations

import io
import json
import os
import shutil
import socket
import sys
import threading
import time
import uuid
from collections import defaultdict
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

import speceyes_tools.sandbox as sandbox_module
from speceyes_tools.sandbox import OUTPUT_DIR, Sandbox, SandboxLimits, SandboxUnavailable

REPO = Path(__file__).resolve().parent.parent
WALL_S = 8.0  # the module sandbox's wall and CPU limits: generous, for a slow machine
LOOP_WALL_S = 3.0  # a sandbox of its own for the infinite loop: short
SANDBOX_ENV = {"PATH", "HOME", "LANG", "OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS",
               "MKL_NUM_THREADS", "PWD"}  # fmt: skip


def require_bwrap() -> None:
    if shutil.which("bwrap") is None:
        pytest.fail(
            "bubblewrap (bwrap) is not installed, so the code sandbox cannot be tested: "
            "`apt-get install bubblewrap` (scripts/setup.sh installs it)",
            pytrace=False,
        )


def new_sandbox(limits: SandboxLimits | None = None, **kwargs) -> Sandbox:
    require_bwrap()
    return Sandbox(limits or SandboxLimits(wall_s=WALL_S, cpu_s=WALL_S), **kwargs)


@pytest.fixture(scope="module")
def sb():
    box = new_sandbox(warm=2, max_concurrent=4)
    box.check()
    yield box
    box.close()


# --- helpers ---------------------------------------------------------------------------------


def png_bytes(arr: np.ndarray) -> bytes:
    buf = io.BytesIO()
    Image.fromarray(arr).save(buf, "PNG")
    return buf.getvalue()


def gradient(w: int = 640, h: int = 480) -> np.ndarray:
    ys, xs = np.mgrid[0:h, 0:w]
    return np.stack([xs % 256, ys % 256, (xs // 256 + ys // 256) % 256], -1).astype(np.uint8)


def processes() -> dict[int, tuple[int, bytes]]:
    """pid -> (parent pid, command line) of every process visible in /proc."""
    out = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat") as f:
                ppid = int(f.read().rsplit(")", 1)[1].split()[1])
            with open(f"/proc/{entry}/cmdline", "rb") as f:
                cmdline = f.read()
        except (OSError, ValueError, IndexError):
            continue  # gone meanwhile
        out[int(entry)] = (ppid, cmdline)
    return out


def descendants(procs: dict[int, tuple[int, bytes]], roots) -> set[int]:
    children = defaultdict(list)
    for pid, (ppid, _) in procs.items():
        children[ppid].append(pid)
    found, todo = set(), list(roots)
    while todo:
        pid = todo.pop()
        if pid in found:
            continue
        found.add(pid)
        todo += children[pid]
    return found


def _in_sandbox(cmd: bytes) -> bool:
    return b"/sandbox/runner.py" in cmd or cmd.split(b"\0", 1)[0].endswith(b"bwrap")


def _owner(procs: dict[int, tuple[int, bytes]], pid: int) -> int:
    """The first ancestor of ``pid`` that is not part of a sandbox (bwrap, the runner)."""
    seen: set[int] = set()
    while pid in procs and _in_sandbox(procs[pid][1]) and pid not in seen:
        seen.add(pid)
        pid = procs[pid][0]
    return pid


def _exe(pid: int) -> str | None:
    try:
        return os.path.realpath(f"/proc/{pid}/exe")
    except OSError:
        return None


def stray_processes(*sandboxes: Sandbox) -> set[int]:
    """Sandbox processes (bubblewrap, the runner, whatever the code in them started) of this
    test process, and those that escaped their parent (re-parented to init or a subreaper),
    except the warm (idle, not yet used) processes of ``sandboxes`` and their own children.

    Not counted: the rest of this process's children (under pytest-xdist a worker also holds
    the session's servers: Postgres starts autovacuum workers now and then), and another
    test process's sandboxes (a sandbox whose first ancestor outside it is another live
    process of this Python). Both made these tests fail when the suite's two workers ran
    them beside engine or sandbox tests."""
    procs = processes()
    warm = {p.popen.pid for box in sandboxes for p in list(box._idle)}
    python = os.path.realpath(sys.executable)
    roots = set()
    for pid, (ppid, cmd) in procs.items():
        if not _in_sandbox(cmd) or _in_sandbox(procs.get(ppid, (0, b""))[1]):
            continue  # not a sandbox process, or not the top of one
        owner = _owner(procs, pid)
        if owner == os.getpid() or _exe(owner) != python:  # ours, or escaped
            roots.add(pid)
    return descendants(procs, roots) - descendants(procs, warm)


def no_new_processes(before: set[int], *sandboxes: Sandbox, within: float = 10.0) -> set[int]:
    """Processes that appeared since ``before``, polled for up to ``within`` seconds (the warm
    pool refills in the background and a killed sandbox takes a moment to go)."""
    deadline = time.monotonic() + within
    while True:
        new = stray_processes(*sandboxes) - before
        if not new or time.monotonic() > deadline:
            return new
        time.sleep(0.1)


def settle(box: Sandbox, timeout: float = 30.0) -> None:
    """Wait until the warm pool is full and every warm process has said READY."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        idle = list(box._idle)
        if len(idle) >= box.warm and all(p.ready.is_set() for p in idle):
            return
        time.sleep(0.05)
    pytest.fail(f"the warm pool did not fill within {timeout} s")


def assert_alive_and_working(box: Sandbox) -> None:
    os.kill(os.getpid(), 0)  # this process
    result = box.run("print('still here', 6 * 7)")
    assert result.ok, result.error
    assert result.stdout == "still here 42\n"


# --- good code and the published harness's rewrites ------------------------------------------


def test_good_code_crops_with_rewrites_applied(sb):
    arr = gradient()
    code = (
        'image_path = "/some/missing.png"\n'
        "img = Image.open(image_path)\n"
        "crop_box = (600, 400, 1000, 900)\n"  # beyond the 640x480 image
        "cropped = img.crop(crop_box)\n"
        f'processed_path = "{OUTPUT_DIR}/crop.png"\n'
        "cropped.save(processed_path)\n"
        "print(processed_path)\n"
    )
    result = sb.run(code, png_bytes(arr), image_name="query.png", image_size=(640, 480))
    assert result.ok, result.error
    assert result.sealed  # the seccomp filter was installed
    assert result.stdout == f"{OUTPUT_DIR}/crop.png\n"
    assert "image_path = '/mnt/data/images/query.png'" in result.code  # the missing path
    # clamped into the image, enlarged to the minimum side of 64: x 576..640, y 400..480
    assert "crop_box = (576, 400, 640, 480)" in result.code
    assert [im.name for im in result.images] == ["crop.png"]
    pixels = result.images[0].pixels
    assert pixels.shape == (80, 64, 3) and pixels.dtype == np.uint8
    np.testing.assert_array_equal(pixels, arr[400:480, 576:640])
    assert result.overhead_s is not None and 0 <= result.overhead_s < result.latency_s
    json.dumps(result.trace())  # JSON-safe


# --- nothing to reach -----------------------------------------------------------------------


def test_no_connection_reaches_a_host_server(sb):
    token = uuid.uuid4().hex
    tcp = socket.create_server(("127.0.0.1", 0))
    unix = socket.socket(socket.AF_UNIX)
    unix.bind(f"\0speceyes-test-{token}")  # abstract: no file, scoped to the network namespace
    accepted, stop = [], threading.Event()

    def serve(server):
        server.settimeout(0.1)
        while not stop.is_set():
            try:
                conn, _ = server.accept()
            except TimeoutError:
                continue
            except OSError:
                return
            accepted.append(server.family)
            conn.close()

    threads = [threading.Thread(target=serve, args=(s,), daemon=True) for s in (tcp, unix)]
    unix.listen()
    for t in threads:
        t.start()
    port = tcp.getsockname()[1]
    try:
        attempts = {
            "loopback": f"import socket\ns = socket.create_connection(('127.0.0.1', {port}), timeout=2)\nprint('connected')",
            "abstract unix": f"import socket\ns = socket.socket(socket.AF_UNIX)\ns.connect('\\0speceyes-test-{token}')\nprint('connected')",
            "external": "import socket\ns = socket.create_connection(('203.0.113.1', 80), timeout=1)\nprint('connected')",
            "dns": "import socket\nprint(socket.getaddrinfo('example.com', 80))\nprint('connected')",
        }
        for what, code in attempts.items():
            result = sb.run(code)
            assert result.error, what
            assert "<model code>" in result.error, (what, result)  # raised by the code itself
            assert "connected" not in result.stdout, what
        time.sleep(0.3)  # a connection in flight would have been accepted by now
        assert accepted == [], "a sandboxed connection reached the host"
        # the servers did work: the host itself can connect
        socket.create_connection(("127.0.0.1", port), timeout=2).close()
        deadline = time.monotonic() + 5
        while not accepted and time.monotonic() < deadline:
            time.sleep(0.05)
        assert accepted == [socket.AF_INET]
    finally:
        stop.set()
        for t in threads:
            t.join(timeout=2)
        tcp.close()
        unix.close()


# --- nothing to read ------------------------------------------------------------------------


def _host_files_to_hide() -> list[Path]:
    return [
        Path("/etc/passwd"),
        REPO / "pyproject.toml",
        Path(sandbox_module.__file__).resolve(),
    ]


@pytest.mark.parametrize("path", _host_files_to_hide(), ids=lambda p: p.name)
def test_host_files_cannot_be_read(sb, path):
    assert path.is_file()
    result = sb.run(f"print(open({str(path)!r}).read())")
    assert result.error and "No such file or directory" in result.error, result
    assert result.stdout == ""
    content = path.read_text(errors="replace")
    lines = [line for line in content.splitlines() if len(line.strip()) >= 12]
    assert not any(line in result.stdout + result.stderr + result.error for line in lines)


def test_home_directory_is_not_visible(sb):
    home = Path.home().resolve()
    # bubblewrap creates the parents of what it binds: the interpreter may live under home
    bound = [Path(os.path.realpath(sys.executable)), Path(sys.base_prefix).resolve()]
    on_the_way = {p.relative_to(home).parts[0] for p in bound if home in p.parents}
    code = (
        "import json\n"
        f"home = {str(home)!r}\n"
        "try:\n"
        "    seen = sorted(os.listdir(home))\n"
        "except OSError as exc:\n"
        "    seen = str(exc)\n"
        "print(json.dumps(seen))\n"
    )
    result = sb.run(code)
    assert result.ok, result.error
    seen = json.loads(result.stdout)
    if isinstance(seen, list):
        assert set(seen) <= on_the_way, f"home entries visible in the sandbox: {seen}"
    secrets = [p for p in sorted(home.iterdir()) if p.is_file() and p.name not in on_the_way]
    for path in secrets[:3]:  # e.g. .bashrc, .gitconfig
        result = sb.run(f"print(open({str(path)!r}, 'rb').read())")
        assert result.error and "No such file or directory" in result.error, result
        assert result.stdout == ""


# --- nothing to keep ------------------------------------------------------------------------


@pytest.mark.parametrize("where", ["/usr", "tmp_path", "/", "/mnt", "/dev/shm", "repo", "home"])
def test_writes_outside_the_scratch_space_fail(sb, tmp_path, where):
    name = f"escape-{uuid.uuid4().hex}.txt"
    folder = {"tmp_path": tmp_path, "repo": REPO, "home": Path.home()}.get(where, Path(where))
    target = folder / name
    result = sb.run(f"open({str(target)!r}, 'w').write('escaped')\nprint('written')")
    assert result.error, result
    assert "Read-only file system" in result.error or "No such file or directory" in result.error
    assert "written" not in result.stdout
    assert not target.exists()


def test_scratch_files_are_size_limited(sb):
    code = (
        "data = b'x' * (100 << 20)\nwith open('/mnt/data/big.bin', 'wb') as f:\n    f.write(data)"
    )
    result = sb.run(code)
    assert result.error and "File too large" in result.error, result


# --- bounded ----------------------------------------------------------------------------------


FORKS = {
    "fork loop": "import os\nwhile True:\n    os.fork()",
    "subprocess": "import subprocess\nsubprocess.run(['/bin/true'])",
    "posix_spawn": "os.posix_spawn('/bin/true', ['true'], {})",
    "multiprocessing": "import multiprocessing\np = multiprocessing.Process(target=print)\np.start()\np.join()",
}


@pytest.mark.parametrize("code", FORKS.values(), ids=FORKS.keys())
def test_fork_bombs_are_refused(sb, code):
    settle(sb)
    before = stray_processes(sb)
    result = sb.run(code)
    assert result.error and "PermissionError" in result.error, result
    assert "Operation not permitted" in result.error
    assert no_new_processes(before, sb) == set(), "processes were left behind"


@pytest.mark.parametrize(
    "code",
    [
        "big = bytearray(8 << 30)",
        "chunks = [np.ones((9, 1 << 30), np.uint8)]",
        "chunks = []\nwhile True:\n    chunks.append(np.ones(128 << 20, np.uint8))",  # touched
    ],
    ids=["8 GB bytearray", "9 GB numpy", "growing"],
)
def test_memory_bombs_raise_memory_error(sb, code):
    result = sb.run(code)
    assert result.error and "MemoryError" in result.error, result
    assert_alive_and_working(sb)


def test_infinite_loop_hits_the_wall_limit():
    box = new_sandbox(SandboxLimits(wall_s=LOOP_WALL_S, cpu_s=LOOP_WALL_S), warm=1)
    try:
        box.check()
        settle(box)
        t0 = time.monotonic()
        result = box.run("n = 0\nwhile True:\n    n += 1")
        elapsed = time.monotonic() - t0
        assert result.timed_out
        assert result.error and "time limit" in result.error, result
        assert f"({LOOP_WALL_S:.1f} s)" in result.error
        assert LOOP_WALL_S * 0.95 <= result.latency_s <= LOOP_WALL_S + 3.0, result.latency_s
        assert elapsed <= LOOP_WALL_S + 3.5
        assert_alive_and_working(box)
    finally:
        box.close()


def test_cpu_time_is_limited():
    box = new_sandbox(SandboxLimits(wall_s=WALL_S, cpu_s=1), warm=0)
    try:
        result = box.run("n = 0\nwhile True:\n    n += 1")
        assert not result.timed_out
        assert result.error and "it used up its CPU time" in result.error, result
        assert result.latency_s < WALL_S
    finally:
        box.close()


def test_the_per_call_timeout_is_applied(sb):
    result = sb.run("import time\ntime.sleep(30)", timeout=1.0)
    assert result.timed_out and "time limit (1.0 s)" in result.error
    assert result.latency_s < 4.0


@pytest.mark.parametrize(
    "code",
    ["os.kill(os.getppid(), 9)", "os.kill(1, 9)", "os.killpg(0, 9)", "os.kill(-1, 9)"],
)
def test_killing_the_parent_harms_nothing_outside(sb, code):
    settle(sb)
    before = stray_processes(sb)
    parent = os.getppid()
    sb.run(code)  # killing its own group ends it with an error; the rest is ignored inside
    assert os.getppid() == parent  # our parent (pytest's launcher) was not touched either
    assert_alive_and_working(sb)
    assert no_new_processes(before, sb) == set()


@pytest.mark.parametrize(
    "code, cause",
    [
        ("import ctypes\nctypes.string_at(0)", "segmentation fault"),
        ("os.abort()", "crashed"),  # PID 1 ignores SIGABRT: abort() ends in a fault
        ("os._exit(3)", "exit status 3"),
    ],
    ids=["segfault", "abort", "exit"],
)
def test_a_crashing_interpreter_is_reported(sb, code, cause):
    result = sb.run(code)
    assert result.error and cause in result.error, result
    assert not result.timed_out
    assert_alive_and_working(sb)


def test_huge_stdout_and_stderr_are_cut(sb):
    code = (
        "import sys\n"
        "sys.stdout.write('x' * 10_000_000)\n"
        "sys.stderr.write('y' * 10_000_000)\n"
        "print('done')\n"
    )
    result = sb.run(code)
    cap = sb.limits.stdout_bytes
    assert result.error, result
    assert f"stdout was 10000005 bytes; only the first {cap} were kept" in result.error
    assert f"stderr was 10000000 bytes; only the first {cap} were kept" in result.error
    assert 0 < len(result.stdout) <= cap and 0 < len(result.stderr) <= cap
    assert set(result.stdout) == {"x"}


# --- only validated images come back ----------------------------------------------------------


def test_a_file_that_is_not_an_image_is_refused(sb):
    code = f"path = '{OUTPUT_DIR}/fake.png'\nopen(path, 'wb').write(b'not an image')\nprint(path)\n"
    result = sb.run(code)
    assert result.error and "fake.png is not a usable image" in result.error, result
    assert result.images == []


def test_an_image_over_the_pixel_limit_is_refused(sb):
    code = (  # a valid PNG header claiming 10000 x 10000 pixels (100 MP; the limit is 64)
        "import struct, zlib\n"
        "def chunk(kind, data):\n"
        "    return struct.pack('>I', len(data)) + kind + data + struct.pack('>I', zlib.crc32(kind + data))\n"
        "ihdr = struct.pack('>IIBBBBB', 10000, 10000, 8, 2, 0, 0, 0)\n"
        "data = b'\\x89PNG\\r\\n\\x1a\\n' + chunk(b'IHDR', ihdr) + chunk(b'IDAT', zlib.compress(b'')) + chunk(b'IEND', b'')\n"
        f"open('{OUTPUT_DIR}/huge.png', 'wb').write(data)\n"
        f"print('{OUTPUT_DIR}/huge.png')\n"
    )
    result = sb.run(code)
    assert result.error and "huge.png" in result.error and "limit" in result.error, result
    assert "10000x10000" in result.error
    assert result.images == []


def test_an_image_over_the_byte_limit_is_refused():
    box = new_sandbox(SandboxLimits(wall_s=WALL_S, cpu_s=WALL_S, image_bytes=20_000), warm=0)
    try:
        code = (
            "noise = np.random.default_rng(0).integers(0, 256, (200, 200, 3), dtype=np.uint8)\n"
            f"Image.fromarray(noise).save('{OUTPUT_DIR}/noise.png')\n"
            f"print('{OUTPUT_DIR}/noise.png')\n"
        )
        result = box.run(code)
        assert result.error and "noise.png" in result.error, result
        assert "(limit 20000)" in result.error
        assert result.images == []
    finally:
        box.close()


# --- nothing shared between executions -------------------------------------------------------


def test_executions_do_not_see_each_others_files(sb):
    settle(sb)
    token = uuid.uuid4().hex
    writer = (
        "import time\n"
        f"open('{OUTPUT_DIR}/secret_{token}.txt', 'w').write('{token}')\n"
        f"open('/tmp/secret_{token}.txt', 'w').write('{token}')\n"
        f"print(len(os.listdir('{OUTPUT_DIR}')), len(os.listdir('/tmp')), time.time())\n"
        "time.sleep(1.5)\n"
        "print(time.time())\n"
    )
    reader = (
        "import json, time\n"
        f"token = {token!r}\n"
        f"out = sorted(os.listdir('{OUTPUT_DIR}'))\n"
        "tmp = sorted(os.listdir('/tmp'))\n"
        "procs = sorted(p for p in os.listdir('/proc') if p.isdigit())\n"
        "looked = time.time()\n"
        f"skip = ('/proc', '/sys', '/usr', '/sandbox', {sys.base_prefix!r})\n"
        "hits, seen = [], 0\n"
        "for root, dirs, files in os.walk('/'):\n"
        "    dirs[:] = [d for d in dirs if os.path.join(root, d) not in skip]\n"
        "    for name in files + dirs:\n"
        "        seen += 1\n"
        "        path = os.path.join(root, name)\n"
        "        if token in name:\n"
        "            hits.append(path)\n"
        "        elif root.startswith(('/tmp', '/mnt', '/dev/shm')) and os.path.isfile(path):\n"
        "            try:\n"
        "                if token.encode() in open(path, 'rb').read(1 << 20):\n"
        "                    hits.append(path)\n"
        "            except OSError:\n"
        "                pass\n"
        "    if seen > 50000:\n"
        "        break\n"
        "print(json.dumps({'hits': hits, 'out': out, 'tmp': tmp, 'procs': procs, 'seen': seen,\n"
        "                  'looked': looked}))\n"
    )
    results = {}

    def run(key, code):
        results[key] = sb.run(code)

    first = threading.Thread(target=run, args=("writer", writer))
    first.start()
    time.sleep(0.5)  # the writer has written its files and sleeps
    run("reader", reader)
    first.join()
    writer_result, reader_result = results["writer"], results["reader"]
    assert writer_result.ok, writer_result.error
    n_out, n_tmp, wrote, woke = writer_result.stdout.split()
    assert (n_out, n_tmp) == ("1", "3")  # its secret, beside its own .stdout and .stderr
    assert reader_result.ok, reader_result.error
    assert token not in reader_result.stdout
    seen = json.loads(reader_result.stdout)
    assert float(wrote) < seen["looked"] < float(woke), (
        "the reader did not look while the writer's files existed"
    )
    assert seen["hits"] == [] and seen["out"] == [] and seen["seen"] > 10
    assert seen["tmp"] == [".stderr", ".stdout"]
    assert seen["procs"] == ["1"]  # itself (PID 1): no other execution, no helper process

    later = sb.run(reader)  # after both ended
    assert later.ok, later.error
    assert token not in later.stdout
    assert json.loads(later.stdout)["out"] == []


# --- no secrets ------------------------------------------------------------------------------


def test_the_host_environment_is_not_visible(monkeypatch):
    token = uuid.uuid4().hex
    monkeypatch.setenv("SPECEYES_SECRET_TOKEN", token)  # before the sandbox starts processes
    box = new_sandbox(warm=0)
    try:
        code = (
            "import json\n"
            "init = open('/proc/1/environ', 'rb').read().decode('utf-8', 'replace')\n"
            "print(json.dumps({'env': dict(os.environ), 'init': init}))\n"
        )
        result = box.run(code)
        assert result.ok, result.error
        assert token not in result.stdout
        seen = json.loads(result.stdout)
        env = seen["env"]
        assert "SPECEYES_SECRET_TOKEN" not in env
        assert set(env) <= SANDBOX_ENV | {"LD_LIBRARY_PATH"}, set(env) - SANDBOX_ENV  # OpenCV's
        for key, value in os.environ.items():
            if key not in SANDBOX_ENV:
                assert env.get(key) != value, f"{key} leaked into the sandbox"
        assert env["HOME"] == "/tmp" and env["PATH"] == "/usr/bin:/bin"
        # bubblewrap's own process is PID 1 inside: its environment must be empty too
        assert "SPECEYES_SECRET_TOKEN" not in seen["init"]
        for key, value in os.environ.items():
            if key not in SANDBOX_ENV and len(value) >= 6:
                assert f"{key}={value}" not in seen["init"]
    finally:
        box.close()


# --- concurrency ----------------------------------------------------------------------------


def _run_four_sleepers(box: Sandbox) -> tuple[float, list]:
    results = [None] * 4

    def one(i):
        results[i] = box.run("import time\ntime.sleep(1)\nprint('slept')")

    threads = [threading.Thread(target=one, args=(i,)) for i in range(4)]
    t0 = time.monotonic()
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return time.monotonic() - t0, results


def test_executions_run_concurrently_up_to_max_concurrent():
    box = new_sandbox(warm=4, max_concurrent=4)
    try:
        box.check()
        settle(box)
        elapsed, results = _run_four_sleepers(box)
        assert all(r.ok and r.stdout == "slept\n" for r in results), results
        assert elapsed < 3.5, f"4 x 1 s with max_concurrent=4 took {elapsed:.2f} s"
    finally:
        box.close()


def test_max_concurrent_one_serializes():
    box = new_sandbox(warm=1, max_concurrent=1)
    try:
        box.check()
        elapsed, results = _run_four_sleepers(box)
        assert all(r.ok and r.stdout == "slept\n" for r in results), results
        assert elapsed >= 4.0, f"4 x 1 s with max_concurrent=1 took only {elapsed:.2f} s"
    finally:
        box.close()


def test_warm_processes_stay_alive_and_are_used():
    box = new_sandbox(warm=2, max_concurrent=2)
    try:
        box.check()
        for _ in range(2):
            settle(box)
            time.sleep(0.5)  # the thread that started them is long gone by now
            warm = list(box._idle)
            assert all(p.popen.poll() is None for p in warm), "a warm process died waiting"
            started = box.started
            result = box.run("print('warm')")
            assert result.ok and result.stdout == "warm\n", result.error
            settle(box)
            assert box.started == started + 1, "the run did not use a warm process"
    finally:
        box.close()


# --- no bubblewrap, no execution --------------------------------------------------------------


def test_missing_bubblewrap_is_refused_with_an_install_hint(monkeypatch, tmp_path):
    with pytest.raises(SandboxUnavailable, match="apt-get install bubblewrap"):
        Sandbox(bwrap="/nonexistent/bwrap", warm=0)
    monkeypatch.setenv("PATH", str(tmp_path))  # a PATH without bwrap
    with pytest.raises(SandboxUnavailable, match="bubblewrap.*not installed"):
        Sandbox(warm=0)


def test_a_broken_bubblewrap_is_refused_and_nothing_runs(tmp_path):
    fake = tmp_path / "bwrap"
    fake.write_text("#!/bin/sh\necho 'bwrap: No permissions to create new namespace' >&2\nexit 1\n")
    fake.chmod(0o755)
    marker = tmp_path / "ran-in-process"
    box = Sandbox(bwrap=str(fake), warm=0)
    try:
        with pytest.raises(SandboxUnavailable, match="No permissions to create new namespace"):
            box.run(f"open({str(marker)!r}, 'w').write('x')")
    finally:
        box.close()
    assert not marker.exists()  # no fallback to in-process execution


def test_no_other_process_to_trace_and_no_ptrace(sb):
    """The code is PID 1 of its namespace (no helper process of bubblewrap's to hijack),
    and ptrace and cross-process memory calls are refused."""
    code = """
import ctypes, os
libc = ctypes.CDLL(None, use_errno=True)
print(sorted(p for p in os.listdir('/proc') if p.isdigit()), os.getpid())
print(libc.ptrace(16, 1, 0, 0), ctypes.get_errno())  # PTRACE_ATTACH
"""
    result = sb.run(code)
    assert result.ok, result.error
    pids, traced = result.stdout.strip().splitlines()
    assert pids == "['1'] 1"
    assert traced == "-1 1"  # EPERM


def test_code_starting_with_a_block_runs(sb):
    result = sb.run("for i in range(2):\n    print(i)\n")
    assert result.ok, result.error
    assert result.stdout.split() == ["0", "1"]


def test_only_the_allowed_libraries_are_importable(sb):
    code = """
import importlib
for name in ("numpy", "PIL.Image", "cv2", "torch", "transformers", "langchain_core",
             "speceyes_graph", "speceyes_tools", "pytest"):
    try:
        importlib.import_module(name)
        print(name, "yes")
    except ImportError:
        print(name, "no")
"""
    result = sb.run(code)
    assert result.ok, result.error
    seen = dict(line.split() for line in result.stdout.strip().splitlines())
    assert seen == {
        "numpy": "yes", "PIL.Image": "yes", "cv2": "yes", "torch": "no", "transformers": "no",
        "langchain_core": "no", "speceyes_graph": "no", "speceyes_tools": "no", "pytest": "no",
    }  # fmt: skip
