#!/usr/bin/env bash
# The real coding-agent CLIs that tests/agent_clis.rs runs against `ft-actor serve`, at pinned
# versions (the one place they are named), installed from npm into target/agents.
set -euo pipefail
cd "$(dirname "$0")/.."

AGENTS=(
  "@anthropic-ai/claude-code@2.1.197"
  "@openai/codex@0.171.0"
)

if ! command -v npm >/dev/null 2>&1; then
  if command -v apt-get >/dev/null 2>&1; then
    apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq nodejs npm >/dev/null
  else
    echo "install-agents: npm is required" >&2
    exit 1
  fi
fi
mkdir -p target/agents
npm install --no-audit --no-fund --loglevel=error --prefix target/agents "${AGENTS[@]}" >/dev/null
for b in claude codex; do
  echo "install-agents: $b $(target/agents/node_modules/.bin/$b --version 2>&1 | head -1)"
done
