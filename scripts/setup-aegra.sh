#!/usr/bin/env bash
# Set up Aegra, the open multi-instance LangGraph server (Postgres + Redis, run leases,
# redelivery of a dead instance's runs), in a virtual environment of its own (.venv-aegra),
# with this package in it, for the tests that serve the graphs on several Aegra instances
# (pytest -m aegra) and for docs/deployment.md's Aegra section.
#
#   bash scripts/setup-aegra.sh
#
# Aegra needs Python >= 3.12 (the project's .venv may be 3.11): the script takes $PYTHON, else
# python3.12 or python3.13 on the path, else one under pyenv's versions. It installs
# redis-server (apt) when missing; PostgreSQL comes with scripts/setup.sh. Installed with uv
# (scripts/uv.sh). Environment:
#   PYTHON=/path/to/python3.12  the interpreter the environment is made from
#   SPECEYES_AEGRA_VENV=DIR     where it lives (default .venv-aegra in the repository)
set -euo pipefail
cd "$(dirname "$0")/.."
VENV=${SPECEYES_AEGRA_VENV:-.venv-aegra}
VPY="$VENV/bin/python"
STAMP="$VENV/.speceyes-setup"
source scripts/uv.sh
AEGRA=(aegra-api==0.11.0 aegra-cli==0.11.0)
TORCH=(torch==2.14.1 torchvision==0.29.1)

say() { echo "setup-aegra: $*"; }
as_root() { if [ "$(id -u)" = 0 ]; then "$@"; else sudo "$@"; fi; }
fingerprint() { cat pyproject.toml scripts/setup-aegra.sh scripts/uv.sh | sha256sum | cut -d' ' -f1; }
works() {
  "$VPY" -c "import aegra_api, speceyes_graph, torch, langchain_openai" >/dev/null 2>&1 \
    && command -v redis-server >/dev/null 2>&1
}
if [ -f "$STAMP" ] && [ "$(cat "$STAMP")" = "$(fingerprint)" ] && works; then
  say "up to date ($VENV)"
  exit 0
fi

if ! command -v redis-server >/dev/null 2>&1; then
  command -v apt-get >/dev/null 2>&1 || { say "please install redis-server" >&2; exit 1; }
  say "installing redis-server (apt)"
  as_root apt-get update -qq && DEBIAN_FRONTEND=noninteractive as_root apt-get install -y -qq redis-server >/dev/null
fi

find_python() {
  local c
  for c in "${PYTHON:-}" python3.12 python3.13; do
    [ -n "$c" ] && command -v "$c" >/dev/null 2>&1 \
      && "$c" -c 'import sys; sys.exit(sys.version_info < (3, 12))' 2>/dev/null && { command -v "$c"; return; }
  done
  for c in "${PYENV_ROOT:-$HOME/.pyenv}"/versions/3.1[2-9]*/bin/python3; do
    [ -x "$c" ] && { echo "$c"; return; }
  done
  return 1
}
if [ ! -x "$VPY" ]; then
  PY=$(find_python) || { say "Aegra needs Python >= 3.12; set PYTHON=/path/to/python3.12" >&2; exit 1; }
  say "creating $VENV from $PY"
  "$PY" -m venv "$VENV"
fi
say "installing ${AEGRA[*]}, ${TORCH[*]} and this package (with the openai and postgres extras: served models, shared image blobs)"
"$(uv_for "$VPY")" pip install -q --python "$VPY" "${AEGRA[@]}" "${TORCH[@]}" -e ".[openai,postgres]"
works || { say "Aegra or this package does not import in $VENV; see the messages above" >&2; exit 1; }
fingerprint > "$STAMP"
say "done: aegra-api $("$VPY" -c 'import importlib.metadata as m; print(m.version("aegra-api"))') in $VENV"
