#!/usr/bin/env bash
# Build the documentation site (MkDocs Material + mkdocstrings) into build/site, strictly:
# a broken link or a symbol the API reference names that does not exist fails the build.
# mkdocstrings reads the packages under their installed names (the tools are in tools/,
# installed as speceyes_tools), from the folder of links scripts/typecheck.sh also uses.
set -euo pipefail
cd "$(dirname "$0")/.."
ROOT=$(pwd)
PY=${PYTHON:-$ROOT/.venv/bin/python}
mkdir -p build/typecheck
ln -sfn "$ROOT/speceyes_graph" build/typecheck/speceyes_graph
ln -sfn "$ROOT/tools" build/typecheck/speceyes_tools
NO_MKDOCS_2_WARNING=1 "$PY" -m mkdocs build --strict "$@"
# the API reference links the names docstrings cross-reference (docs/griffe_roles.py); a
# Sphinx role printed raw means a docstring the extension did not reach
SITE=build/site
if [ -d "$SITE/api" ] && grep -rlE ':(class|func|meth|mod|attr|data|exc|obj):' "$SITE/api"; then
  echo "docs: raw Sphinx roles in the API reference (the pages above)" >&2
  exit 1
fi
