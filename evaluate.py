"""SentEval-exact STS evaluation of a checkpoint or a model (installed: ``sentemb-evaluate``).

    python evaluate.py --ckpt_path RUN.ckpt --sts_dir DIR [--tasks [sts12,stsb]] [--output results.json]
    python evaluate.py --model sentence-transformers/all-MiniLM-L6-v2 --sts_dir DIR
    python evaluate.py --ckpt_path RUN.ckpt --export DIR [--sts_dir DIR]   # a sentence-transformers directory

The command line lives in ``harness/evaluate_cli.py``, so that an installed package carries it.
"""
import sys

if __name__ == "__main__":
    from harness.launch import evaluate as launch

    sys.exit(launch())

from harness.evaluate_cli import evaluate, load_encoder, main, parse_tasks  # noqa: E402,F401
