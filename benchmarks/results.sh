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
# Each row writes runs/results/ROW/{train.log,eval.json,wall_s}; a row whose eval.json exists is
# skipped, so the script resumes where it stopped and never overwrites a result.
set -euo pipefail
DATA=${1:?usage: results.sh DATA_DIR [ROW ...]}
shift
ONLY=" $* "
OUT=runs/results
export HF_HUB_OFFLINE=1 TRANSFORMERS_NO_ADVISORY_WARNINGS=1 TOKENIZERS_PARALLELISM=false
MODEL=sentence-transformers/all-MiniLM-L6-v2
NLI="[$DATA/nli/snli.test.tsv,$DATA/nli/mnli.dev_matched.tsv]"
WIKI=$DATA/wiki/wiki_sentences.txt
BUDGET=(--trainer.max_steps 300 --trainer.max_epochs -1 --trainer.check_val_every_n_epoch null
        --trainer.val_check_interval 100 --trainer.precision bf16-mixed
        --model.init_args.encoder.init_args.model_name $MODEL
        --model.init_args.encoder.init_args.pooling mean --data.init_args.sts_dir $DATA/sts)

wanted() { [[ "$ONLY" == "  " || "$ONLY" == *" $1 "* ]]; }
last_ckpt() { ls -t "$OUT/$1"/lightning_logs/version_*/checkpoints/last.ckpt | head -n 1; }
evaluate() {  # evaluate ROW ARGS...: the seven tasks into ROW/eval.json
    local row=$1; shift
    python evaluate.py --sts_dir "$DATA/sts" --precision bf16 --output "$OUT/$row/eval.json" "$@" \
        >> "$OUT/$row/train.log" 2>&1
}
ours() {  # ours ROW SEED CONFIG [OVERRIDES...]
    local row=$1 seed=$2 config=$3; shift 3
    wanted "$row" || return 0
    [[ -e "$OUT/$row/eval.json" ]] && { echo "skip $row (done)"; return 0; }
    mkdir -p "$OUT/$row"
    echo "$(date +%T) $row: training"
    local start=$SECONDS
    python train.py --config "$config" --seed_everything "$seed" --trainer.default_root_dir "$OUT/$row" \
        "${BUDGET[@]}" "$@" > "$OUT/$row/train.log" 2>&1
    echo $((SECONDS - start)) > "$OUT/$row/wall_s"
    printf '%s\n' "python train.py --config $config --seed_everything $seed ${BUDGET[*]} $*" > "$OUT/$row/command"
    evaluate "$row" --ckpt_path "$(last_ckpt "$row")"
}
peer() {  # peer ROW OBJECTIVE [ARGS...]: sentence-transformers on the same rows and budget
    local row=$1 objective=$2; shift 2
    wanted "$row" || return 0
    [[ -e "$OUT/$row/eval.json" ]] && { echo "skip $row (done)"; return 0; }
    mkdir -p "$OUT/$row"
    echo "$(date +%T) $row: training"
    local start=$SECONDS
    python benchmarks/st_peer_train.py --objective "$objective" --data_dir "$DATA" --output "$OUT/$row/model" \
        --steps 300 --precision bf16 "$@" > "$OUT/$row/train.log" 2>&1
    echo $((SECONDS - start)) > "$OUT/$row/wall_s"
    printf '%s\n' "python benchmarks/st_peer_train.py --objective $objective --data_dir $DATA --steps 300 --precision bf16 $*" \
        > "$OUT/$row/command"
    evaluate "$row" --model "$OUT/$row/model"
}

if wanted start && [[ ! -e "$OUT/start/eval.json" ]]; then
    mkdir -p "$OUT/start"; : > "$OUT/start/train.log"
    echo "python evaluate.py --model $MODEL" > "$OUT/start/command"
    evaluate start --model "$MODEL"
fi

STSB=(--data.init_args.train_source "$DATA/sts/stsb.train.tsv")
NLIDATA=(--data.init_args.train_sources "$NLI")
SIMCSE_START=(--model.init_args.encoder.init_args.max_seq_length 32 --data.init_args.train_source "$WIKI")
simcse_ckpt() { last_ckpt simcse_unsup; }

ours sts_regression_s42 42 configs/sbert_sts_regression.yaml "${STSB[@]}"
peer st_cosine cosine --batch_size 16 --seed 42
ours nli_softmax 42 configs/sbert_nli_softmax.yaml "${NLIDATA[@]}"
peer st_softmax softmax --batch_size 16 --seed 42
ours triplet 42 configs/sbert_triplet.yaml "${NLIDATA[@]}"
peer st_triplet triplet --batch_size 16 --seed 42
ours mnr 42 configs/mnr_nli.yaml "${NLIDATA[@]}"
peer st_mnr mnr --batch_size 64 --seed 42
ours mnr_hard_negatives 42 configs/mnr_nli.yaml "${NLIDATA[@]}" --data.init_args.view triplets
ours simcse_unsup 42 configs/simcse_unsup.yaml "${SIMCSE_START[@]}"
for seed in 42 43 44; do
    ours dclr_paper_s$seed $seed configs/dclr_bert_base.yaml "${SIMCSE_START[@]}" \
        --data.init_args.per_device_batch_size 64 --model.init_args.complementary_model "$(simcse_ckpt)"
    [[ $seed == 42 ]] && ours dclr_official 42 configs/dclr_official.yaml "${SIMCSE_START[@]}" \
        --data.init_args.per_device_batch_size 64 --model.init_args.complementary_model "$(simcse_ckpt)"
done
for seed in 43 44; do
    ours sts_regression_s$seed $seed configs/sbert_sts_regression.yaml "${STSB[@]}"
done
ours film_deep_triplet 42 configs/film_deep_triplet.yaml "${NLIDATA[@]}"

# FILM: no transformer training, its own step cap (solver steps), so not the budget above.
NLI_FILES=(nli/snli.test.tsv nli/mnli.dev_matched.tsv)
film() {  # film ROW CONFIG [OVERRIDES...]
    local row=$1 config=$2; shift 2
    wanted "$row" || return 0
    [[ -e "$OUT/$row/eval.json" ]] && { echo "skip $row (done)"; return 0; }
    mkdir -p "$OUT/$row"
    echo "$(date +%T) $row: training"
    local start=$SECONDS
    python train.py --config "$config" --trainer.default_root_dir "$OUT/$row" --data.init_args.sts_dir "$DATA/sts" \
        "$@" > "$OUT/$row/train.log" 2>&1
    echo $((SECONDS - start)) > "$OUT/$row/wall_s"
    printf '%s\n' "python train.py --config $config --data.init_args.sts_dir $DATA/sts $*" > "$OUT/$row/command"
    evaluate "$row" --ckpt_path "$(last_ckpt "$row")"
}
if wanted film_tfidf_cosine && [[ ! -e "$OUT/film_tfidf_cosine/eval.json" ]]; then
    mkdir -p "$OUT/film_tfidf_cosine"
    echo "python benchmarks/tfidf_baseline.py --sts_dir $DATA/sts --train_sources $DATA/${NLI_FILES[0]} $DATA/${NLI_FILES[1]}" \
        > "$OUT/film_tfidf_cosine/command"
    start=$SECONDS
    python benchmarks/tfidf_baseline.py --sts_dir "$DATA/sts" --train_sources "$DATA/${NLI_FILES[0]}" "$DATA/${NLI_FILES[1]}" \
        --output "$OUT/film_tfidf_cosine/eval.json" > "$OUT/film_tfidf_cosine/train.log" 2>&1
    echo $((SECONDS - start)) > "$OUT/film_tfidf_cosine/wall_s"
fi
film film_tfidf configs/film_tfidf.yaml --data.init_args.train_sources "$NLI"
film film_frozen_encoder configs/film_frozen_encoder.yaml --data.init_args.train_sources "[$DATA/${NLI_FILES[0]}]"
echo "$(date +%T) all rows done"
