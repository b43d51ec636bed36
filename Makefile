# The two commands of the README. Both install what they need first.
# torch comes first and pinned: on a CPU machine torch==2.13.0 is a local CPU wheel, while a
# bare `torch` requirement would pull a multi-GB CUDA build.
PYTHON ?= python3
PIP := $(PYTHON) -m pip
STAMP := .make-installed
export HF_HUB_OFFLINE := 1
export TRANSFORMERS_NO_ADVISORY_WARNINGS := 1
export TOKENIZERS_PARALLELISM := false

.PHONY: install quickstart test clean

$(STAMP): setup.cfg pyproject.toml
	$(PIP) install --quiet torch==2.13.0
	$(PIP) install --quiet -e ".[dev]"
	touch $(STAMP)

install: $(STAMP)

# The table is a smoke test on the fixture sample; the last lines say so and give the real command.
quickstart: $(STAMP)
	$(PYTHON) train.py --config configs/quickstart.yaml
	@ckpt="$$(ls -t runs/quickstart/lightning_logs/*/checkpoints/best-*.ckpt | head -n 1)"; \
	echo "$(PYTHON) evaluate.py --sts_dir configs/quickstart --ckpt_path $$ckpt"; \
	$(PYTHON) evaluate.py --sts_dir configs/quickstart --ckpt_path "$$ckpt" && \
	echo "" && \
	echo "This table was computed on the sample rows (configs/quickstart, a few dozen pairs per task):" && \
	echo "it shows that the pipeline runs, and is not comparable with the papers' figures." && \
	echo "To score this model on the real STS data (SentEval's STS data from the hub, or --sts_dir DIR):" && \
	echo "  python evaluate.py --ckpt_path $$ckpt" && \
	echo "The run's files (checkpoint, TensorBoard logs, config.yaml; remove with make clean):" && \
	du -sh "$$(dirname "$$(dirname "$$ckpt")")" "$$ckpt"

test: $(STAMP)
	$(PYTHON) -m pytest -q -ra tests

clean:
	rm -rf $(STAMP) runs lightning_logs .pytest_cache
