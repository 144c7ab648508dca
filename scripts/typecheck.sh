#!/usr/bin/env bash
# mypy on both packages, as a user's type checker sees them installed: speceyes_graph and
# speceyes_tools (the tools are in tools/ here; an editable install maps them with an import
# hook mypy cannot follow, so this gives mypy a folder of links under the installed names).
set -euo pipefail
cd "$(dirname "$0")/.."
ROOT=$(pwd)
PY=${PYTHON:-$ROOT/.venv/bin/python}
LINKS=${SPECEYES_TYPECHECK_DIR:-$ROOT/build/typecheck}
mkdir -p "$LINKS"
ln -sfn "$ROOT/speceyes_graph" "$LINKS/speceyes_graph"
ln -sfn "$ROOT/tools" "$LINKS/speceyes_tools"
cd "$LINKS"
exec "$PY" -m mypy --config-file "$ROOT/pyproject.toml" --python-executable "$PY" \
  --cache-dir "$LINKS/.mypy_cache" -p speceyes_graph -p speceyes_tools "$@"
