#!/usr/bin/env bash
# Installs the official OpenAI and Anthropic Python SDKs into .venv for the server tests
# (tests/server_sdk.rs runs tests/python/test_sdk.py with .venv/bin/python).
# Idempotent: a .venv that already has the pinned versions is left as it is.
set -euo pipefail
cd "$(dirname "$0")/.."

# Pinned so that CI tests the same client code every run; raise deliberately.
OPENAI_VERSION="3.57.0"
ANTHROPIC_VERSION="2.16.0"

PY="${PYTHON:-python3}"
if ! command -v "$PY" >/dev/null 2>&1; then
  echo "install-python: $PY not found; the SDK tests need Python 3.9+" >&2
  exit 1
fi

VENV=.venv
want="openai==${OPENAI_VERSION} anthropic==${ANTHROPIC_VERSION}"
if [ -x "$VENV/bin/python" ] && "$VENV/bin/python" - "$OPENAI_VERSION" "$ANTHROPIC_VERSION" <<'PYCHECK' 2>/dev/null
import sys, openai, anthropic
sys.exit(0 if (openai.__version__, anthropic.__version__) == (sys.argv[1], sys.argv[2]) else 1)
PYCHECK
then
  echo "install-python: .venv already has $want"
  exit 0
fi

if [ ! -x "$VENV/bin/python" ]; then
  "$PY" -m venv "$VENV"
fi
"$VENV/bin/python" -m pip install --quiet --disable-pip-version-check $want
"$VENV/bin/python" -c "import openai, anthropic; print('install-python: openai', openai.__version__, '· anthropic', anthropic.__version__)"
