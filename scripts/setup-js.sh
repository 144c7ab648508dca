#!/usr/bin/env bash
# Set up the JavaScript side of the chat-UI tests (tests/test_chat_ui.py): the real
# @langchain/langgraph-sdk client under Node, and a page on its useStream React hook driven
# in headless Chromium by playwright-core.
#
#   bash scripts/setup-js.sh
#
# Installs Debian's chromium (apt) when /usr/bin/chromium is missing (playwright-core never
# downloads a browser), runs `npm ci` in tests/js (the versions pinned in its
# package-lock.json), and bundles the test page (tests/js/page/app.jsx -> page/dist/app.js,
# esbuild). Needs Node.js >= 20 and npm. A rerun with nothing changed takes well under a
# second (stamps in tests/js/node_modules and page/dist); a changed page is only rebundled.
# Environment:
#   SPECEYES_CHROMIUM=/path/to/chromium   a browser of your own instead of /usr/bin/chromium
set -euo pipefail
cd "$(dirname "$0")/.."
JS=tests/js
STAMP="$JS/node_modules/.speceyes-setup"       # what npm ci installed from
PAGE_STAMP="$JS/page/dist/.speceyes-setup"      # what the bundle was built from
CHROMIUM=${SPECEYES_CHROMIUM:-/usr/bin/chromium}

say() { echo "setup-js: $*"; }
as_root() { if [ "$(id -u)" = 0 ]; then "$@"; else sudo "$@"; fi; }
fingerprint() { cat "$JS/package.json" "$JS/package-lock.json" scripts/setup-js.sh | sha256sum | cut -d' ' -f1; }
page_fingerprint() { cat "$JS/page/app.jsx" "$JS/page/index.html" "$STAMP" | sha256sum | cut -d' ' -f1; }
installed() {
  [ -f "$STAMP" ] && [ "$(cat "$STAMP")" = "$(fingerprint)" ] \
    && [ -d "$JS/node_modules/@langchain/langgraph-sdk" ] && [ -d "$JS/node_modules/playwright-core" ]
}
built() { [ -f "$JS/page/dist/app.js" ] && [ -f "$PAGE_STAMP" ] && [ "$(cat "$PAGE_STAMP")" = "$(page_fingerprint)" ]; }
if [ -x "$CHROMIUM" ] && installed && built; then
  say "up to date ($JS/node_modules, $JS/page/dist, $CHROMIUM)"
  exit 0
fi

if ! command -v node >/dev/null 2>&1 || ! command -v npm >/dev/null 2>&1 \
   || ! node -e 'process.exit(Number(process.versions.node.split(".")[0]) < 20 ? 1 : 0)'; then
  say "please install Node.js >= 20 with npm (found: $(node --version 2>/dev/null || echo none))" >&2
  exit 1
fi

if [ ! -x "$CHROMIUM" ]; then
  command -v apt-get >/dev/null 2>&1 || { say "please install chromium (or set SPECEYES_CHROMIUM)" >&2; exit 1; }
  say "installing chromium (apt)"
  as_root apt-get update -qq
  DEBIAN_FRONTEND=noninteractive as_root apt-get install -y -qq chromium >/dev/null
  [ -x "$CHROMIUM" ] || { say "no browser at $CHROMIUM after installing chromium" >&2; exit 1; }
fi

if ! installed; then
  say "npm ci in $JS"
  (cd "$JS" && npm ci --no-audit --no-fund --loglevel=error)
  fingerprint > "$STAMP"
  installed || { say "npm ci did not install the packages; see the messages above" >&2; exit 1; }
fi
say "bundling the test page ($JS/page/dist/app.js)"
(cd "$JS" && npm run --silent build -- --log-level=warning)
page_fingerprint > "$PAGE_STAMP"
say "done: node $(node --version), $("$CHROMIUM" --version 2>/dev/null || echo chromium)"
