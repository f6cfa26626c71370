#!/bin/bash
# parity.sh: DFlash2 draft counts, llama-speculative-simple vs dflash, at temperature 0 with a
# fixed draft length and a p_min cut (the cut reads the walk's softmax at every walked position,
# so equal counts over a run mean the lattice scores along the walked path agree).
#
# Both engines draft the first block from the prompt's last token (dflash since main 459fc68).
# With no accepted drafts (random weights) step k of both is in the same state, and llama's
# n_drafted = sum_k min(ours[k], budget_k), budget_k = n_predict - k - 1 being how
# speculative-simple truncates a draft near the end (no truncation when the budget is <= 0).
# With accepted drafts the script only reports the totals (tools/parity-llama-spec.mjs compares
# step by step).
#
# usage: bench/dflash2_parity/parity.sh TARGET DRAFTER "PROMPT" P_MIN [N_PREDICT] [N_DRAFT]
# needs: build/libdflash.a (make), LLAMA_BIN (default /work/llama-peer/src/build/bin); never in CI.
set -e
ROOT=$(cd "$(dirname "$0")/../.." && pwd)
LLAMA_BIN=${LLAMA_BIN:-/work/llama-peer/src/build/bin}
T=$1; D=$2; PT=$3; P=$4; N=${5:-41}; K=${6:-7}
STEPS=$ROOT/build/dflash2_parity_steps
if [ ! -x "$STEPS" ] || [ "$ROOT/bench/dflash2_parity/steps.c" -nt "$STEPS" ] || [ "$ROOT/build/libdflash.a" -nt "$STEPS" ]; then
    cc -std=c11 -O1 -I"$ROOT/include" "$ROOT/bench/dflash2_parity/steps.c" "$ROOT/build/libdflash.a" -lm -lpthread \
       $( [ -d /usr/local/cuda/lib64 ] && echo "-L/usr/local/cuda/lib64 -Wl,-rpath,/usr/local/cuda/lib64 -lcudart -ldl -lstdc++" ) \
       -o "$STEPS"
fi
IDS=$("$ROOT/build/dflash" generate -m "$T" -p "$PT" -n 1 --no-spec --json 2>/dev/null |
      python3 -c "import json,sys; print(','.join(map(str, json.load(sys.stdin)['prompt_tokens'])))")
# (its log goes through a logging thread and the last lines are now and then lost at exit: retry)
run_llama() {
    local r=""
    for _ in 1 2 3 4 5; do
        r=$("$LLAMA_BIN/llama-speculative-simple" -m "$T" -md "$D" --spec-type draft-dflash -p "$PT" -n "$1" --temp 0 \
            --spec-draft-n-max "$K" --spec-draft-p-min "$P" -t 1 -c 512 2>&1 | grep -E 'n_drafted|n_accept ' | awk '{print $NF}' | tr '\n' ' ')
        [ "$(echo $r | wc -w)" = 2 ] && break
    done
    echo "$r"
}
LL=$(run_llama "$N")
C0=-
OURS=$("$STEPS" "$T" "$D" "$P" $((N + 2)) "$K" "$IDS")
python3 - "$LL" "$C0" "$OURS" "$N" "$P" <<'PY'
import sys
ll, c0, ours, n, p = sys.argv[1].split(), sys.argv[2].split(), sys.argv[3].split()[1:], int(sys.argv[4]), sys.argv[5]
steps = [tuple(map(int, s.split(":"))) for s in ours]
if len(ll) < 2 or not c0:
    sys.exit("llama-speculative-simple printed no counts")
if int(ll[1]) != 0 or any(a for _, a in steps[:n + 1]):
    print("p_min %s: drafts were accepted (llama %s, ours %d): the flows are not step-aligned" % (p, ll[1], sum(a for _, a in steps[:n])))
    sys.exit(0)
tr = lambda c, b: c if b <= 0 else min(c, b)
tot = sum(tr(c, n - 1 - j) for j, (c, _) in enumerate(steps[:n + 1]))
print("p_min %s: llama n_drafted %s n_accept %s | dflash (aligned) n_drafted %d %s" %
      (p, ll[0], ll[1], tot, "EQUAL" if tot == int(ll[0]) else "DIFFERENT"))
PY
