#!/usr/bin/env bash
# bench-llama-cpu.sh: llama.cpp's side of the CPU rows of `dflash bench` on the same files, for a
# side-by-side table (outside CI; dflash's side is `dflash bench -m MODEL -md DRAFT -t THREADS`):
#   llama-bench pp512 / pp16 / pp128 / tg64 (mean of REPS runs, llama-bench's own figure), and
#   llama-speculative-simple with a fixed draft length of 3 and of 15 (--spec-draft-n-min =
#   --spec-draft-n-max = k, no probability cut, greedy, the prompt of `dflash bench`, -n 64).
# Prints one markdown table: row, llama.cpp tok/s, ms, notes.
#
# usage: tools/bench-llama-cpu.sh MODEL.gguf [DRAFT.gguf] [THREADS (2)]
#   env: LLAMA_BIN (folder of llama-bench and llama-speculative-simple; default
#        /work/llama-peer/src/build/bin), REPS (llama-bench repetitions, default 5),
#        N_PREDICT (speculative tokens, default 64), SPEC_TYPE (--spec-type; default: llama.cpp
#        infers it from the drafter's metadata: draft-dflash, draft-dspark, ...)
#
# The tools: build llama-bench and llama-speculative-simple from the llama.cpp source shipped in
# node-llama-cpp's llama/gitRelease.bundle (tests/peer/node_modules/node-llama-cpp, installed by
# tools/install-deps.sh): `git clone` the bundle into a scratch folder outside this repository and
# `cmake -B build -DCMAKE_BUILD_TYPE=Release -DGGML_NATIVE=ON -DLLAMA_CURL=OFF && cmake --build
# build --target llama-bench llama-speculative-simple`; never in CI.
#
# Speculative rows: tok/s is llama.cpp's "decoded N tokens in T seconds" (the steps after the
# prompt); ms per step is T over its steps (n_predict - n_accept: each step commits its accepted
# drafts plus one token); tau = n_predict / steps. llama.cpp shortens the draft as the -n budget
# runs out and drops a draft shorter than --spec-draft-n-min, so its last steps (about k of them
# at zero acceptance) verify fewer than k drafts: n_drafted in the notes shows how many were
# verified (k x steps when every step drafted k). dflash's spec rows draft k every step.
set -euo pipefail
[ $# -ge 1 ] && [ $# -le 3 ] || { sed -n '2,14p' "$0" | sed 's/^# \{0,1\}//' >&2; exit 2; }
MODEL=$1
DRAFT=${2:-}
THREADS=${3:-2}
BIN=${LLAMA_BIN:-/work/llama-peer/src/build/bin}
REPS=${REPS:-5}
NPRED=${N_PREDICT:-64}
[ -f "$MODEL" ] || { echo "bench-llama-cpu: no model file $MODEL" >&2; exit 1; }
[ -z "$DRAFT" ] || [ -f "$DRAFT" ] || { echo "bench-llama-cpu: no drafter file $DRAFT" >&2; exit 1; }
for t in llama-bench llama-speculative-simple; do
    [ -x "$BIN/$t" ] || { echo "bench-llama-cpu: $BIN/$t not found (set LLAMA_BIN; see the comment at the top)" >&2; exit 1; }
done
# the default prompt of `dflash bench`
PROMPT=$'def fibonacci(n):\n    """Return the n-th Fibonacci number."""\n    if n < 2:\n        return n\n'
TMP=$(mktemp -d)
trap 'rm -rf "$TMP"' EXIT

# llama-bench: CSV, one line per test; avg_ts = mean tokens/s over REPS runs (after its warm-up)
"$BIN/llama-bench" -m "$MODEL" -p 512,16,128 -n 64 -t "$THREADS" -r "$REPS" -o csv >"$TMP/lb.csv" 2>"$TMP/lb.err" ||
    { echo "bench-llama-cpu: llama-bench failed:" >&2; tail -20 "$TMP/lb.err" >&2; exit 1; }
rows=$(awk -F, -v reps="$REPS" '
    NR == 1 { for (i = 1; i <= NF; i++) { gsub(/"/, "", $i); col[$i] = i }; next }
    {
        for (i = 1; i <= NF; i++) gsub(/"/, "", $i)
        np = $col["n_prompt"]; ng = $col["n_gen"]; ts = $col["avg_ts"]; sd = $col["stddev_ts"]
        if (np > 0) printf "| pp%d | %.2f | %.3f | llama-bench, mean of %d (sd %.2f tok/s); ms per batch of %d |\n", np, ts, np * 1000 / ts, reps, sd, np
        else printf "| tg%d | %.2f | %.3f | llama-bench, mean of %d (sd %.2f tok/s); ms per token |\n", ng, ts, 1000 / ts, reps, sd
    }' "$TMP/lb.csv")
[ -n "$rows" ] || { echo "bench-llama-cpu: llama-bench printed no results" >&2; exit 1; }

spec_row() { # $1 = k
    local k=$1 log="$TMP/spec$1.err" args
    args=(-m "$MODEL" -md "$DRAFT" --spec-draft-n-max "$k" --spec-draft-n-min "$k" --spec-draft-p-min 0
          -p "$PROMPT" -n "$NPRED" --temp 0 -t "$THREADS" -c 2048)
    [ -z "${SPEC_TYPE:-}" ] || args+=(--spec-type "$SPEC_TYPE")
    "$BIN/llama-speculative-simple" "${args[@]}" >/dev/null 2>"$log" ||
        { echo "bench-llama-cpu: llama-speculative-simple (draft $k) failed:" >&2; tail -20 "$log" >&2; return 1; }
    awk -v k="$k" '
        /decoded +[0-9]+ tokens in/ { for (i = 1; i <= NF; i++) { if ($i == "decoded") n = $(i + 1); if ($i == "in") s = $(i + 1) } }
        /n_drafted *=/ { drafted = $NF }
        /n_accept *=/ { acc = $NF }
        /adding speculative implementation/ { type = $NF; gsub(/\047/, "", type) }
        /clamping to/ { clamp = $NF }
        END {
            if (n == "" || s == "" || acc == "") { print "bench-llama-cpu: no statistics in the log" > "/dev/stderr"; exit 1 }
            steps = n - acc
            printf "| spec d%d | %.2f | %.3f | llama-speculative-simple (%s%s), ms per step; tau %.2f; %d tokens in %d steps, n_drafted %d, n_accept %d |\n",
                k, n / s, s * 1000 / steps, type, clamp != "" ? ", draft clamped to " clamp : "", n / steps, n, steps, drafted, acc
        }' "$log"
}

echo "llama.cpp on $MODEL${DRAFT:+ + $DRAFT}, $THREADS threads ($(date -u '+%Y-%m-%d %H:%M UTC'), $BIN)"
echo
echo "| row | llama.cpp tok/s | ms | notes |"
echo "|---|---:|---:|---|"
echo "$rows"
if [ -n "$DRAFT" ]; then
    spec_row 3
    spec_row 15
fi
