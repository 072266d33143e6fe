#!/usr/bin/env bash
# What tests/integration/web_page.rs drives the page at `/` with: Debian's chromium (installed
# only when /usr/bin/chromium is missing) and playwright-core from npm at a pinned version (the
# one place it is named), into target/browser. Safe to run again: it installs only what is
# missing or at another version.
set -euo pipefail
cd "$(dirname "$0")/.."

PLAYWRIGHT_CORE="playwright-core@1.65.2"

apt_updated=0
apt_install() {
  if ! command -v apt-get >/dev/null 2>&1; then
    echo "install-browser: $* missing and no apt-get to install it" >&2
    exit 1
  fi
  if [ "$apt_updated" = 0 ]; then
    apt-get update -qq
    apt_updated=1
  fi
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "$@" >/dev/null
}

if [ ! -x /usr/bin/chromium ]; then
  apt_install chromium
fi
if ! command -v npm >/dev/null 2>&1; then
  apt_install nodejs npm
fi

want="${PLAYWRIGHT_CORE#*@}"
have="$(node -p "require('./target/browser/node_modules/playwright-core/package.json').version" 2>/dev/null || true)"
if [ "$have" != "$want" ]; then
  mkdir -p target/browser
  npm install --no-audit --no-fund --loglevel=error --prefix target/browser "$PLAYWRIGHT_CORE" >/dev/null
fi
echo "install-browser: $(/usr/bin/chromium --version 2>/dev/null | head -1), playwright-core $(node -p "require('./target/browser/node_modules/playwright-core/package.json').version")"
