#!/usr/bin/env bash
# The runs behind docs/RESULTS.md: every objective from the same start (offline all-MiniLM-L6-v2,
# mean pooling) on ../shared/data, with one fixed budget, then the seven-task table of evaluate.py.
#
#   bash benchmarks/results.sh DATA_DIR [ROW ...]     # e.g. bash benchmarks/results.sh ../shared/data
#   python benchmarks/results_table.py                # the markdown table of what has finished
#
# Budget (each row): 300 optimizer steps, bf16-mixed, seed 42 unless the row says otherwise,
# STS-B (and SICK-R) dev every 100 steps, the LAST checkpoint evaluated (the same rule as the
# sentence-transformers peers, which have no model selection here). Evaluation in bf16 autocast.
# Each row writes runs/results/ROW/{train.log,wall_s,command,eval.json}; a row whose eval.json exists
# is skipped and a row that finished training (wall_s) is only evaluated, so the script resumes
# where it stopped and never overwrites a result. Rows run cheapest-first among those the
# docs need, so a shorter session still fills most of the table.
set -euo pipefail
DATA=${1:?usage: results.sh DATA_DIR [ROW ...]}
shift
ONLY=" $* "
OUT=runs/results
export HF_HUB_OFFLINE=1 TRANSFORMERS_NO_ADVISORY_WARNINGS=1 TOKENIZERS_PARALLELISM=false
MODEL=sentence-transformers/all-MiniLM-L6-v2
NLI_FILES=(nli/snli.test.tsv nli/mnli.dev_matched.tsv)
NLI="[$DATA/${NLI_FILES[0]},$DATA/${NLI_FILES[1]}]"
WIKI=$DATA/wiki/wiki_sentences.txt
# Our rows are configs: the paper config, the overlay that points it at the offline model and
# ../shared/data, and the budget overlay (the overlays name ../shared/data; DATA is for the peers).
BUDGET=(--config configs/overlays/cpu_300_steps.yaml)
NLIDATA=(--config configs/overlays/offline_nli.yaml "${BUDGET[@]}")
STSB=(--config configs/overlays/offline_stsb.yaml "${BUDGET[@]}")
# SimCSE/DCLR keep the start model's mean pooling, so no MLP head (it sits on cls pooling)
SIMCSE_START=(--config configs/overlays/offline_wiki.yaml "${BUDGET[@]}" --config configs/overlays/start_pooling.yaml)

wanted() { [[ "$ONLY" == "  " || "$ONLY" == *" $1 "* ]]; }
last_ckpt() { ls -t "$OUT/$1"/base/seed*/train/lightning_logs/version_*/checkpoints/last.ckpt | head -n 1; }
evaluate() {  # evaluate ROW ARGS...: the seven tasks into ROW/eval.json
    local row=$1; shift
    python evaluate.py --sts_dir "$DATA/sts" --precision bf16 --output "$OUT/$row/eval.json" "$@" \
        >> "$OUT/$row/train.log" 2>&1 || echo "$(date +%T) $row: evaluation FAILED, see $OUT/$row/train.log"
}
todo() {  # todo ROW: 0 when ROW still needs training, 1 when done or only evaluation is left
    wanted "$1" || return 1
    [[ -e "$OUT/$1/eval.json" ]] && { echo "skip $1 (done)"; return 1; }
    [[ -e "$OUT/$1/wall_s" ]] && return 1
    mkdir -p "$OUT/$1"
    echo "$(date +%T) $1: training"
    return 0
}
timed() {  # timed ROW COMMAND...: run the training command, record its wall time and the command
    local row=$1; shift
    local start=$SECONDS
    if ! "$@" > "$OUT/$row/train.log" 2>&1; then
        echo "$(date +%T) $row: FAILED, see $OUT/$row/train.log (the next rows still run)"
        return 0
    fi
    echo $((SECONDS - start)) > "$OUT/$row/wall_s"
    printf '%q ' "$@" > "$OUT/$row/command"
}
needs_eval() { wanted "$1" && [[ -e "$OUT/$1/wall_s" && ! -e "$OUT/$1/eval.json" ]]; }
ours() {  # ours ROW SEED GRID-ARGS...: benchmarks/grid.py trains and evaluates it in $OUT/ROW/base/seedSEED
    local row=$1 seed=$2; shift 2
    wanted "$row" || return 0
    python benchmarks/grid.py --name "$row" --out "$OUT" --sts_dir "$DATA/sts" --seeds "$seed" "$@" \
        || echo "$(date +%T) $row: FAILED, see $OUT/$row/base/seed$seed/train.log (the next rows still run)"
    return 0
}
peer() {  # peer ROW OBJECTIVE [ARGS...]: sentence-transformers on the same rows and budget
    local row=$1 objective=$2; shift 2
    todo "$row" && timed "$row" python benchmarks/st_peer_train.py --objective "$objective" --data_dir "$DATA" \
        --output "$OUT/$row/model" --steps 300 --precision bf16 "$@"
    needs_eval "$row" && evaluate "$row" --model "$OUT/$row/model"
    return 0
}
film() {  # film ROW CONFIG [OVERRIDES...]: FILM has its own cap (solver steps), not the budget above
    local row=$1 config=$2; shift 2
    todo "$row" && timed "$row" python train.py --config "$config" --trainer.default_root_dir "$OUT/$row" \
        --data.init_args.sts_dir "$DATA/sts" "$@"
    needs_eval "$row" && evaluate "$row" --ckpt_path "$(last_ckpt "$row")"
    return 0
}

if wanted start && [[ ! -e "$OUT/start/eval.json" ]]; then
    mkdir -p "$OUT/start"; : > "$OUT/start/train.log"
    echo "python evaluate.py --model $MODEL" > "$OUT/start/command"
    evaluate start --model "$MODEL"
fi


ours sts_regression_s42 42 --config configs/sbert_sts_regression.yaml "${STSB[@]}"
peer st_cosine cosine --batch_size 16 --seed 42
ours nli_softmax 42 --config configs/sbert_nli_softmax.yaml "${NLIDATA[@]}"
peer st_softmax softmax --batch_size 16 --seed 42
ours triplet 42 --config configs/sbert_triplet.yaml "${NLIDATA[@]}"
peer st_triplet triplet --batch_size 16 --seed 42
ours mnr 42 --config configs/mnr_nli.yaml "${NLIDATA[@]}"
peer st_mnr mnr --batch_size 64 --seed 42
ours mnr_hard_negatives 42 --config configs/mnr_nli.yaml "${NLIDATA[@]}" --set data.init_args.view=triplets
ours simcse_unsup 42 --config configs/simcse_unsup.yaml "${SIMCSE_START[@]}"
COMPLEMENTARY="$(last_ckpt simcse_unsup 2>/dev/null || true)"
ours dclr_paper_s42 42 --config configs/dclr.yaml "${SIMCSE_START[@]}" --set "model.init_args.complementary_model=$COMPLEMENTARY"
ours dclr_official 42 --config configs/dclr.yaml --config configs/dclr/official.yaml --set model.init_args.loss=paper --set model.init_args.complementary_mode=eval "${SIMCSE_START[@]}" --set "model.init_args.complementary_model=$COMPLEMENTARY"
for seed in 43 44; do
    ours sts_regression_s$seed $seed --config configs/sbert_sts_regression.yaml "${STSB[@]}"
done
if wanted film_tfidf_cosine && [[ ! -e "$OUT/film_tfidf_cosine/eval.json" ]]; then
    mkdir -p "$OUT/film_tfidf_cosine"
    timed film_tfidf_cosine python benchmarks/tfidf_baseline.py --sts_dir "$DATA/sts" \
        --train_sources "$DATA/${NLI_FILES[0]}" "$DATA/${NLI_FILES[1]}" --output "$OUT/film_tfidf_cosine/eval.json"
fi
film film_tfidf configs/film_tfidf.yaml --data.init_args.train_sources "$NLI"
film film_frozen_encoder configs/film_frozen_encoder.yaml --data.init_args.train_sources "[$DATA/${NLI_FILES[0]}]"
for seed in 43 44; do
    ours dclr_paper_s$seed $seed --config configs/dclr.yaml "${SIMCSE_START[@]}" --set "model.init_args.complementary_model=$COMPLEMENTARY"
done
for seed in 43 44; do  # SimCSE's seeds too, so that DCLR's gain over it can be told from seed noise
    ours simcse_unsup_s$seed $seed --config configs/simcse_unsup.yaml "${SIMCSE_START[@]}"
done
ours film_deep_triplet 42 --config configs/film_deep_triplet.yaml "${NLIDATA[@]}"
echo "$(date +%T) all rows done"
