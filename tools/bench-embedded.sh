#!/bin/sh
# bench-embedded.sh: `dflash bench` of the embedded pair on held-out prompts (the first N of each
# domain in models/spec_eval.json, text the models never saw), printing each run's speculative vs
# autoregressive ratio (same run, same prompt) and tau, then the median ratio per domain.
# Usage: tools/bench-embedded.sh [N (4)] [dflash bench options, e.g. -t 2 --draft-min 0]
set -e
cd "$(dirname "$0")/.."
N=${1:-4}
[ $# -gt 0 ] && shift
DFLASH=${DFLASH:-build/dflash}
OUT=$(mktemp)
trap 'rm -f "$OUT"' EXIT
for dom in code prose; do
    i=0
    while [ "$i" -lt "$N" ]; do
        prompt=$(python3 -c "import json,sys; print(json.load(open('models/spec_eval.json'))['domains'][sys.argv[1]]['samples'][int(sys.argv[2])]['prompt'])" "$dom" "$i")
        line=$("$DFLASH" bench --pp 16 --tg 8 -r 3 "$@" -p "$prompt" 2>/dev/null | grep 'spec-gen (device features) ' || true)
        ratio=$(echo "$line" | sed -n 's/.*| \([0-9.]*\)x ar; tau \([0-9.]*\);.*/\1 \2/p')
        [ -n "$ratio" ] || { echo "bench-embedded: no spec-gen row for $dom prompt $i" >&2; exit 1; }
        echo "$dom $i $ratio" | tee -a "$OUT"
        i=$((i + 1))
    done
done
python3 - "$OUT" <<'PY'
import statistics, sys
rows = [l.split() for l in open(sys.argv[1]) if l.strip()]
for dom in ("code", "prose"):
    r = [float(x[2]) for x in rows if x[0] == dom]
    t = [float(x[3]) for x in rows if x[0] == dom]
    print(f"{dom}: median spec/ar {statistics.median(r):.2f}x (min {min(r):.2f}, max {max(r):.2f}), median tau {statistics.median(t):.2f}, {len(r)} prompts")
PY
