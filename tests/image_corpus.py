"""Every file of a public image corpus through every path that reads images, classified.

The corpus is Pillow's own test images (``scripts/setup-corpus.sh`` unpacks them from the
Pillow source distribution in the package registry: about a thousand files in every format
Pillow reads, with truncated, malformed and fuzzer-found files among them; nobody here wrote
them). Each file goes through:

- ``decode``: the image store (header, price, budget, decode), with the peak resident memory
  of the decode against the price the header put on it;
- ``pillow``: the decoded pixels against Pillow's own reading of the first frame
  (``ImageOps.exif_transpose(...).convert("RGB")``);
- ``graph-path`` and ``graph-data``: a SpecEyes graph (scripted models: the judge asks for
  tools, the agent zooms once) given the file's path and a ``data:`` URL of its bytes;
- ``zoom`` and ``ocr``: the tools on the file, as an agent calls them (an image that cannot
  be read raises ImageLoadError from the tool, by design: the query fails with that error,
  the model is not asked to recover from it).

Each path ends ``ok``, ``error`` (a clear, recorded error: an ImageLoadError, or the graph's
recorded error naming the image), ``crash`` (an exception escaped, or the process died),
``hang`` (no answer within ``--timeout`` seconds), ``memory`` (an out-of-memory failure, or a
decode that took more than its price) or, for ``pillow``, ``differs`` (with the reason).
Files run in worker processes, so a crash or a hang costs only that file.

    python tests/image_corpus.py CORPUS_DIR [--report FILE] [--workers 2] [--timeout 60]
"""

from __future__ import annotations

import argparse
import base64
import json
import os
import queue
import subprocess
import sys
import threading
import time
from collections import Counter
from pathlib import Path

HERE = Path(__file__).resolve().parent
PATHS = ["decode", "pillow", "graph-path", "graph-data", "zoom", "ocr"]
SLACK_MB = 8  # the peak of a small decode is mostly the allocator's own rounding

# --- one file, in a worker ----------------------------------------------------------------------


def _status(key: str) -> int:
    with open("/proc/self/status") as f:
        return next(int(line.split()[1]) * 1024 for line in f if line.startswith(key))


def _reset_peak() -> None:
    with open("/proc/self/clear_refs", "w") as f:
        f.write("5")


class Worker:
    def __init__(self) -> None:
        import warnings

        warnings.simplefilter("ignore")
        sys.path.insert(0, str(HERE))
        from helpers import deepeyes_agent, judge, speculator
        from speceyes_graph import create_speceyes_graph
        from speceyes_tools import ImageStore, image_zoom_in_tool, make_ocr_tool

        self.ImageStore = ImageStore
        self.zoom, self.ocr = image_zoom_in_tool, make_ocr_tool()
        self.graph = create_speceyes_graph(
            judge=judge("yes"), speculator=speculator("A", 9.0), agent=deepeyes_agent()
        ).compile()

    def run(self, path: str) -> dict:
        from speceyes_tools import ImageLoadError
        from speceyes_tools.codec import read_header

        out: dict = {"file": path}
        data = Path(path).read_bytes()
        store = self.ImageStore(max_bytes=0)
        try:
            header = read_header(data, path)
            price = (header.decode_bytes + len(data)) / 2**20
            out["format"], out["mode"], out["price_mb"] = header.format, header.mode, price
        except ImageLoadError:
            header, price = None, None
        _reset_peak()
        before = _status("VmRSS")
        try:
            ours = store.get(path)
            out["decode"] = "ok"
        except ImageLoadError as exc:
            ours = None
            out["decode"] = "memory" if "out of memory" in str(exc) else "error"
            out["decode_error"] = str(exc)
        except Exception as exc:  # noqa: BLE001 - what escapes is what this run looks for
            ours = None
            out["decode"], out["decode_error"] = "crash", f"{type(exc).__name__}: {exc}"
        peak = (_status("VmHWM") - before) / 2**20
        out["peak_mb"] = round(peak, 1)
        if ours is not None and price is not None and peak > price + SLACK_MB:
            out["decode"] = "memory"
            out["decode_error"] = f"took {peak:.0f} MiB, priced at {price:.0f} MiB"
        out["pillow"], out["pillow_reason"] = self.against_pillow(data, ours, header)
        out["graph-path"] = self.through_graph(path, out)
        url = "data:application/octet-stream;base64," + base64.b64encode(data).decode()
        out["graph-data"] = self.through_graph(url, out, "graph-data")
        state = {"images": [path]}
        out["zoom"] = self.tool(self.zoom, {"bbox_2d": [5, 5, 60, 60], "state": state}, out)
        out["ocr"] = self.tool(self.ocr, {"bbox": [5, 5, 60, 60], "state": state}, out)
        return out

    def against_pillow(self, data: bytes, ours, header) -> tuple[str, str | None]:
        """Whether our pixels are Pillow's (first frame, upright, RGB); why not, if not."""
        import io

        import numpy as np
        from PIL import Image, ImageOps

        try:
            with Image.open(io.BytesIO(data)) as im:
                theirs = np.asarray(ImageOps.exif_transpose(im).convert("RGB"))
        except Exception as exc:  # noqa: BLE001
            if ours is None:
                return "ok", None  # neither reads it
            return "differs", f"Pillow cannot read it ({type(exc).__name__}); we decoded it"
        if ours is None:
            return "differs", "Pillow reads it; we refused it"
        if ours.shape != theirs.shape:
            return "differs", f"shape {ours.shape} against Pillow's {theirs.shape}"
        diff = np.abs(ours.astype(np.int16) - theirs.astype(np.int16))
        if diff.max() == 0:
            return "ok", None
        mode = header.mode if header else "?"
        if mode == "F":
            return "differs", "floating-point samples read as 0.0-1.0; Pillow clips 0-255"
        if mode.startswith("I"):
            return "differs", (
                f"{mode} samples scaled by their declared depth ({header.bits} bits); "
                "Pillow clips at 255"
            )
        if header and header.format == "JPEG" and diff.mean() < 1.0:
            return "ok", None  # OpenCV's and Pillow's libjpeg builds round differently
        return "differs", f"unexplained: max {int(diff.max())}, mean {float(diff.mean()):.2f}"

    def through_graph(self, ref: str, out: dict, key: str = "graph-path") -> str:
        try:
            result = self.graph.invoke({"question": "What colour?", "images": [ref]})
        except Exception as exc:  # noqa: BLE001
            out[f"{key}_error"] = f"{type(exc).__name__}: {exc}"
            return "crash"
        error = result.get("error")
        if error is None:
            return "ok"
        out[f"{key}_error"] = str(error)[:300]
        if "out of memory" in str(error):
            return "memory"
        return "error" if "image" in str(error) else "crash"

    def tool(self, tool, args: dict, out: dict) -> str:
        """As an agent calls it: a tool call in, a ToolMessage out (errors as its content)."""
        from speceyes_tools import ImageLoadError

        try:
            message = tool.invoke({"type": "tool_call", "id": "1", "name": tool.name, "args": args})
        except ImageLoadError as exc:  # by design: the query fails with this clear error
            out[f"{tool.name}_error"] = str(exc)[:300]
            return "memory" if "out of memory" in str(exc) else "error"
        except Exception as exc:  # noqa: BLE001
            out[f"{tool.name}_error"] = f"{type(exc).__name__}: {exc}"
            return "crash"
        if message.status != "error":
            return "ok"
        text = str(message.content)
        out[f"{tool.name}_error"] = text[:300]
        if "out of memory" in text:
            return "memory"
        return "error" if "image" in text else "crash"


def worker_main() -> None:
    worker = Worker()
    print("ready", flush=True)
    for line in sys.stdin:
        print(json.dumps(worker.run(line.strip())), flush=True)


# --- the driver -------------------------------------------------------------------------------


class _Child:
    """A worker process fed one file at a time; answers are read by a thread."""

    def __init__(self) -> None:
        env = {**os.environ, "MALLOC_MMAP_THRESHOLD_": "131072", "OMP_NUM_THREADS": "1"}
        self.proc = subprocess.Popen(
            [sys.executable, __file__, "--worker"],
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL,
            text=True, env=env,
        )  # fmt: skip
        self.answers: queue.Queue = queue.Queue()
        threading.Thread(target=self._read, daemon=True).start()
        if self.answers.get(timeout=300) != "ready":
            raise RuntimeError("the corpus worker did not start")

    def _read(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            self.answers.put(line.strip())
        self.answers.put(None)  # the process ended

    def ask(self, path: str, timeout: float) -> dict:
        assert self.proc.stdin is not None
        self.proc.stdin.write(path + "\n")
        self.proc.stdin.flush()
        try:
            answer = self.answers.get(timeout=timeout)
        except queue.Empty:
            self.proc.kill()
            return {"file": path, **dict.fromkeys(PATHS, "hang")}
        if answer is None:
            return {"file": path, **dict.fromkeys(PATHS, "crash"), "exit": self.proc.wait()}
        return json.loads(answer)

    def close(self) -> None:
        self.proc.kill()
        self.proc.wait()


def run_corpus(files: list[str], workers: int = 2, timeout: float = 60.0) -> list[dict]:
    todo: queue.Queue = queue.Queue()
    for f in files:
        todo.put(f)
    results: list[dict] = []

    def drive() -> None:
        child = _Child()
        while True:
            try:
                path = todo.get_nowait()
            except queue.Empty:
                break
            result = child.ask(path, timeout)
            results.append(result)
            if child.proc.poll() is not None:  # crashed or killed: a fresh one for the rest
                child = _Child()
        child.close()

    threads = [threading.Thread(target=drive) for _ in range(workers)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return sorted(results, key=lambda r: r["file"])


def corpus_files(root: Path) -> list[str]:
    return sorted(str(p) for p in root.rglob("*") if p.is_file() and not p.name.startswith("."))


def summary(results: list[dict], wall_s: float) -> str:
    lines = [f"image corpus: {len(results)} files in {wall_s:.0f} s"]
    for path in PATHS:
        counts = Counter(r.get(path, "?") for r in results)
        lines.append(f"  {path:<11} " + ", ".join(f"{k} {v}" for k, v in sorted(counts.items())))
    differs = [r for r in results if r.get("pillow") == "differs"]
    if differs:
        lines.append("  differs from Pillow:")
        lines += [f"    {Path(r['file']).name}: {r['pillow_reason']}" for r in differs]
    bad = [r for r in results if any(r.get(p) in ("crash", "hang", "memory") for p in PATHS)]
    if bad:
        lines.append("  crashes, hangs and memory blowups:")
        for r in bad:
            worst = {p: r[p] for p in PATHS if r.get(p) in ("crash", "hang", "memory")}
            why = next((r[k] for k in r if k.endswith("_error")), "")
            lines.append(f"    {Path(r['file']).name}: {worst} {why}"[:300])
    return "\n".join(lines)


def main() -> None:
    if sys.argv[1:] == ["--worker"]:
        worker_main()
        return
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("corpus", type=Path)
    parser.add_argument("--report", type=Path, help="write every file's result here (JSON)")
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--timeout", type=float, default=60.0)
    args = parser.parse_args()
    t0 = time.time()
    results = run_corpus(corpus_files(args.corpus), args.workers, args.timeout)
    if args.report:
        args.report.write_text(json.dumps(results, indent=1))
    print(summary(results, time.time() - t0))


if __name__ == "__main__":
    main()
