#!/bin/sh
# make_models.sh: retrains the embedded default pair from scratch and exports it to models/
# (`make models`; not run in CI). About 90 minutes of wall time on 2 cores. Every stage resumes
# from its checkpoint when rerun; delete train/work to start over.
# Needs: python3-torch python3-regex python3-numpy python3-matplotlib bible-kjv
#        libpython3.11-stdlib (Debian), run with /usr/bin/python3.
set -e
cd "$(dirname "$0")/.."
PY=/usr/bin/python3
W=train/work
export OMP_WAIT_POLICY=PASSIVE
mkdir -p $W models
$PY train/corpus.py --out $W
$PY train/bpe.py train --corpus $W/train_prose.txt $W/train_code.txt --vocab-size 4096 --out $W/vocab.json
$PY train/tokenize_corpus.py --work $W
[ -f $W/target_final.pt ] || $PY train/train_target.py --work $W --budget-min ${TARGET_MIN:-55}
$PY train/gen_drafter_data.py --work $W --budget-min ${GEN_MIN:-8}
[ -f $W/drafter_final.pt ] || $PY train/train_drafter.py --work $W --budget-min ${DRAFTER_MIN:-25}
$PY train/export_gguf.py --work $W --out models
$PY train/spec_eval.py --work $W --out models/spec_eval.json
$PY train/check_export.py --work $W --models models
$PY train/plot.py --work $W --out models/training.png
cp $W/corpus_stats.json models/corpus_stats.json
mkdir -p models/logs && cp $W/target_log.jsonl $W/drafter_log.jsonl models/logs/
if [ -x build/dflash ]; then $PY train/check_c.py --work $W --models models; fi
