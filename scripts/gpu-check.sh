#!/usr/bin/env bash
# One command for a machine with an NVIDIA GPU: builds in release, runs the CUDA conformance
# suite and NVRTC check, the fixture models on the CUDA backend (full transformers comparison
# via FT_TEST_BACKEND=cuda, plus greedy tokens through the CLI), then a synthetic
# Qwen3-30B-A3B-shaped model through `bench` per --moe-mode with the expert cache capped.
# The full output goes to gpu-check.log; a short table is printed at the end. Budget: < 8 min.
#
# Knobs (environment):
#   FT_GPU_CHECK_BACKEND  cuda (default) or cpu: cpu dry-runs every step on a machine without
#                         a GPU, to check this script itself
#   FT_GPU_CHECK_PROFILE  release (default) or debug (reuse a debug build for a dry run)
#   FT_GPU_CHECK_LAYERS   layers of the synthetic model (default 4)
#   FT_GPU_CHECK_SLOTS    expert cache slots for bench (default: a quarter of the experts)
#   FT_GPU_CHECK_MODES    --moe-mode values for bench (default offload,cpu,hybrid)
#   FT_GPU_CHECK_QUANT    formats the synthetic model is also quantized to and benched in
#                         (default nvfp4; comma-separated fp8, nvfp4, mxfp4, or none)
#   FT_GPU_CHECK_LOG      log file (default gpu-check.log)
#   FT_GPU_CHECK_BUDGET   seconds for the whole run (default 470); every step's limit is cut
#                         to what is left, so the script ends in time even when a step hangs
#   FT_GPU_CHECK_BIN_DIR  a folder of prebuilt binaries from scripts/gpu-bundle.sh: nothing is
#                         built, so a GPU machine without a Rust toolchain can run the check
set -uo pipefail
cd "$(dirname "$0")/.."

BACKEND="${FT_GPU_CHECK_BACKEND:-cuda}"
PROFILE="${FT_GPU_CHECK_PROFILE:-release}"
LAYERS="${FT_GPU_CHECK_LAYERS:-4}"
MODES="${FT_GPU_CHECK_MODES:-offload,cpu,hybrid}"
QUANT="${FT_GPU_CHECK_QUANT:-nvfp4}"
LOG="${FT_GPU_CHECK_LOG:-gpu-check.log}"
WORK="${TMPDIR:-/tmp}/ft-gpu-check"
BUDGET="${FT_GPU_CHECK_BUDGET:-470}"
START=$SECONDS
: >"$LOG"

say() { echo "[$((SECONDS - START))s] $*" | tee -a "$LOG" >&2; }
# A step's time limit: what it asks for, or what is left of the budget (at least 5 s).
lim() {
  local want=$1 left=$((BUDGET - (SECONDS - START)))
  [ "$left" -lt "$want" ] && want=$left
  [ "$want" -lt 5 ] && want=5
  echo "$want"
}
# Runs a step with a time limit, all output to the log; returns its status. A limit given
# as "=N" is not cut by the budget: builds are never killed half-way, which can leave
# corrupt artifacts behind for the next run.
step() {
  local limit
  case "$1" in
    =*) limit=${1#=} ;;
    *) limit=$(lim "$1") ;;
  esac
  shift
  say "\$ $*"
  timeout --kill-after=10 "$limit" "$@" >>"$LOG" 2>&1
  local rc=$?
  [ $rc -eq 124 ] && say "timed out after ${limit}s: $*"
  return $rc
}

BIN_DIR="${FT_GPU_CHECK_BIN_DIR:-}"
case "$PROFILE" in
  release) CARGO_PROFILE=(--release); BIN=target/release/ft-actor ;;
  debug) CARGO_PROFILE=(); BIN=target/debug/ft-actor ;;
  *) echo "FT_GPU_CHECK_PROFILE must be release or debug" >&2; exit 2 ;;
esac
if [ -n "$BIN_DIR" ]; then
  BIN="$BIN_DIR/ft-actor"
  # The test binaries look for tests/fixtures under the tree they were built in unless told.
  export FT_REPO_DIR="$PWD"
fi
case "$BACKEND" in
  cuda | cpu) ;;
  *) echo "FT_GPU_CHECK_BACKEND must be cuda or cpu" >&2; exit 2 ;;
esac

# NVRTC: the pip wheel from .ci/install-nvrtc.sh if present, else the CUDA toolkit's.
if [ -f .venv/nvrtc.env ]; then
  # shellcheck source=/dev/null
  source .venv/nvrtc.env
fi
for d in "${CUDA_HOME:-/usr/local/cuda}/lib64" /usr/local/cuda/lib64; do
  [ -d "$d" ] && export LD_LIBRARY_PATH="$d${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
done
# A system-wide pip install of nvidia-cuda-nvrtc-cu12 works too.
wheel_lib=$(python3 -c 'import nvidia.cuda_nvrtc as m, os; print(os.path.join(list(m.__path__)[0], "lib"))' 2>/dev/null || true)
[ -n "$wheel_lib" ] && [ -d "$wheel_lib" ] && export LD_LIBRARY_PATH="$wheel_lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
mkdir -p "$WORK"
have_nvrtc=no
for d in ${LD_LIBRARY_PATH:+${LD_LIBRARY_PATH//:/ }}; do
  compgen -G "$d/libnvrtc.so*" >/dev/null && have_nvrtc=yes
done
ldconfig -p 2>/dev/null | grep -q libnvrtc && have_nvrtc=yes
# cudarc asks the loader for libnvrtc.so, .so.12 and older: a toolkit or wheel newer than 12
# that ships only libnvrtc.so.13 gets an unversioned link (its own folder stays on the path
# for libnvrtc-builtins).
if ! compgen -G "${CUDA_HOME:-/usr/local/cuda}/lib64/libnvrtc.so" >/dev/null; then
  newer=$( (ls "${CUDA_HOME:-/usr/local/cuda}"/lib64/libnvrtc.so.1[3-9]* 2>/dev/null;
    find / -xdev -name 'libnvrtc.so.1[3-9]' 2>/dev/null) | head -1)
  if [ -n "$newer" ]; then
    mkdir -p "$WORK/nvrtc"
    ln -sfn "$newer" "$WORK/nvrtc/libnvrtc.so"
    export LD_LIBRARY_PATH="$WORK/nvrtc:$(dirname "$newer")${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
    have_nvrtc=yes
  fi
fi
export FT_CUDA_CACHE_DIR="$WORK/ptx"

say "ft-actor GPU check: backend $BACKEND, profile $PROFILE, log $LOG"
command -v nvidia-smi >/dev/null && step 20 nvidia-smi
if [ "$BACKEND" = cuda ] && [ "$have_nvrtc" = no ]; then
  say "warning: libnvrtc not found (no CUDA toolkit, no nvidia-cuda-nvrtc-cu12): the CUDA backend cannot compile its kernels; run .ci/install-nvrtc.sh where pip can reach PyPI"
fi

# 1. Build (binary and the test binaries used below), unless they came prebuilt.
if [ -n "$BIN_DIR" ]; then
  say "prebuilt binaries from $BIN_DIR: $(cd "$BIN_DIR" && echo *)"
elif ! step =420 cargo build "${CARGO_PROFILE[@]}" --bin ft-actor; then
  say "build failed; see $LOG"
  exit 1
else
  step =300 cargo test "${CARGO_PROFILE[@]}" --no-run -p ft-backend-cuda
  step =300 cargo test "${CARGO_PROFILE[@]}" --no-run --test integration
fi

# 2. Backend tests: conformance (one test per op and dtype) and the NVRTC compile check.
# FT_CUDA_QUANT=1 enables the CUDA quantized-weight matmul kernels, which are off (and
# unclaimed by supports()) until they have passed here: the matmul_fp8, matmul_nvfp4,
# matmul_mxfp4, matmul_q8_0, matmul_q4_0, matmul_q4_k, matmul_q5_k, matmul_q6_k cases run them.
CONF_OUT="$WORK/conformance.txt"
: >"$CONF_OUT"
if [ -n "$BIN_DIR" ]; then
  # The CUDA crate's test binaries in turn (unit, conformance, NVRTC; host_decode needs no GPU).
  for t in "$BIN_DIR"/ft_backend_cuda-lib "$BIN_DIR"/conformance "$BIN_DIR"/nvrtc_compile; do
    [ -x "$t" ] || continue
    say "\$ FT_CUDA_QUANT=1 $t --nocapture"
    FT_CUDA_QUANT=1 timeout --kill-after=10 "$(lim 90)" "$t" --nocapture >>"$CONF_OUT" 2>&1
  done
else
  if [ "$BACKEND" = cuda ]; then
    CONF=(env FT_CUDA_QUANT=1 cargo test "${CARGO_PROFILE[@]}" -p ft-backend-cuda -- --nocapture)
  else
    CONF=(cargo test "${CARGO_PROFILE[@]}" -p ft-backend-cpu --test conformance -- --nocapture auto::)
  fi
  say "\$ ${CONF[*]}"
  timeout --kill-after=10 "$(lim 120)" "${CONF[@]}" >"$CONF_OUT" 2>&1
fi
cat "$CONF_OUT" >>"$LOG"
ops_ok=$(grep -cE '^test .* \.\.\. ok$' "$CONF_OUT")
ops_bad=$(grep -cE '^test .* \.\.\. FAILED$' "$CONF_OUT")
ops_skip=$(grep -c '^skipped:' "$CONF_OUT")

# 3. Fixture models against the transformers references, on the backend under test.
FIX_OUT="$WORK/fixtures.txt"
if [ -n "$BIN_DIR" ]; then
  FIX=("$BIN_DIR/integration" fixture_models::)
else
  FIX=(cargo test "${CARGO_PROFILE[@]}" --test integration -- fixture_models::)
fi
say "\$ FT_TEST_BACKEND=$BACKEND ${FIX[*]}"
FT_TEST_BACKEND=$BACKEND timeout --kill-after=10 "$(lim 120)" "${FIX[@]}" --test-threads=2 >"$FIX_OUT" 2>&1
cat "$FIX_OUT" >>"$LOG"
fix_ok=$(grep -cE '^test .* \.\.\. ok$' "$FIX_OUT")
fix_bad=$(grep -cE '^test .* \.\.\. FAILED$' "$FIX_OUT")

# 4. Greedy tokens through the CLI (the path users take), one prompt per fixture.
cli_ok=0
cli_bad=0
for ref in tests/fixtures/*/reference.json; do
  name=$(basename "$(dirname "$ref")")
  ids=$(python3 -c 'import json,sys; r=json.load(open(sys.argv[1])); print(",".join(map(str, r["prompts"][0]["ids"])))' "$ref") || continue
  want=$(python3 -c 'import json,sys; r=json.load(open(sys.argv[1])); print(json.dumps(r["generation"][0]["new_ids"], separators=(",", ":")))' "$ref") || continue
  got_file="$WORK/gen-$name.txt"
  say "\$ $BIN generate --model tests/fixtures/$name/checkpoint --backend $BACKEND --prompt-ids $ids"
  timeout --kill-after=5 "$(lim 40)" "$BIN" generate --model "tests/fixtures/$name/checkpoint" --backend "$BACKEND" \
    --prompt-ids "$ids" --max-tokens 16 --temperature 0 --ignore-eos --output-ids >"$got_file" 2>>"$LOG"
  got=$(tr -d ' \n' <"$got_file")
  if [ "$got" = "$want" ]; then
    cli_ok=$((cli_ok + 1))
  else
    cli_bad=$((cli_bad + 1))
    say "$name: greedy tokens $got, want $want"
  fi
done

# 5. A synthetic Qwen3-30B-A3B-shaped model through bench, per MoE mode, cache capped.
SYNTH="$WORK/qwen3-30b-a3b-${LAYERS}l"
BENCH_OUT="$WORK/bench.jsonl"
: >"$BENCH_OUT"
if step 90 "$BIN" synth --like qwen3-30b-a3b --layers "$LAYERS" --dtype bf16 --out "$SYNTH" --overwrite; then
  # A quarter of the routed experts fit, so every mode has misses to handle.
  slots="${FT_GPU_CHECK_SLOTS:-$((LAYERS * 128 / 4))}"
  say "\$ $BIN bench --model $SYNTH --backend $BACKEND --modes $MODES --expert-cache-slots $slots --json"
  timeout --kill-after=10 "$(lim 200)" "$BIN" bench --model "$SYNTH" --backend "$BACKEND" --modes "$MODES" \
    --expert-cache-slots "$slots" --ctx-size 1024 --prompt-len 64 --gen-tokens 32 --bandwidth-mib 256 --json >"$BENCH_OUT" 2>>"$LOG"
  cat "$BENCH_OUT" >>"$LOG"
  # The same weights packed as publishers ship them, on the quantized matmul kernels.
  for fmt in ${QUANT//,/ }; do
    [ "$fmt" = none ] && continue
    if step 120 "$BIN" quantize --model "$SYNTH" --format "$fmt" --out "$SYNTH-$fmt" --overwrite; then
      say "\$ FT_CUDA_QUANT=1 $BIN bench --model $SYNTH-$fmt --backend $BACKEND --modes $MODES --expert-cache-slots $slots --json"
      FT_CUDA_QUANT=1 timeout --kill-after=10 "$(lim 200)" "$BIN" bench --model "$SYNTH-$fmt" --backend "$BACKEND" --modes "$MODES" \
        --expert-cache-slots "$slots" --ctx-size 1024 --prompt-len 64 --gen-tokens 32 --bandwidth-mib 256 --json 2>>"$LOG" |
        sed "s/^{/{\"format\":\"$fmt\",/" | tee -a "$LOG" >>"$BENCH_OUT"
    fi
  done
fi

# 6. Summary.
{
  echo
  echo "## ft-actor GPU check ($BACKEND, $((SECONDS - START)) s)"
  echo
  echo "| check | passed | failed | skipped |"
  echo "|---|---|---|---|"
  echo "| backend tests (conformance per op × dtype, NVRTC) | $ops_ok | $ops_bad | $ops_skip |"
  echo "| fixture models vs transformers (FT_TEST_BACKEND) | $fix_ok | $fix_bad | |"
  echo "| fixture greedy tokens via CLI | $cli_ok | $cli_bad | |"
  echo
  python3 - "$BENCH_OUT" <<'PY'
import json, sys
rows = []
for line in open(sys.argv[1]):
    line = line.strip()
    if line.startswith("{"):
        try:
            rows.append(json.loads(line))
        except ValueError:
            pass
if not rows:
    print("bench: no results (see the log)")
    sys.exit(0)
print("| format | moe mode | effective | cache slots | decode tok/s | prefill tok/s | hit rate | PCIe GB/s achieved | host→device GB/s measured |")
print("|---|---|---|---|---|---|---|---|---|")
def med(x):
    return (x or {}).get("median", 0) if isinstance(x, dict) else (x or 0)
for r in rows:
    if "decode_tok_s" not in r:
        continue
    pcie = r.get("bytes_moved_per_token", 0) * med(r.get("decode_tok_s")) / 1e9
    b_p = (r.get("b_p") or 0) / 1e9
    print(f"| {r.get('format', 'bf16')} | {r['mode']} | {str(r.get('effective', '?')).split(' ')[0]} | {r.get('cache_slots', '?')} | "
          f"{med(r.get('decode_tok_s')):.2f} | {med(r.get('prefill_tok_s')):.1f} | {100 * r.get('hit_rate', 0):.0f} % | {pcie:.2f} | {b_p:.2f} |")
PY
} | tee -a "$LOG"

[ "$ops_bad" -eq 0 ] && [ "$fix_bad" -eq 0 ] && [ "$cli_bad" -eq 0 ] && [ "$ops_ok" -gt 0 ]
