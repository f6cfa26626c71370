#!/bin/sh
# device-check.sh: the CUDA backend on a real GPU, in one go (about 5 minutes on an H200, < 8).
#   1. builds with CUDA=1 (and the CUDA benchmark program);
#   2. generates Qwen3-8B-sized random models in the background (36 layers, n_embd 4096, 32 heads,
#      8 kv heads, head_dim 128, n_ff 12288, vocab 151936, tied head) in bf16 and q8_0, each with a
#      5-layer DFlash drafter (block 16), 4 writers in parallel;
#   3. meanwhile runs the CUDA tests: every op against the CPU reference, batch invariance,
#      queues/events, and the end-to-end tests (CUDA vs CPU logits, greedy speculative output ==
#      target-alone greedy output on the GPU, host vs device feature paths);
#   4. benchmarks both models (tests/bench/bench_cuda.c): tg tok/s against the HBM roofline
#      (weight bytes per token / 4.8 TB/s), verification of 16 tokens, draft time, spec step time
#      with device vs host features, host vs device event wait, spec rate with oracle drafts;
#   5. runs `dflash bench --device cuda` on the q8_0 pair (the CLI's own figures);
#   6. prints a short table last.
# Needs the CUDA toolkit on the GPU machine (nvcc to build; cuBLAS is opened at run time).
# Usage: tools/device-check.sh [WORKDIR]   (default $DFLASH_CHECK_DIR or /tmp/dflash-devcheck;
# needs ~30 GB of disk there). Logs go to $OUT when set (the device runner collects it), else
# WORKDIR. Exit status 0 when the build, the tests and both benchmarks succeeded.
set -u
cd "$(dirname "$0")/.." || exit 1
WORK=${1:-${DFLASH_CHECK_DIR:-/tmp/dflash-devcheck}}
LOGS=${OUT:-$WORK}
mkdir -p "$WORK" "$LOGS"
JOBS=$(nproc 2>/dev/null || echo 8)
T0=$(date +%s)
stamp() { echo "[device-check +$(( $(date +%s) - T0 ))s] $*"; }
status=0

stamp "host: $(uname -m), $JOBS cpus, $(free -g 2>/dev/null | awk '/Mem:/{print $2" GiB RAM"}'), disk $(df -h "$WORK" | awk 'NR==2{print $4" free"}')"
if command -v nvidia-smi >/dev/null 2>&1; then
    nvidia-smi --query-gpu=name,memory.total,driver_version,clocks.max.sm,clocks.max.mem --format=csv,noheader | sed 's/^/  gpu: /'
else
    stamp "nvidia-smi not found"
fi

# ---- 1. build ------------------------------------------------------------------------------
if ! command -v nvcc >/dev/null 2>&1 && [ ! -x /usr/local/cuda/bin/nvcc ]; then
    if [ -x build/bench-cuda ] && [ -x build/dflash-tests ] && [ -x build/dflash ]; then
        stamp "nvcc not found: using the binaries already in build/ (they need libcudart and libcublas at run time)"
    else
        stamp "nvcc not found and no CUDA build in build/: install the CUDA toolkit (nvcc, cuBLAS)"
        exit 1
    fi
    : > "$LOGS/build.log"
else
stamp "build (make CUDA=1 -j$JOBS)"
if ! make CUDA=1 -j"$JOBS" all build/dflash-tests bench-cuda > "$LOGS/build.log" 2>&1; then
    tail -40 "$LOGS/build.log"
    stamp "BUILD FAILED (log: $LOGS/build.log)"
    exit 1
fi
grep -E "^dflash: (CUDA|nvcc)" "$LOGS/build.log" | sed 's/^/  /'
grep -ciE "warning" "$LOGS/build.log" | awk '{print "  build warnings: "$1}'
fi

# ---- 2. models (background) ------------------------------------------------------------------
DIMS="--n-embd 4096 --n-layer 36 --n-head 32 --n-head-kv 8 --head-dim 128 --n-ff 12288 --n-vocab 151936 --n-ctx-train 40960 --draft-layers 5 --block-size 16 --target-layers 2,10,18,26,34 --seed 7"
gen_pids=""
for ty in q8_0 bf16; do
    if [ ! -s "$WORK/target-$ty.gguf" ]; then
        ./build/dflash make-test-model --target "$WORK/target-$ty.gguf" $DIMS --type "$ty" > "$LOGS/gen-target-$ty.log" 2>&1 &
        gen_pids="$gen_pids $!"
    fi
    if [ ! -s "$WORK/drafter-$ty.gguf" ]; then
        ./build/dflash make-test-model --drafter "$WORK/drafter-$ty.gguf" $DIMS --type "$ty" > "$LOGS/gen-drafter-$ty.log" 2>&1 &
        gen_pids="$gen_pids $!"
    fi
done
stamp "generating the 8B-sized models in the background (pids:$gen_pids)"

# ---- 3. tests -------------------------------------------------------------------------------
stamp "CUDA tests (ops vs the CPU reference, invariance, events, end to end)"
DFLASH_CLI=build/dflash timeout 300 ./build/dflash-tests cuda > "$LOGS/tests.log" 2>&1
trc=$?
grep -E "^(ok|FAIL|skip|fail)|FAIL|passed|cuda:|rel err" "$LOGS/tests.log" | head -60
TESTS_LINE=$(grep -E "passed, [0-9]+ failed" "$LOGS/tests.log" | tail -1)
SKIPS=$(grep -cE "^skip " "$LOGS/tests.log")
if [ $trc -ne 0 ]; then status=1; stamp "TESTS FAILED (rc $trc; log: $LOGS/tests.log)"; fi
# a skip here is a failure: this script runs on a GPU host, where every CUDA test must run
if [ "$SKIPS" -gt 0 ]; then
    status=1
    stamp "FAILED: $SKIPS CUDA test(s) skipped on a GPU host (a skip is not a pass):"
    sed -n '/skipped (not passed):/,/passed, /p' "$LOGS/tests.log"
fi

# ---- 4. benchmarks ----------------------------------------------------------------------------
stamp "waiting for the model writers"
for p in $gen_pids; do wait "$p" || { status=1; stamp "model generation failed: $(cat "$LOGS"/gen-*.log | tail -5)"; }; done
ls -la "$WORK"/*.gguf 2>/dev/null | awk '{printf "  %s %.2f GB\n", $9, $5/1e9}'
: > "$LOGS/results.txt"
for ty in q8_0 bf16; do
    stamp "benchmark $ty"
    if timeout 180 ./build/bench-cuda --target "$WORK/target-$ty.gguf" --drafter "$WORK/drafter-$ty.gguf" \
            --label "$ty" --gen 64 --ctx 2048 > "$LOGS/bench-$ty.log" 2>&1; then
        grep -v "^RESULT" "$LOGS/bench-$ty.log"
        grep "^RESULT" "$LOGS/bench-$ty.log" >> "$LOGS/results.txt"
    else
        status=1
        tail -20 "$LOGS/bench-$ty.log"
        stamp "BENCHMARK $ty FAILED"
    fi
done

if [ -s "$WORK/target-q8_0.gguf" ]; then
    stamp "dflash bench --device cuda (q8_0)"
    if ! timeout 150 ./build/dflash bench -m "$WORK/target-q8_0.gguf" -md "$WORK/drafter-q8_0.gguf" --device cuda -r 3 \
            -c 4096 > "$LOGS/dflash-bench-q8_0.log" 2>&1; then
        status=1
        stamp "dflash bench FAILED"
    fi
    cat "$LOGS/dflash-bench-q8_0.log" | tail -25
fi

# ---- 5. summary -------------------------------------------------------------------------------
echo
echo "== dflash CUDA device check: $(nvidia-smi --query-gpu=name --format=csv,noheader 2>/dev/null | head -1), $(( $(date +%s) - T0 )) s =="
echo "tests: ${TESTS_LINE:-none ran} (${SKIPS} skipped)"
awk '
function v(k,   i, kv) { for (i = 2; i <= NF; i++) { split($i, kv, "="); if (kv[1] == k) return kv[2] } return "-" }
BEGIN {
    printf "%-5s %8s %8s %5s %9s %8s %8s %10s %10s %9s %9s %5s %9s\n", "model", "tg t/s", "roofl.", "%roof", "verify16", "draft", "upload", "step dev", "step host", "wait host", "wait dev", "tau", "oracle"
    printf "%-5s %8s %8s %5s %9s %8s %8s %10s %10s %9s %9s %5s %9s\n", "", "", "t/s", "", "ms", "ms", "ms", "ms", "ms", "ms", "ms", "", "t/s"
}
/^RESULT/ {
    printf "%-5s %8s %8s %5s %9s %8s %8s %10s %10s %9s %9s %5s %9s\n", v("label"), v("tg_tok_s"), v("roofline_tok_s"), v("roofline_pct"), v("verify16_ms"), v("draft_ms"), v("upload_ms"), v("step_device_ms"), v("step_host_ms"), v("wait_host_ms"), v("wait_device_ms"), v("tau"), v("spec_oracle_tok_s")
}' "$LOGS/results.txt"
[ $status -eq 0 ] && echo "device check: OK" || echo "device check: FAILED (logs in $LOGS)"
exit $status
