"""The README and the documentation site: their offline code runs, and they agree.

A ``python`` code block right after a ``<!-- docs-test: run -->`` line is run (a page's
marked blocks in order, in one fresh process, in an empty folder); everything in it must
work offline, on the shipped demo checkpoints. The site's home page is the README with its
links made relative to ``docs/``.
"""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
MARK = "<!-- docs-test: run -->"
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]


def marked_blocks(page: Path) -> list[str]:
    text = page.read_text()
    return re.findall(re.escape(MARK) + r"\s*```python\n(.*?)```", text, flags=re.S)


RUNNABLE = {}
for page in PAGES:
    code = "\n".join(marked_blocks(page))
    if code and code not in RUNNABLE.values():  # the same code on two pages runs once
        RUNNABLE[str(page.relative_to(ROOT))] = code


def test_the_readme_has_runnable_code():
    assert marked_blocks(ROOT / "README.md")
    assert len(RUNNABLE) >= 2  # the README and the quickstart guide


@pytest.mark.parametrize("page", sorted(RUNNABLE))
def test_marked_code_blocks_run_offline(page, tmp_path):
    done = subprocess.run(
        [sys.executable, "-c", RUNNABLE[page]], cwd=tmp_path, capture_output=True, text=True,
        timeout=600, env={"PATH": "/usr/bin:/bin", "HF_HUB_OFFLINE": "1", "HOME": str(tmp_path)},
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    assert done.stdout.strip(), "the example printed nothing"


def test_the_site_home_page_is_the_readme():
    readme = (ROOT / "README.md").read_text()
    home = (ROOT / "docs" / "index.md").read_text()
    assert home == readme.replace("](docs/", "](").replace(
        "Licence: Apache-2.0 (`LICENSE`).", "Licence: Apache-2.0."
    )


def test_the_readme_front_page_fits_a_screen_or_two():
    assert len((ROOT / "README.md").read_text().splitlines()) <= 150
