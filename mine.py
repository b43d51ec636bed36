"""Mine hard negatives for (anchor, positive) rows (installed: ``sentemb-mine``).

    python mine.py --inputs $SENTEMB_DATA/nli/train.tsv --model sentence-transformers/all-MiniLM-L6-v2 \
        --output mined.tsv --num_negatives 3 --range_max 30 --relative_margin 0.05

The command line lives in ``harness/mine_cli.py``, so that an installed package carries it; the work is
``datamodules.mining.mine_hard_negatives``.
"""
import sys

if __name__ == "__main__":
    from harness.mine_cli import main

    sys.exit(main())

from harness.mine_cli import main, mine  # noqa: E402,F401  (tests call them)
