#!/bin/sh
# ab-spec.sh: paired A/B of two dflash binaries on the embedded pair's speculative steps: for each
# of PAIRS held-out prompts (models/spec_eval.json, code and prose in turn) both binaries run
# `generate` at a fixed draft length (15, like the llama.cpp parity runs), 256 tokens, 2 threads,
# one right after the other; prints each binary's median ms per speculative step and the median
# and interquartile range of the per-prompt ratios A/B (> 1: B is faster). On a shared machine the
# absolute speed drifts by up to 2x within minutes; a pair of runs seconds apart sees the same
# conditions, so only the paired ratios mean anything, and an effect inside the interquartile
# range is not one. Outside CI.
# usage: tools/ab-spec.sh PAIRS BIN_A BIN_B [extra generate options]   (env MD: the drafter file)
set -e
cd "$(dirname "$0")/.."
[ $# -ge 3 ] || { sed -n '2,9p' "$0" | sed 's/^# \{0,1\}//' >&2; exit 2; }
N=$1 A=$2 B=$3
shift 3
[ "$A" != "$B" ] || { echo "ab-spec: BIN_A and BIN_B must be different paths (copy one)" >&2; exit 2; }
i=0
while [ "$i" -lt "$N" ]; do
    dom=code
    [ $((i % 2)) -eq 1 ] && dom=prose
    P=$(python3 -c "import json,sys; print(json.load(open('models/spec_eval.json'))['domains'][sys.argv[1]]['samples'][int(sys.argv[2])]['prompt'])" "$dom" $((i / 2 % 12)))
    for b in "$A" "$B"; do
        "$b" generate --draft-max 15 --draft-min 0 -t 2 -n 256 --ignore-eos -p "$P" --json -md "${MD:-models/drafter.gguf}" "$@" 2>/dev/null |
            python3 -c "import json,sys; d=json.load(sys.stdin); print(sys.argv[1], '%.4f' % (d['t_gen_ms'] / d['n_steps']))" "$b"
    done
    i=$((i + 1))
done | python3 -c "
import statistics as st, sys
d = {}
for line in sys.stdin:
    b, v = line.split()
    d.setdefault(b, []).append(float(v))
a, b = list(d)
for k in (a, b):
    print('%s: median %.3f ms per step over %d runs' % (k, st.median(d[k]), len(d[k])))
r = sorted(x / y for x, y in zip(d[a], d[b]))
q = len(r) // 4
print('paired A/B: median %.3f, interquartile %.3f-%.3f' % (st.median(r), r[q], r[-q - 1]))
"
