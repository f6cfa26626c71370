#!/bin/sh
# device-check.sh: the CUDA backend on a real GPU, in one go, under one deadline (8 minutes).
#   0. prints the host, the GPU, the driver and the CUDA toolkit (runtime) versions; stops at once
#      when there is no GPU or the driver is too old for the toolkit (CUDA 13 needs >= 580);
#   1. builds with CUDA=1 (library, CLI, tests, the CUDA benchmark program), then checks that the
#      build sees a usable device (stops at once if not);
#   2. generates Qwen3-8B-sized random models in the background (36 layers, n_embd 4096, 32 heads,
#      8 kv heads, head_dim 128, n_ff 12288, vocab 151936, tied head) in q8_0 and bf16, each with
#      a 5-layer DFlash drafter (block 16), 4 writers in parallel;
#   3. meanwhile runs every CUDA test (`dflash-tests --list`, the cuda_* ones), each in its own
#      process: every op against the CPU reference, batch invariance, queues/events, end to end
#      (CUDA vs CPU logits incl. arch llama, greedy speculative output == target-alone greedy output
#      on the GPU with the device and the host feature paths). A failing test is run again with
#      CUDA_LAUNCH_BLOCKING=1, so that an asynchronous fault is reported at the launch of its op.
#      A skipped test is a failure here (this is a GPU host: every CUDA test must run);
#   4. waits (bounded) for the model writers, then benchmarks both models (tests/bench/bench_cuda.c):
#      tg tok/s against the HBM roofline (weight bytes per token / 4.8 TB/s), verification of 16
#      tokens, draft time, spec step time with device vs host features, host vs device-side event
#      wait, feature bytes through host memory; skipped, saying so, when less than a minute is left;
#   5. `dflash bench --device cuda` on the q8_0 pair when time remains (the CLI's own figures);
#   6. writes the table to bench/results/<gpu>-<date>.md (and $OUT) and prints it.
# Every step's time limit is cut to what is left of the overall deadline.
# Usage: tools/device-check.sh [WORKDIR]   (default $DFLASH_CHECK_DIR or /tmp/dflash-devcheck;
# needs ~30 GB of disk there). Every step's log goes to WORKDIR/logs; when $OUT is set (the device
# runner brings back at most 8 files from it) the logs are bundled there on exit, whatever the
# exit: env.log, build.log, tests.log, gen.log, bench.log and the table. Building needs cc, make,
# nvcc and the PCRE2 headers; without pcre2.h on the machine, a folder .devdeps/ (include/pcre2.h,
# lib/libpcre2-8.so*) carried into the checkout is used. Environment: DFLASH_CHECK_BUDGET
# (seconds for everything, default 465),
# DFLASH_CHECK_BW (GB/s for the roofline, default 4800: H200), DFLASH_CHECK_ANYWAY=1 (go on
# without a GPU, to check this script itself: builds and runs the tests, which then skip and
# fail; no models, no benchmarks). Exit status 0 when the build, every CUDA test and both
# benchmarks succeeded.
set -u
cd "$(dirname "$0")/.." || exit 1
WORK=${1:-${DFLASH_CHECK_DIR:-/tmp/dflash-devcheck}}
LOGS=$WORK/logs
OUTDIR=${OUT:-}
mkdir -p "$WORK" "$LOGS" || exit 1
rm -f "$LOGS"/*.log "$LOGS"/results.txt
MD=""
# collect: bundles the logs into $OUT (at most 8 files come back from there), on every exit
collect() {
    [ -n "$OUTDIR" ] && [ -d "$OUTDIR" ] || return 0
    cat "$LOGS/env.log" "$LOGS/nvidia-smi.log" "$LOGS/probe.log" > "$OUTDIR/env.log" 2>/dev/null
    [ -f "$LOGS/build.log" ] && cp "$LOGS/build.log" "$OUTDIR/build.log"
    for f in "$LOGS"/test-*.log; do [ -f "$f" ] && { echo "==== $(basename "$f")"; cat "$f"; }; done > "$OUTDIR/tests.log" 2>/dev/null
    for f in "$LOGS"/gen-*.log; do [ -f "$f" ] && { echo "==== $(basename "$f")"; cat "$f"; }; done > "$OUTDIR/gen.log" 2>/dev/null
    for f in "$LOGS"/bench-*.log "$LOGS"/dflash-bench-*.log "$LOGS/results.txt"; do
        [ -f "$f" ] && { echo "==== $(basename "$f")"; cat "$f"; }
    done > "$OUTDIR/bench.log" 2>/dev/null
    [ -n "$MD" ] && [ -f "$MD" ] && cp "$MD" "$OUTDIR/"
    return 0
}
trap collect EXIT
JOBS=$(nproc 2>/dev/null || echo 8)
BUDGET=${DFLASH_CHECK_BUDGET:-465}
BW=${DFLASH_CHECK_BW:-4800}
ANYWAY=${DFLASH_CHECK_ANYWAY:-0}
T0=$(date +%s)
DEADLINE=$((T0 + BUDGET))
stamp() { echo "[device-check +$(( $(date +%s) - T0 ))s] $*"; }
left() { echo $(( DEADLINE - $(date +%s) )); }
# limit CAP [RESERVE]: a step's time limit: CAP seconds, cut to what is left minus RESERVE (>= 1)
limit() {
    l=$(( $(left) - ${2:-10} ))
    [ "$l" -gt "$1" ] && l=$1
    [ "$l" -lt 1 ] && l=1
    echo "$l"
}
status=0
fail() { status=1; stamp "FAILED: $*"; }

# ---- 0. versions --------------------------------------------------------------------------------
{ date -u; uname -a; nvidia-smi; command -v nvcc && nvcc --version; /usr/local/cuda/bin/nvcc --version; } > "$LOGS/env.log" 2>&1
stamp "host: $(uname -m), $JOBS cpus, $(free -g 2>/dev/null | awk '/Mem:/{print $2" GiB RAM"}'), disk $(df -h "$WORK" | awk 'NR==2{print $4" free"}') in $WORK; deadline in ${BUDGET}s"
NVCC=$(command -v nvcc 2>/dev/null || { [ -x /usr/local/cuda/bin/nvcc ] && echo /usr/local/cuda/bin/nvcc; })
TK_VER=""
if [ -n "$NVCC" ]; then
    TK_VER=$("$NVCC" --version | sed -n 's/.*release \([0-9][0-9.]*\).*/\1/p')
    echo "  CUDA toolkit (the runtime the build links): $TK_VER ($NVCC)"
else
    echo "  CUDA toolkit: nvcc not found"
fi
GPU_NAME=""
DRV_VER=""
if command -v nvidia-smi >/dev/null 2>&1 && nvidia-smi -L > "$LOGS/nvidia-smi.log" 2>&1 && grep -q "^GPU" "$LOGS/nvidia-smi.log"; then
    nvidia-smi --query-gpu=name,memory.total,driver_version,clocks.max.sm,clocks.max.mem --format=csv,noheader | sed 's/^/  gpu: /'
    GPU_NAME=$(nvidia-smi --query-gpu=name --format=csv,noheader | head -1)
    DRV_VER=$(nvidia-smi --query-gpu=driver_version --format=csv,noheader | head -1)
    echo "  driver $DRV_VER (supports CUDA $(nvidia-smi 2>/dev/null | sed -n 's/.*CUDA Version: *\([0-9.]*\).*/\1/p' | head -1))"
    TK_MAJOR=${TK_VER%%.*}
    DRV_MAJOR=${DRV_VER%%.*}
    if [ -n "$TK_MAJOR" ] && [ "$TK_MAJOR" -ge 13 ] 2>/dev/null && [ "$DRV_MAJOR" -lt 580 ] 2>/dev/null; then
        fail "driver $DRV_VER is too old for a CUDA $TK_VER build (CUDA 13 needs a driver >= 580)"
        exit 1
    fi
else
    echo "  gpu: none ($(head -1 "$LOGS/nvidia-smi.log" 2>/dev/null || echo "nvidia-smi not found"))"
    if [ "$ANYWAY" != 1 ]; then
        fail "no NVIDIA GPU or driver on this host: the device check needs one (DFLASH_CHECK_ANYWAY=1 checks the script itself)"
        exit 1
    fi
    stamp "DFLASH_CHECK_ANYWAY=1: going on without a GPU (the tests will skip, which counts as failing)"
fi

# ---- 1. build ------------------------------------------------------------------------------------
if [ -z "$NVCC" ]; then
    if [ -x build/bench-cuda ] && [ -x build/dflash-tests ] && [ -x build/dflash ]; then
        stamp "nvcc not found: using the binaries already in build/ (they need libcudart and libcublas at run time)"
    else
        fail "nvcc not found and no CUDA build in build/: install the CUDA toolkit (nvcc, cuBLAS)"
        exit 1
    fi
    : > "$LOGS/build.log"
else
    for tool in make cc; do
        command -v "$tool" > /dev/null 2>&1 || { fail "$tool not found: building needs make and a C compiler"; exit 1; }
    done
    # the PCRE2 headers (the tokenizer's pre-tokenizer regexes): the machine's, or a carried .devdeps/
    set --
    if ! printf '#define PCRE2_CODE_UNIT_WIDTH 8\n#include <pcre2.h>\n' | cc -E -x c - > /dev/null 2>&1; then
        if [ -f .devdeps/include/pcre2.h ] && ls .devdeps/lib/libpcre2-8.so* > /dev/null 2>&1; then
            echo "  pcre2.h not installed: using the carried .devdeps/"
            [ -e .devdeps/lib/libpcre2-8.so ] || ln -s "$(basename "$(ls .devdeps/lib/libpcre2-8.so.* | head -1)")" .devdeps/lib/libpcre2-8.so
            set -- EXTRA_CFLAGS="-I$PWD/.devdeps/include" LDFLAGS="-L$PWD/.devdeps/lib -Wl,-rpath,$PWD/.devdeps/lib"
        else
            fail "the PCRE2 headers are missing (pcre2.h; Debian/Ubuntu: libpcre2-dev), and no .devdeps/ was carried (include/pcre2.h, lib/libpcre2-8.so*)"
            exit 1
        fi
    fi
    stamp "build (make CUDA=1 -j$JOBS, at most $(limit 240 60)s)"
    if ! timeout -k 5 "$(limit 240 60)" make CUDA=1 -j"$JOBS" "$@" all build/dflash-tests bench-cuda > "$LOGS/build.log" 2>&1; then
        tail -40 "$LOGS/build.log"
        fail "build (log: $LOGS/build.log)"
        exit 1
    fi
    grep -E "^dflash: (CUDA|nvcc)" "$LOGS/build.log" | sed 's/^/  /'
    echo "  build warnings: $(grep -ciE "warning" "$LOGS/build.log")"
fi
# does the build see a device? (the runtime's own answer, e.g. a driver older than the runtime)
HAVE_DEV=0
DFLASH_CLI=build/dflash timeout -k 5 60 ./build/dflash-tests cuda_op_rejects_host_memory > "$LOGS/probe.log" 2>&1
if grep -qE "^ok +cuda_op_rejects_host_memory" "$LOGS/probe.log"; then
    HAVE_DEV=1
    sed -n 's/^ *cuda: /  device: /p' "$LOGS/probe.log"
else
    echo "  device probe: $(grep -E "SKIP|FAIL" "$LOGS/probe.log" | head -1 | sed 's/^ *//')"
    if [ "$ANYWAY" != 1 ]; then
        fail "the CUDA build sees no usable device (log: $LOGS/probe.log)"
        exit 1
    fi
fi

# ---- 2. models (background) ------------------------------------------------------------------------
# Each writer: its pid in gen-NAME.pid, its exit status in gen-NAME.rc when done (polled below, so
# the waits are bounded and a late writer can be stopped).
DIMS="--n-embd 4096 --n-layer 36 --n-head 32 --n-head-kv 8 --head-dim 128 --n-ff 12288 --n-vocab 151936 --n-ctx-train 40960 --draft-layers 5 --block-size 16 --target-layers 2,10,18,26,34 --seed 7"
gen_start() { # gen_start NAME KIND(target|drafter) TYPE
    rm -f "$WORK/gen-$1.rc" "$WORK/gen-$1.pid"
    if [ -s "$WORK/$1.gguf" ]; then echo 0 > "$WORK/gen-$1.rc"; return; fi
    (
        ./build/dflash make-test-model --"$2" "$WORK/$1.gguf" $DIMS --type "$3" > "$LOGS/gen-$1.log" 2>&1 &
        echo $! > "$WORK/gen-$1.pid"
        wait $!
        echo $? > "$WORK/gen-$1.rc"
    ) &
}
# gen_wait SECONDS NAME...: 0 when every writer finished within SECONDS (each with status 0)
gen_wait() {
    end=$(( $(date +%s) + $1 )); shift
    while :; do
        pending=0
        for n in "$@"; do [ -f "$WORK/gen-$n.rc" ] || pending=1; done
        [ $pending -eq 0 ] && break
        [ "$(date +%s)" -ge "$end" ] && return 1
        sleep 1
    done
    for n in "$@"; do [ "$(cat "$WORK/gen-$n.rc")" = 0 ] || return 2; done
    return 0
}
gen_stop() { # stops the writers still running (their own pids, written by gen_start)
    for n in "$@"; do
        if [ ! -f "$WORK/gen-$n.rc" ] && [ -s "$WORK/gen-$n.pid" ]; then kill "$(cat "$WORK/gen-$n.pid")" 2>/dev/null; fi
    done
}
MODELS="target-q8_0 drafter-q8_0 target-bf16 drafter-bf16"
if [ $HAVE_DEV = 1 ]; then
    for ty in q8_0 bf16; do
        gen_start "target-$ty" target "$ty"
        gen_start "drafter-$ty" drafter "$ty"
    done
    stamp "generating the 8B-sized models in the background ($MODELS)"
else
    stamp "no device: no models, no benchmarks"
fi

# ---- 3. tests, one process each ------------------------------------------------------------------
TESTS=$(./build/dflash-tests --list | grep '^cuda_')
N_TESTS=$(echo "$TESTS" | grep -c .)
stamp "$N_TESTS CUDA tests, each in its own process"
n_ok=0; n_bad=0
for name in $TESTS; do
    if [ "$(left)" -lt 40 ]; then
        n_bad=$((n_bad + 1))
        fail "$name not run: only $(left)s left before the deadline"
        continue
    fi
    lim=$(limit 150 30)
    DFLASH_CLI=build/dflash timeout -k 5 "$lim" ./build/dflash-tests "$name" > "$LOGS/test-$name.log" 2>&1
    rc=$?
    line=$(grep -E "^(ok|FAIL|skip) +$name " "$LOGS/test-$name.log" | head -1)
    case "$line" in
    ok*)
        n_ok=$((n_ok + 1))
        echo "  $line"
        grep -E "^    " "$LOGS/test-$name.log" | head -12
        ;;
    skip*)
        n_bad=$((n_bad + 1))
        echo "  $line"
        fail "$name skipped on a GPU host (a skip is not a pass): $(sed -n "s/^  $name: //p" "$LOGS/test-$name.log" | head -1)"
        ;;
    *)
        n_bad=$((n_bad + 1))
        [ $rc -eq 124 ] && why="timed out after ${lim}s" || why="rc $rc"
        echo "  ${line:-FAIL $name (no result line)} ($why)"
        grep -E "FAIL|cuda backend|error|Assert|abort" "$LOGS/test-$name.log" | head -15 | sed 's/^/    /'
        fail "$name (log: $LOGS/test-$name.log)"
        if [ "$(left)" -ge 40 ]; then
            lim=$(limit 150 30)
            stamp "re-running $name with CUDA_LAUNCH_BLOCKING=1 (at most ${lim}s): a fault then names its launch"
            CUDA_LAUNCH_BLOCKING=1 DFLASH_CLI=build/dflash timeout -k 5 "$lim" ./build/dflash-tests "$name" \
                > "$LOGS/test-$name-blocking.log" 2>&1
            echo "    rc $? with CUDA_LAUNCH_BLOCKING=1:"
            grep -E "FAIL|cuda backend|error|Assert|abort|^(ok|skip) " "$LOGS/test-$name-blocking.log" | head -15 | sed 's/^/    /'
        fi
        ;;
    esac
done
TESTS_LINE="$n_ok of $N_TESTS passed, $n_bad failed, skipped or not run"
stamp "tests: $TESTS_LINE"

# ---- 4. benchmarks --------------------------------------------------------------------------------
: > "$LOGS/results.txt"
BENCH_NOTE=""
if [ $HAVE_DEV = 1 ]; then
    for ty in q8_0 bf16; do
        wait_s=$(( $(left) - 70 ))
        if [ $wait_s -lt 0 ]; then wait_s=0; fi
        stamp "waiting for the $ty model writers (at most ${wait_s}s)"
        gen_wait "$wait_s" "target-$ty" "drafter-$ty"
        wrc=$?
        if [ $wrc -eq 1 ]; then
            gen_stop $MODELS
            fail "the $ty models were not written in time ($(left)s left): no benchmark from here on"
            BENCH_NOTE="$BENCH_NOTE from $ty on: models not written in time;"
            break
        elif [ $wrc -eq 2 ]; then
            fail "model generation ($ty): $(tail -3 "$LOGS"/gen-*-"$ty".log)"
            BENCH_NOTE="$BENCH_NOTE $ty: model generation failed;"
            continue
        fi
        ls -la "$WORK/target-$ty.gguf" "$WORK/drafter-$ty.gguf" | awk '{printf "  %s %.2f GB\n", $9, $5/1e9}'
        if [ "$(left)" -lt 60 ]; then
            fail "benchmark $ty skipped: only $(left)s left (< 60 s) before the deadline"
            BENCH_NOTE="$BENCH_NOTE $ty: skipped, less than a minute left;"
            continue
        fi
        lim=$(limit 180 15)
        stamp "benchmark $ty (at most ${lim}s)"
        if timeout -k 5 "$lim" ./build/bench-cuda --target "$WORK/target-$ty.gguf" --drafter "$WORK/drafter-$ty.gguf" \
                --label "$ty" --gen 64 --ctx 2048 --bandwidth "$BW" > "$LOGS/bench-$ty.log" 2>&1; then
            grep -v "^RESULT" "$LOGS/bench-$ty.log"
            grep "^RESULT" "$LOGS/bench-$ty.log" >> "$LOGS/results.txt"
        else
            tail -20 "$LOGS/bench-$ty.log"
            fail "benchmark $ty (log: $LOGS/bench-$ty.log)"
            BENCH_NOTE="$BENCH_NOTE $ty: benchmark failed;"
        fi
    done
    gen_stop $MODELS

    if [ -s "$WORK/target-q8_0.gguf" ] && [ "$(left)" -ge 75 ]; then
        lim=$(limit 90 15)
        stamp "dflash bench --device cuda (q8_0, at most ${lim}s)"
        if ! timeout -k 5 "$lim" ./build/dflash bench -m "$WORK/target-q8_0.gguf" -md "$WORK/drafter-q8_0.gguf" --device cuda -r 3 \
                -c 4096 > "$LOGS/dflash-bench-q8_0.log" 2>&1; then
            fail "dflash bench (log: $LOGS/dflash-bench-q8_0.log)"
        fi
        tail -25 "$LOGS/dflash-bench-q8_0.log"
    else
        stamp "dflash bench --device cuda skipped ($(left)s left)"
    fi
fi

# ---- 5. the table ------------------------------------------------------------------------------------
DATE=$(date -u +%Y-%m-%d)
if [ $HAVE_DEV = 1 ]; then
    SLUG=$(echo "$GPU_NAME" | sed 's/^NVIDIA //' | awk '{print tolower($1)}')
    MD="bench/results/${SLUG:-gpu}-$DATE.md"
    mkdir -p bench/results
else
    MD="$LOGS/table-no-device.md" # a run without a device records nothing in the tree
fi
COMMIT=$(git rev-parse --short HEAD 2>/dev/null || echo unknown)
{
    echo "# dflash CUDA device check: ${GPU_NAME:-no GPU}, $DATE"
    echo
    echo "tools/device-check.sh at commit $COMMIT; driver ${DRV_VER:-none}, CUDA toolkit ${TK_VER:-none}; $(( $(date +%s) - T0 )) s in all."
    echo "Tests: $TESTS_LINE."
    [ -n "$BENCH_NOTE" ] && echo "Benchmarks:$BENCH_NOTE"
    echo
    echo "Generated Qwen3-8B-dimension models (36 layers, n_embd 4096, n_ff 12288, vocab 151936, tied head), 5-layer DFlash drafter (block 16); bench-cuda medians."
    echo "Roofline: weight bytes read per token / $BW GB/s. Step: one speculative step (draft + verify 16), real drafter."
    echo "Handoff: target work, event, drafter reads; total ms (host-blocked ms) with a host wait vs a device-side wait."
    echo
    awk '
    function v(k,   i, kv) { for (i = 2; i <= NF; i++) { split($i, kv, "="); if (kv[1] == k) return kv[2] } return "-" }
    BEGIN {
        print "| model | weights GB/token | tg tok/s | roofline tok/s | % roofline | verify16 ms | draft ms | step ms, device features | step ms, host features | step / AR step | handoff, host wait ms | handoff, device wait ms | host bytes/step, device path | host bytes/step, host path | tau | oracle tok/s |"
        print "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|"
    }
    /^RESULT/ {
        printf "| %s | %s | %s | %s | %s | %s | %s | %s (%s) | %s | %s | %s (%s) | %s (%s) | %s | %s | %s | %s |\n", v("label"), v("weights_gb"), v("tg_tok_s"), v("roofline_tok_s"), v("roofline_pct"), v("verify16_ms"), v("draft_ms"), v("step_device_ms"), v("path_device"), v("step_host_ms"), v("step_vs_ar"), v("wait_host_ms"), v("wait_host_blocked_ms"), v("wait_device_ms"), v("wait_device_blocked_ms"), v("host_bytes_device"), v("host_bytes_host"), v("tau"), v("spec_oracle_tok_s")
    }' "$LOGS/results.txt"
    [ -s "$LOGS/results.txt" ] || echo "(no benchmark ran: no figures)"
} > "$MD"
echo
cat "$MD"
echo
echo "(table written to $MD$([ -n "$OUTDIR" ] && echo " and \$OUT/$(basename "$MD")"); logs in $LOGS)"
[ $status -eq 0 ] && echo "device check: OK ($(( $(date +%s) - T0 )) s)" || echo "device check: FAILED ($(( $(date +%s) - T0 )) s)"
exit $status
