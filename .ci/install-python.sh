#!/usr/bin/env bash
# Installs the official OpenAI and Anthropic Python SDKs into .venv for the server tests
# (tests/integration/server_sdk.rs runs tests/python/test_sdk.py with .venv/bin/python), and gguf-py with
# numpy, which write and decode the GGUF files of tests/integration/gguf.rs (tests/python/hf_to_gguf.py), and
# sentencepiece, the reference the SentencePiece GGUF tokenizer test trains and compares against
# (tests/python/spm_to_gguf.py).
# Idempotent: a .venv that already has the pinned versions is left as it is.
set -euo pipefail
cd "$(dirname "$0")/.."

# Pinned so that CI tests the same client code every run; raise deliberately.
OPENAI_VERSION="3.57.0"
ANTHROPIC_VERSION="2.16.0"
GGUF_VERSION="0.19.0"
NUMPY_VERSION="2.3.5"
SENTENCEPIECE_VERSION="0.2.3"

PY="${PYTHON:-python3}"
if ! command -v "$PY" >/dev/null 2>&1; then
  echo "install-python: $PY not found; the SDK tests need Python 3.9+" >&2
  exit 1
fi

VENV=.venv
want="openai==${OPENAI_VERSION} anthropic==${ANTHROPIC_VERSION} gguf==${GGUF_VERSION} numpy==${NUMPY_VERSION} sentencepiece==${SENTENCEPIECE_VERSION}"
if [ -x "$VENV/bin/python" ] && "$VENV/bin/python" - "$OPENAI_VERSION" "$ANTHROPIC_VERSION" "$GGUF_VERSION" "$NUMPY_VERSION" "$SENTENCEPIECE_VERSION" <<'PYCHECK' 2>/dev/null
import sys, openai, anthropic, numpy, sentencepiece
from importlib.metadata import version
have = (openai.__version__, anthropic.__version__, version("gguf"), numpy.__version__, version("sentencepiece"))
sys.exit(0 if have == tuple(sys.argv[1:6]) else 1)
PYCHECK
then
  echo "install-python: .venv already has $want"
  exit 0
fi

if [ ! -x "$VENV/bin/python" ]; then
  "$PY" -m venv "$VENV"
fi
"$VENV/bin/python" -m pip install --quiet --disable-pip-version-check $want
"$VENV/bin/python" -c "import openai, anthropic, gguf, numpy, sentencepiece; from importlib.metadata import version; print('install-python: openai', openai.__version__, '· anthropic', anthropic.__version__, '· gguf', version('gguf'), '· numpy', numpy.__version__, '· sentencepiece', version('sentencepiece'))"
