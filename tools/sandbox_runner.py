"""The program that runs *inside* the sandbox (see :mod:`speceyes_tools.sandbox`).

It is started by bubblewrap as ``python -I -S -B runner.py`` in a fresh process with no
network, a read-only view of Python and the allowed libraries, and a size-limited tmpfs at
``/mnt/data``. It imports the libraries, says ``READY``, and waits for one request on stdin:
the code and the query's image. Then, in order: it writes the image read-only under
``/mnt/data/images``, applies the published Thyme harness's rewrites to the code (paths,
crop boxes, OpenCV namespace), points fds 1 and 2 at files, lowers its own resource limits,
forbids new processes and ``exec`` with a seccomp filter, and runs the code. Whatever
happens, it sends back one framed result (stdout, stderr, error, images the code wrote)
on its original stdout and exits. The host treats every byte of it as untrusted.

This file imports nothing outside the standard library and the allowed libraries; the
package it ships with is not visible in the sandbox.
"""

import ast
import ctypes
import json
import os
import platform
import re
import resource
import signal
import struct
import sys
import textwrap
import time
import traceback

sys.path.append("/sandbox/site")
os.environ.setdefault("OMP_NUM_THREADS", "1")

LIBRARIES = {}
for _name in ("numpy", "PIL.Image", "cv2"):
    try:
        LIBRARIES[_name] = __import__(_name, fromlist=["_"])
    except Exception:  # a library the deployment did not allow or install
        pass
if "cv2" in LIBRARIES:
    LIBRARIES["cv2"].setNumThreads(1)

DATA = "/mnt/data"
OUT_DIR = DATA + "/temp_processed_images"  # the path Thyme was trained to write to
IMAGE_DIR = DATA + "/images"
IMAGE_EXTENSIONS = (".png", ".jpg", ".jpeg", ".bmp", ".gif", ".tiff", ".webp")
MIN_CROP = 64  # the published harness enlarges smaller crops to this side
COORD_NAMES = {
    "crop_box", "bbox", "box", "coordinates", "coords", "crop_coords", "left_crop_coords",
    "right_crop_coords", "top_crop_coords", "bottom_crop_coords",
}  # fmt: skip
COORD_UNPACK_NAMES = {"x1", "y1", "x2", "y2", "left", "top", "right", "bottom"}
WRONG_CV_NAMES = {"cv", "cv3", "cv4", "CV"}
MAGIC = b"\nSPECEYES-RESULT "


# --- the published harness's rewrites of model code (written anew) ----------------------------


def tidy_indentation(code):
    """Dedent; if the code still does not parse, give the first line the second one's
    indentation (a common model slip the published harness corrects, there even in code
    that was fine, e.g. one starting with ``for ...:``)."""
    code = textwrap.dedent(code).strip("\n")
    try:
        ast.parse(code)
        return code
    except (SyntaxError, ValueError, RecursionError, MemoryError):
        pass
    lines = code.splitlines()
    filled = [i for i, line in enumerate(lines) if line.strip()]
    if len(filled) >= 2:
        first, second = lines[filled[0]], lines[filled[1]]
        indent = second[: len(second) - len(second.lstrip(" "))]
        lines[filled[0]] = indent + first.lstrip(" ")
    return textwrap.dedent("\n".join(lines))


def clamp_box(x1, y1, x2, y2, width, height):
    """A box inside the image, at least MIN_CROP per side where the image allows."""
    x1, x2 = sorted((x1, x2))
    y1, y2 = sorted((y1, y2))
    out = []
    for lo, hi, size in ((x1, x2, width), (y1, y2, height)):
        lo = min(max(0.0, lo), max(size - 1.0, 0.0))
        hi = min(max(0.0, hi), float(size))
        if lo >= hi:
            lo = max(0.0, hi - 1.0)
            hi = min(float(size), lo + 1.0) if hi <= lo else hi
        if hi - lo < MIN_CROP:
            if size < MIN_CROP:
                lo, hi = 0.0, float(size)
            else:
                hi = lo + MIN_CROP
                if hi > size:
                    hi, lo = float(size), max(0.0, size - MIN_CROP)
        out.append((lo, hi))
    (x1, x2), (y1, y2) = out
    return [x1, y1, x2, y2]


def _number(node):
    if isinstance(node, ast.Constant) and type(node.value) in (int, float):
        return node.value
    return None


class Rewrite(ast.NodeTransformer):
    """``image_path = "<missing file>"`` -> the query's image; literal crop boxes clamped to
    the original image (min side 64); ``cv.``/``cv3.``/``cv4.`` -> ``cv2.``."""

    def __init__(self, image_path, size):
        self.image_path, self.size, self.changed = image_path, size, False

    def visit_Assign(self, node):
        target = node.targets[0] if len(node.targets) == 1 else None
        value = node.value
        if (
            isinstance(target, ast.Name)
            and target.id == "image_path"
            and isinstance(value, ast.Constant)
            and isinstance(value.value, str)
            and self.image_path
            and not (os.path.isfile(value.value) and value.value.lower().endswith(IMAGE_EXTENSIONS))
        ):
            node.value, self.changed = ast.Constant(self.image_path), True
        elif self.size and isinstance(value, ast.Tuple) and len(value.elts) == 4:
            coords = [_number(e) for e in value.elts]
            unpacking = (
                isinstance(target, ast.Tuple)
                and len(target.elts) == 4
                and all(isinstance(t, ast.Name) for t in target.elts)
                and any(t.id.lower() in COORD_UNPACK_NAMES for t in target.elts)
            )
            named = isinstance(target, ast.Name) and target.id in COORD_NAMES
            if (unpacking or named) and None not in coords:
                clamped = clamp_box(*coords, *self.size)
                if [round(c) for c in clamped] != [round(c) for c in coords]:
                    value.elts = [ast.Constant(int(round(c))) for c in clamped]
                    self.changed = True
        return self.generic_visit(node)

    def visit_Attribute(self, node):
        if isinstance(node.value, ast.Name) and node.value.id in WRONG_CV_NAMES:
            node.value.id, self.changed = "cv2", True
        return self.generic_visit(node)


def rewrite(code, image_path, size):
    code = tidy_indentation(code)
    try:
        tree = ast.parse(code)
        rewriter = Rewrite(image_path, size)
        tree = rewriter.visit(tree)
        if rewriter.changed:
            code = ast.unparse(ast.fix_missing_locations(tree))
    except (SyntaxError, ValueError, RecursionError, MemoryError):
        pass  # the code runs as written and reports its own error
    # directories the code's output paths imply; the published `:.Nf}` -> `:.8f}` widening
    for path in re.findall(r"['\"](" + re.escape(OUT_DIR) + r"/[^'\"]*)['\"]", code):
        sub = os.path.dirname(path.replace(" ", ""))
        if sub.startswith(OUT_DIR + "/") and ".." not in sub:
            os.makedirs(sub, exist_ok=True)
    return re.sub(r":\.\d{1}f}", ":.8f}", code)


# --- limits -----------------------------------------------------------------------------------


def _seccomp_program():
    """BPF: no fork, vfork, exec or clone3 (threads via clone(CLONE_THREAD) still work), no
    ptrace and no writing or reading another process's memory."""
    arch = platform.machine()
    if arch == "x86_64":
        audit, nr = 0xC000003E, {"clone": 56, "fork": 57, "vfork": 58, "execve": 59,
                                 "execveat": 322, "clone3": 435, "ptrace": 101,
                                 "process_vm_readv": 310, "process_vm_writev": 311}  # fmt: skip
    elif arch in ("aarch64", "arm64"):
        audit, nr = 0xC00000B7, {"clone": 220, "execve": 221, "execveat": 281, "clone3": 435,
                                 "ptrace": 117, "process_vm_readv": 270,
                                 "process_vm_writev": 271}  # fmt: skip
    else:
        return None
    allow, kill = 0x7FFF0000, 0x80000000
    eperm, enosys = 0x00050000 | 1, 0x00050000 | 38
    ld, jeq, jge, jset, ret = 0x20, 0x15, 0x35, 0x45, 0x06
    prog = [(ld, 0, 0, 4), (jeq, 1, 0, audit), (ret, 0, 0, kill), (ld, 0, 0, 0)]
    if arch == "x86_64":  # x32 system calls
        prog += [(jge, 0, 1, 0x40000000), (ret, 0, 0, eperm)]
    prog += [(jeq, 0, 1, nr["clone3"]), (ret, 0, 0, enosys)]
    for name in ("fork", "vfork", "execve", "execveat", "ptrace", "process_vm_readv",
                 "process_vm_writev"):  # fmt: skip
        if name in nr:
            prog += [(jeq, 0, 1, nr[name]), (ret, 0, 0, eperm)]
    prog += [
        (jeq, 0, 3, nr["clone"]),
        (ld, 0, 0, 16),  # the low word of the first argument: the clone flags
        (jset, 1, 0, 0x00010000),  # CLONE_THREAD
        (ret, 0, 0, eperm),
        (ret, 0, 0, allow),
    ]
    return prog, (317 if arch == "x86_64" else 277)


def forbid_processes():
    """Install the seccomp filter on every thread; False where it cannot be installed."""
    built = _seccomp_program()
    if built is None:
        return False
    prog, sys_seccomp = built
    raw = b"".join(struct.pack("HBBI", *ins) for ins in prog)
    buf = ctypes.create_string_buffer(raw, len(raw))

    class Fprog(ctypes.Structure):
        _fields_ = [("len", ctypes.c_ushort), ("filter", ctypes.c_void_p)]

    fprog = Fprog(len(prog), ctypes.addressof(buf))
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.prctl(38, 1, 0, 0, 0) != 0:  # PR_SET_NO_NEW_PRIVS
        return False
    # SECCOMP_SET_MODE_FILTER with SECCOMP_FILTER_FLAG_TSYNC: all threads
    return libc.syscall(sys_seccomp, 1, 1, ctypes.byref(fprog)) == 0


class CPUTimeExceeded(Exception):
    pass


def set_limits(limits):
    used_cpu = sum(resource.getrusage(resource.RUSAGE_SELF)[:2])
    cpu = int(used_cpu + limits["cpu_s"]) + 1
    resource.setrlimit(resource.RLIMIT_CPU, (cpu, cpu + 1))

    def out_of_cpu(signum, frame):  # the soft limit; the hard one kills a second later
        raise CPUTimeExceeded(f"it used up its CPU time ({limits['cpu_s']:g} s)")

    signal.signal(signal.SIGXCPU, out_of_cpu)  # PID 1 ignores signals it has no handler for
    memory = limits["memory_bytes"] + _address_space()
    resource.setrlimit(resource.RLIMIT_AS, (memory, memory))
    resource.setrlimit(resource.RLIMIT_FSIZE, (limits["file_bytes"], limits["file_bytes"]))
    resource.setrlimit(resource.RLIMIT_NPROC, (limits["processes"], limits["processes"]))
    resource.setrlimit(resource.RLIMIT_NOFILE, (256, 256))
    resource.setrlimit(resource.RLIMIT_CORE, (0, 0))


def _address_space():
    """Bytes of address space mapped now (the imported libraries), from /proc."""
    try:
        with open("/proc/self/statm") as f:
            return int(f.read().split()[0]) * resource.getpagesize()
    except (OSError, ValueError, IndexError):
        return 0


# --- one execution ------------------------------------------------------------------------


def read_exact(stream, n):
    data = b""
    while len(data) < n:
        chunk = stream.read(n - len(data))
        if not chunk:
            raise EOFError("request ended early")
        data += chunk
    return data


def read_capped(path, cap):
    try:
        size = os.path.getsize(path)
        with open(path, "rb") as f:
            return f.read(cap).decode("utf-8", "replace"), size
    except OSError:
        return "", 0


def produced_images(stdout, processed_path, limit, max_bytes):
    """Images the code wrote: those it printed or named ``processed_path``, else every image
    in the output folder; (name, bytes) pairs plus notes on what was left out."""
    found, notes = [], []
    try:
        present = sorted(
            os.path.join(root, f)
            for root, _, files in os.walk(OUT_DIR)
            for f in files
            if f.lower().endswith(IMAGE_EXTENSIONS)
        )
    except OSError:
        present = []
    named = [processed_path] if isinstance(processed_path, str) else []
    pattern = re.escape(OUT_DIR) + r"/[^\s'\"]+?\.(?:png|jpe?g|bmp|gif|tiff|webp)"
    named += re.findall(pattern, stdout, re.I)
    chosen = []
    for path in named:
        real = os.path.realpath(path)
        if real in present and real not in chosen:
            chosen.append(real)
    for path in chosen or present:
        if len(found) == limit:
            notes.append(f"more than {limit} images: the rest were not returned")
            break
        try:
            if os.path.islink(path) or not os.path.isfile(path):
                continue
            size = os.path.getsize(path)
            if size > max_bytes:
                notes.append(f"{os.path.basename(path)} is {size} bytes (limit {max_bytes})")
                continue
            with open(path, "rb") as f:
                found.append((os.path.relpath(path, OUT_DIR), f.read(max_bytes + 1)))
        except OSError as exc:
            notes.append(f"{os.path.basename(path)}: {exc}")
    return found, notes


def main():
    result_fd = os.dup(1)
    sys.stdout.write("READY\n")
    sys.stdout.flush()
    stdin = sys.stdin.buffer
    (header_len,) = struct.unpack(">I", read_exact(stdin, 4))
    request = json.loads(read_exact(stdin, header_len))
    image = read_exact(stdin, request["image_bytes"]) if request.get("image_bytes") else b""
    limits = request["limits"]

    os.makedirs(OUT_DIR, exist_ok=True)
    os.makedirs(IMAGE_DIR, exist_ok=True)
    image_path, size = None, None
    if image:
        image_path = os.path.join(IMAGE_DIR, request["image_name"])
        with open(image_path, "wb") as f:
            f.write(image)
        os.chmod(image_path, 0o444)
        os.chmod(IMAGE_DIR, 0o555)
        size = request.get("image_size")
    code = rewrite(request["code"], image_path, size)

    out_path, err_path = "/tmp/.stdout", "/tmp/.stderr"
    for fd, path in ((1, out_path), (2, err_path)):
        target = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        os.dup2(target, fd)
        os.close(target)
    os.set_inheritable(result_fd, False)
    namespace = {
        "__name__": "__main__",
        "__builtins__": __builtins__,
        "image_path": image_path,
        "temp_output_dir": OUT_DIR,
        "os": os,
        "re": re,
        "json": json,
        "math": __import__("math"),
        "random": __import__("random"),
        "string": __import__("string"),
    }
    if "numpy" in LIBRARIES:
        namespace["numpy"] = namespace["np"] = LIBRARIES["numpy"]
    if "PIL.Image" in LIBRARIES:
        namespace["Image"] = LIBRARIES["PIL.Image"]
        namespace["UnidentifiedImageError"] = LIBRARIES["PIL.Image"].UnidentifiedImageError
    if "cv2" in LIBRARIES:
        namespace["cv2"] = LIBRARIES["cv2"]

    error = None
    os.chdir(DATA)
    set_limits(limits)
    sealed = forbid_processes()
    started = time.time()
    try:
        exec(compile(code, "<model code>", "exec"), namespace)
    except BaseException as exc:  # noqa: BLE001 - SystemExit and KeyboardInterrupt too
        lines = traceback.format_exception(type(exc), exc, exc.__traceback__)
        frames = [line for line in lines if 'File "<model code>"' in line]
        error = (frames[-1].strip() + "\n" if frames else "") + (
            f"{type(exc).__name__}: {exc}".strip()
        )
    finished = time.time()
    try:
        sys.stdout.flush()
        sys.stderr.flush()
    except Exception:
        pass

    stdout, stdout_size = read_capped(out_path, limits["stdout_bytes"])
    stderr, stderr_size = read_capped(err_path, limits["stdout_bytes"])
    processed = namespace.get("processed_path")
    images, notes = produced_images(stdout, processed, limits["max_images"], limits["image_bytes"])
    header = {
        "error": error,
        "stdout": stdout,
        "stdout_size": stdout_size,
        "stderr": stderr,
        "stderr_size": stderr_size,
        "images": [[name, len(data)] for name, data in images],
        "notes": notes,
        "started": started,
        "finished": finished,
        "sealed": sealed,
        "code": code,
    }
    body = json.dumps(header).encode()
    frame = MAGIC + b"%016x\n" % len(body) + body + b"".join(data for _, data in images)
    view = memoryview(frame)
    while view:
        view = view[os.write(result_fd, view) :]
    os._exit(0)


if __name__ == "__main__":
    main()
