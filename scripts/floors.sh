#!/usr/bin/env bash
# The dependency floors, checked: speceyes-graph installed at the lowest versions its
# pyproject.toml allows for each direct dependency (uv's --resolution lowest-direct; what they
# pull in is the newest that fits), then the README's demo and a fast subset of the tests there.
#
#   bash scripts/floors.sh            (CI runs it after scripts/setup.sh)
#
# A floor raised or lowered in pyproject.toml is one this job proves: the subset below is what
# a too-low floor breaks first (the graph, the gate, the middleware, the agent loop, the tools and
# their codecs, the chat model and LangChain's standard suites, the tiny model families). torch
# and torchvision stay at the project's pair (an override: lowest-direct would otherwise fetch
# torch 2.4, gigabytes). About 2 minutes on 2 cores with uv's cache warm; a rerun with nothing
# changed skips the install. Environment:
#   PYTHON=python3.12   the interpreter the environment is made from (default python3)
#   FLOORS_VENV=DIR     where the environment lives (default .venv-floors in the repository)
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
VENV=${FLOORS_VENV:-.venv-floors}
VPY="$VENV/bin/python"
STAMP="$VENV/.speceyes-floors"
source scripts/uv.sh

say() { echo "floors: $*"; }

# What the stamp records: the same inputs and a working environment skip the install.
fingerprint() { cat pyproject.toml scripts/floors.sh scripts/uv.sh | sha256sum | cut -d' ' -f1; }
if [ -f "$STAMP" ] && [ "$(cat "$STAMP")" = "$(fingerprint)" ] \
   && "$VPY" -c "import speceyes_graph, torch" >/dev/null 2>&1; then
  say "environment up to date ($VENV)"
else
  # A fresh environment each time the inputs change: lowest-direct into an environment that
  # already holds newer versions would leave those wherever nothing asks for a change.
  rm -rf "$VENV"
  if [ -n "${UV:-}" ] || command -v uv >/dev/null 2>&1 || [ -x "${SPECEYES_VENV:-.venv}/bin/uv" ]; then
    "$(uv_for "$PY")" venv -q --python "$PY" "$VENV"
  else
    "$PY" -m venv "$VENV"  # uv_for then installs uv into it
  fi
  UV_BIN=$(uv_for "$VPY")
  printf 'torch==2.14.1\ntorchvision==0.29.1\n' > "$VENV/torch-override.txt"
  say "installing speceyes-graph[dev] at --resolution lowest-direct into $VENV"
  "$UV_BIN" pip install -q --python "$VPY" --resolution lowest-direct \
    --override "$VENV/torch-override.txt" -e ".[dev]"
  fingerprint > "$STAMP"
fi

"$VPY" - <<'EOF'
from importlib.metadata import version

names = ("langgraph", "langgraph-prebuilt", "langchain", "langchain-core", "transformers",
         "pillow", "opencv-python-headless", "numpy", "scipy", "cachetools", "imagesize")
print("floors: resolved " + ", ".join(f"{n} {version(n)}" for n in names))
EOF

# The README's quickstart: the demo on the shipped checkpoints, offline (a few queries: it
# proves the checkpoints load and the graph answers, not the accuracy figures).
OUT=$(mktemp -d)
trap 'rm -rf "$OUT"' EXIT
say "quickstart: python -m speceyes_graph demo"
ABS_VPY="$(cd "$VENV/bin" && pwd)/python"
(cd "$OUT" && "$ABS_VPY" -m speceyes_graph demo --n 8 --no-progress -o "$OUT/demo")

# The subset: no servers or engines (the markers), and not the two slow statistical files
# (test_online_gate.py's drifting-traffic fixtures, the decode-price measurement).
say "tests"
"$VPY" -m pytest -q -p no:cacheprovider -n 2 \
  -m "not server and not vllm and not sglang and not aegra and not postgres" \
  --deselect tests/test_decoding.py::test_the_price_covers_what_decodes_take \
  tests/test_graph.py tests/test_middleware.py tests/test_agent_loop.py \
  tests/test_agent_fallback.py tests/test_tools.py tests/test_chat_model.py \
  tests/test_standard.py tests/test_async.py tests/test_families.py tests/test_compose.py \
  tests/test_chat.py \
  tests/test_toolsets.py tests/test_protocol.py tests/test_settings.py tests/test_store.py \
  tests/test_threads.py tests/test_policy.py tests/test_retry.py tests/test_online_graph.py \
  tests/test_formats.py tests/test_decoding.py tests/test_orientation.py tests/test_progress.py \
  tests/test_tool_speculation.py tests/test_gate_trust.py tests/test_gate_forgery.py \
  tests/test_limits.py tests/test_router.py tests/test_tiny.py tests/test_tiny_families.py \
  tests/test_models.py tests/test_separability.py tests/test_label_free.py \
  tests/test_compat.py tests/test_layout.py  # what _compat relies on, at the floors too
