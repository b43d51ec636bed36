"""Train any objective: ``python train.py --config configs/X.yaml [--trainer.max_steps 200 ...]``
(installed: ``sentemb-train``). The command line lives in ``harness/train_cli.py``, so that an
installed package carries it; ``harness/launch.py`` first checks, in a second, that a hub the run
needs can be reached."""
import sys

if __name__ == "__main__":
    from harness.launch import train

    sys.exit(train())

from harness.train_cli import SentenceCLI, main  # noqa: E402,F401  (tests and notebooks call them)
