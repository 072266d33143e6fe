#!/usr/bin/env bash
# The real coding-agent CLIs that tests/integration/agent_clis.rs runs against `ft-actor serve`, at pinned
# versions (the one place they are named; the newest on npm when last bumped), installed from
# npm into target/agents. FT_AGENTS_LATEST=1 installs each one's newest release instead, to try
# a new version before pinning it.
set -euo pipefail
cd "$(dirname "$0")/.."

AGENTS=(
  "@anthropic-ai/claude-code@2.1.332"
  "@openai/codex@0.171.0"
  "opencode-ai@1.18.33"
  "@qwen-code/qwen-code@0.24.4"
)

if ! command -v npm >/dev/null 2>&1; then
  if command -v apt-get >/dev/null 2>&1; then
    apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq nodejs npm >/dev/null
  else
    echo "install-agents: npm is required" >&2
    exit 1
  fi
fi
if [ "${FT_AGENTS_LATEST:-0}" = 1 ]; then
  latest=()
  for a in "${AGENTS[@]}"; do latest+=("${a%@*}@latest"); done
  AGENTS=("${latest[@]}")
fi
mkdir -p target/agents
npm install --no-audit --no-fund --loglevel=error --prefix target/agents "${AGENTS[@]}" >/dev/null
for b in claude codex opencode qwen; do
  echo "install-agents: $b $(target/agents/node_modules/.bin/$b --version 2>&1 | head -1)"
done
