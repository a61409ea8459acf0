#!/usr/bin/env bash
# Trains the EAGLE-style draft head for a target (issue 13, docs/draft.md): makes its venv (JAX on
# the CPU), generates self-distillation data with `specula` (Magpie), trains, exports one GGUF,
# checks the export against the training forward, and prints validation accuracy per draft depth.
#
# Usage: scripts/train_draft.sh [--toy] [--out DIR] [--model GGUF] [--specula BIN] [--samples N]
#                               [--prompt-samples N] [--feature-layers LIST] [--steps N] [--vocab N] [--depth K]
#                               [--seed S] [--regen] [-- TRAIN_ARGS...]
#   --toy     a tiny random target (tests/oracle/tiny_models.py), 120 short samples, 300 steps:
#             the whole pipeline in about a minute (CI runs it through tests/oracle/test_draft_pipeline.py)
#   --regen   regenerate the data even if DIR/data.spd exists (otherwise it is reused)
#   --prompt-samples N   also answer N chat prompts of tools/draft/prompts.py (code, arithmetic,
#             rewrites, lists...: the kinds Magpie rarely writes) into DIR/prompts.spd; 0 = none
#   --feature-layers LIST   the target's decoder blocks (0-based, comma-separated) whose residuals
#             the head reads beside the final hidden state (EAGLE-3's fused features); "" = none
# Outputs in DIR (default build/draft, or build/draft-toy): data.spd, prompts.jsonl, prompts.spd,
# draft.gguf, metrics.json, train.log, magpie.log. The last line on stdout is the metrics JSON.
set -euo pipefail
cd "$(dirname "$0")/.."
ROOT=$PWD
CACHE=${SPECULA_CACHE:-$HOME/.cache/specula}
BUILD=${SPECULA_BUILD:-$ROOT/build}
log() { printf '[train_draft] %s\n' "$*" >&2; }

TOY=0; OUT=""; MODEL=""; SPECULA=${SPECULA_BIN:-$BUILD/specula}; SAMPLES=""; STEPS=""; VOCAB=""; DEPTH=""; PSAMPLES=""
SEED=0; REGEN=0; EXTRA=(); FLAYERS=unset; VOCAB_GIVEN=0
while [ $# -gt 0 ]; do
  case $1 in
    --toy) TOY=1 ;;
    --out) OUT=$2; shift ;;
    --model) MODEL=$2; shift ;;
    --specula) SPECULA=$2; shift ;;
    --samples) SAMPLES=$2; shift ;;
    --prompt-samples) PSAMPLES=$2; shift ;;
    --feature-layers) FLAYERS=$2; shift ;;
    --steps) STEPS=$2; shift ;;
    --vocab) VOCAB=$2; VOCAB_GIVEN=1; shift ;;
    --depth) DEPTH=$2; shift ;;
    --seed) SEED=$2; shift ;;
    --regen) REGEN=1 ;;
    --) shift; EXTRA=("$@"); break ;;
    *) echo "unknown option $1 (see the header of $0)" >&2; exit 2 ;;
  esac
  shift
done

# --- 1. The venv (JAX CPU wheels; pip cache outside the tree) ---------------------------------
VENV=$BUILD/draft-venv
REQS=$ROOT/tools/draft/requirements.txt
if [ ! -x "$VENV/bin/python" ] || ! cmp -s "$REQS" "$VENV/.requirements"; then
  log "creating $VENV"
  python3 -m venv "$VENV"
  PIP_CACHE_DIR=$CACHE/pip-cache "$VENV/bin/pip" install -q --disable-pip-version-check -r "$REQS"
  cp "$REQS" "$VENV/.requirements"
fi
PY=$VENV/bin/python
export PYTHONPATH=$ROOT/tools${PYTHONPATH:+:$PYTHONPATH}
[ -x "$SPECULA" ] || { log "no specula program at $SPECULA: build it first (scripts/setup.sh)"; exit 1; }

# --- 2. Target and settings -------------------------------------------------------------------
if [ $TOY -eq 1 ]; then
  OUT=${OUT:-$BUILD/draft-toy}
  mkdir -p "$OUT"
  "$PY" "$ROOT/tests/oracle/tiny_models.py" "$OUT/target" q4_1_tied >&2
  MODEL=${MODEL:-$OUT/target/q4_1_tied/model.gguf}
  SAMPLES=${SAMPLES:-120}; STEPS=${STEPS:-300}; VOCAB=${VOCAB:-256}; DEPTH=${DEPTH:-3}; PSAMPLES=${PSAMPLES:-0}
  [ "$FLAYERS" = unset ] && FLAYERS=""
  GEN_ARGS=(--prompt-tokens 24 --response-tokens 64 --keep-unfinished-prompts)
  TRAIN_ARGS=(--window 64 --batch 8 --lr 3e-3 --log-every 50 --export-type Q8_0)
else
  OUT=${OUT:-$BUILD/draft}
  mkdir -p "$OUT"
  MODEL=${MODEL:-$CACHE/models/SmolLM2-135M-Instruct.Q4_1.gguf}
  # The shipped head's recipe (docs/draft.md, "The shipped head"): depth 4, 1,500 steps, EAGLE's
  # feature regression at weight 1, fused features of blocks 2 and 14 beside the final hidden
  # state, exported at Q4_1.
  SAMPLES=${SAMPLES:-3000}; STEPS=${STEPS:-1500}; VOCAB=${VOCAB:-8192}; DEPTH=${DEPTH:-4}; PSAMPLES=${PSAMPLES:-2400}
  [ "$FLAYERS" = unset ] && FLAYERS="2,14"
  GEN_ARGS=()
  TRAIN_ARGS=(--window 256 --batch 8 --feature-weight 1 --export-type Q4_1)
fi
[ -n "$FLAYERS" ] && GEN_ARGS+=(--feature-layers "$FLAYERS")
[ -f "$MODEL" ] || { log "no target model at $MODEL (scripts/setup.sh fetches the default one)"; exit 1; }

# --- 3. Data (Magpie: prompts and responses written by the target itself) --------------------
# `specula draft-data` batches the recipe (docs/draft.md); it never reads ../shared/data/prompts/.
DATA=$OUT/data.spd
if [ $REGEN -eq 1 ] || [ ! -s "$DATA" ]; then
  rm -f "$DATA"
  log "generating $SAMPLES sequences with $SPECULA draft-data (log: $OUT/magpie.log)"
  "$SPECULA" draft-data --model "$MODEL" --out "$DATA" --samples "$SAMPLES" --seed "$SEED" \
    --log "$OUT/magpie.log" "${GEN_ARGS[@]+"${GEN_ARGS[@]}"}"
else
  log "reusing $DATA (--regen to make it anew)"
fi
DATA_FILES=("$DATA")
# Chat prompts of the kinds Magpie rarely writes (tools/draft/prompts.py), answered by the target.
if [ "$PSAMPLES" -gt 0 ]; then
  PDATA=$OUT/prompts.spd
  if [ $REGEN -eq 1 ] || [ ! -s "$PDATA" ]; then
    rm -f "$PDATA"
    "$PY" -m draft.prompts --out "$OUT/prompts.jsonl" --count "$PSAMPLES" --seed 7
    log "answering $PSAMPLES chat prompts with $SPECULA draft-data (log: $OUT/prompts.log)"
    "$SPECULA" draft-data --model "$MODEL" --out "$PDATA" --samples "$PSAMPLES" --seed $(( SEED + 2 )) \
      --prompts "$OUT/prompts.jsonl" --log "$OUT/prompts.log" "${GEN_ARGS[@]+"${GEN_ARGS[@]}"}"
  else
    log "reusing $PDATA (--regen to make it anew)"
  fi
  DATA_FILES+=("$PDATA")
fi

# --- 4. Train, export, check ------------------------------------------------------------------
# A fine-tune (-- --init-from HEAD) keeps the head's vocabulary unless --vocab asks to grow it.
VOCAB_ARGS=(--vocab "$VOCAB")
if [ $VOCAB_GIVEN -eq 0 ] && [[ " ${EXTRA[*]+"${EXTRA[*]}"} " == *" --init-from"* ]]; then VOCAB_ARGS=(); VOCAB="the head's"; fi
log "training $STEPS steps, depth $DEPTH, reduced vocabulary $VOCAB (log: $OUT/train.log)"
"$PY" -m draft.train --target "$MODEL" --data "${DATA_FILES[@]}" --out "$OUT" "${VOCAB_ARGS[@]}" --depth "$DEPTH" \
  --steps "$STEPS" --seed "$SEED" "${TRAIN_ARGS[@]}" "${EXTRA[@]+"${EXTRA[@]}"}" > "$OUT/train.stdout"
log "checking $OUT/draft.gguf against the training forward"
"$PY" -m draft.check_export --target "$MODEL" --draft "$OUT/draft.gguf" --data "$DATA" \
  --depth "$(( DEPTH < 3 ? DEPTH : 3 ))" > "$OUT/check.json"
"$PY" - "$OUT" <<'PYEOF'
import json, pathlib, sys
out = pathlib.Path(sys.argv[1])
m = json.loads((out / "metrics.json").read_text())
m["export_check"] = json.loads((out / "check.json").read_text())
(out / "metrics.json").write_text(json.dumps(m, indent=1))
v = m["validation"]
for j, acc in enumerate(v["top1"], 1):
    extra = f", alpha >= {v['alpha_lower_bound'][j - 1]:.3f}" if "alpha_lower_bound" in v else ""
    print(f"[train_draft] depth {j}: validation top-1 {acc:.3f}{extra}", file=sys.stderr)
print(f"[train_draft] baseline top-1 {m['baseline_top1']:.3f}; {out / 'draft.gguf'}: {m['gguf_bytes']} bytes", file=sys.stderr)
print(json.dumps(m))
PYEOF
