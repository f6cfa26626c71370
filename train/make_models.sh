#!/bin/sh
# make_models.sh: rebuilds the embedded default pair and its three drafters and exports them to
# models/ (`make models`; not run in CI). Every stage resumes from its checkpoint when rerun;
# delete train/work to start over.
#
# The committed target is two runs: run 1 from scratch (55 min, float32) and run 2 continued from
# it (45 min, bfloat16 autocast). By default this script reproduces run 2 from run 1's weights,
# the target.gguf of commit 8e4fc2b (TARGET_INIT=path/to/that.gguf; e.g.
# `git show 8e4fc2b:models/target.gguf > /tmp/target-run1.gguf`); FROM_SCRATCH=1 runs both runs.
# The tokenizer is read from models/target.gguf when it exists (the committed vocabulary, which
# the C tests depend on), else trained with bpe.py. Then: drafter data (the target's greedy
# continuations), the DFlash drafter (warm-started from DRAFTER_INIT when set, e.g. the DFlash
# drafter of commit 8e4fc2b as the committed one was; else from the target's layers), DSpark and DFlash2 (both
# warm-started from the new DFlash drafter), export, held-out tau, checks. About 2 hours on 2 cores.
# Needs: python3-torch python3-regex python3-numpy python3-matplotlib bible-kjv
#        libpython3.11-stdlib (Debian), run with /usr/bin/python3.
set -e
cd "$(dirname "$0")/.."
PY=/usr/bin/python3
W=train/work
export OMP_WAIT_POLICY=PASSIVE
mkdir -p $W models
$PY train/corpus.py --out $W
if [ -f models/target.gguf ] && [ -z "$RETRAIN_BPE" ]; then
    $PY train/from_gguf.py vocab --gguf models/target.gguf --out $W/vocab.json
else
    $PY train/bpe.py train --corpus $W/train_prose.txt $W/train_code.txt --vocab-size 4096 --out $W/vocab.json
fi
$PY train/tokenize_corpus.py --work $W
if [ ! -f $W/target_final.pt ]; then
    if [ -n "$FROM_SCRATCH" ]; then
        [ -f $W/target_run1_final.pt ] || $PY train/train_target.py --work $W --name target_run1 --budget-min ${TARGET1_MIN:-55}
        INIT="--init-ckpt $W/target_run1_final.pt"
    else
        INIT="--init-gguf ${TARGET_INIT:?set TARGET_INIT to run 1s target GGUF, or FROM_SCRATCH=1}"
    fi
    $PY train/train_target.py --work $W $INIT --bf16 --budget-min ${TARGET_MIN:-45} --steps 100000 \
        --batch-tokens 8192 --lr 1e-3 --warmup 50 --min-lr-frac 0.05 --long-frac 0.7 --eval-min 3
fi
$PY train/gen_drafter_data.py --work $W --budget-min ${GEN_MIN:-6} --batch 64
if [ ! -f $W/drafter_final.pt ]; then
    DINIT=""
    [ -n "$DRAFTER_INIT" ] && DINIT="--init-gguf $DRAFTER_INIT"
    $PY train/train_drafter.py --work $W --family dflash --target-layers 1,3,5 $DINIT --bf16 \
        --budget-min ${DRAFTER_MIN:-14} --steps 100000 --lr 1.5e-3 --seqs-per-step 8
fi
for fam in dspark dflash2; do
    [ -f $W/drafter_${fam}_final.pt ] || $PY train/train_drafter.py --work $W --family $fam --target-layers 1,3,5 \
        --init-ckpt $W/drafter_final.pt --bf16 --budget-min ${VARIANT_MIN:-12} --steps 100000 --lr 1e-3 \
        --seqs-per-step 8 --threads 1
done
$PY train/export_gguf.py --work $W --out models
$PY train/spec_eval.py --work $W --out models/spec_eval.json --dspark-p-min 0,0.2,0.5
$PY train/check_export.py --work $W --models models
$PY train/check_variants.py --work $W --models models --family dspark
$PY train/check_variants.py --work $W --models models --family dflash2
$PY train/plot.py --work $W --out models/training.png
cp $W/corpus_stats.json models/corpus_stats.json
mkdir -p models/logs
for f in target_run1_log target_log drafter_log drafter_dspark_log drafter_dflash2_log; do
    [ -f $W/$f.jsonl ] && cp $W/$f.jsonl models/logs/
done
if [ -x build/dflash ]; then $PY train/check_c.py --work $W --models models; fi
if [ -n "$LLAMA_BIN" ]; then $PY train/check_llama.py --work $W --models models --llama-bin "$LLAMA_BIN"; fi
