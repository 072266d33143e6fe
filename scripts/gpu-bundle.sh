#!/usr/bin/env bash
# Builds what scripts/gpu-check.sh runs — the ft-actor binary, the CUDA backend's test binaries
# and the fixture-model test — in release without debug info, and copies them, stripped, into
# one folder (default .gpu-bundle/, ignored by git). For a GPU machine that has the NVIDIA
# driver but no Rust toolchain: carry the folder there with the repository and run
#   FT_GPU_CHECK_BIN_DIR=.gpu-bundle scripts/gpu-check.sh
# The binaries load CUDA at run time, so the machine that builds them needs no GPU or toolkit.
set -euo pipefail
cd "$(dirname "$0")/.."

OUT_DIR="${1:-.gpu-bundle}"
export CARGO_PROFILE_RELEASE_DEBUG=0
mkdir -p "$OUT_DIR"
rm -f "$OUT_DIR"/*

# Test executables as cargo reports them: "<target name> <path>" per line (a library's unit
# tests as "<crate>-lib").
list_tests() {
  cargo test --release --no-run --message-format=json "$@" 2>/dev/null | python3 -c '
import json, sys
for line in sys.stdin:
    try:
        m = json.loads(line)
    except ValueError:
        continue
    if m.get("reason") == "compiler-artifact" and m.get("executable") and m.get("profile", {}).get("test"):
        t = m["target"]
        print(t["name"] + ("-lib" if "lib" in t["kind"] else ""), m["executable"])
'
}

cargo build --release --bin ft-actor
# Build first with normal output (errors show), then ask again for the paths.
cargo test --release --no-run -p ft-backend-cuda
cargo test --release --no-run --test integration
target_dir=$(cargo metadata --format-version 1 --no-deps | python3 -c 'import json,sys; print(json.load(sys.stdin)["target_directory"])')
cp "$target_dir/release/ft-actor" "$OUT_DIR/ft-actor"
{ list_tests -p ft-backend-cuda; list_tests --test integration; } | while read -r name exe; do
  cp "$exe" "$OUT_DIR/$name"
done
strip "$OUT_DIR"/* 2>/dev/null || true
ls -l "$OUT_DIR"
du -sh "$OUT_DIR"
