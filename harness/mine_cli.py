"""``mine.py`` / ``sentemb-mine``: hard negatives for (anchor, positive) rows, written as a TSV that
``NLIDataModule(view="triplets", num_negatives=n)`` trains on (``datamodules.mining`` does the work).

    python mine.py --inputs pairs.tsv --model sentence-transformers/all-MiniLM-L6-v2 --output mined.tsv \\
        --num_negatives 3 --range_max 30 --relative_margin 0.05
"""
from __future__ import annotations

import os
import sys
from typing import Literal, Optional, Union

from datamodules.mining import Sampling, mine_hard_negatives

from .cli import exit_on_user_error
from .config_files import run_function_command


@exit_on_user_error
def mine(
    inputs: Union[str, list[str]],
    model: str,
    output: str,
    num_negatives: int = 3,
    range_min: int = 0,
    range_max: int = 10,
    sampling: Sampling = "top",
    absolute_margin: Optional[float] = None,
    relative_margin: Optional[float] = None,
    max_score: Optional[float] = None,
    pooling: Optional[str] = None,
    batch_size: int = 64,
    chunk_size: int = 4096,
    precision: Literal["32", "bf16", "16"] = "32",
    device: Optional[str] = None,
    seed: int = 0,
) -> None:
    """Mine hard negatives for every (anchor, positive) row: exact cosine search over the distinct positives,
    then the filters (positives and exact duplicates never; the rank window; max_score; the absolute and the
    relative margin), then ``num_negatives`` per row. Prints what each filter removed and the scores kept.

    Args:
        inputs: pair files (anchor, positive columns) or NLI files (premise, hypothesis, label: the entailment
            pairs); one file or a list ``[a.tsv,b.tsv]``.
        model: the encoder that scores: a ``*.ckpt`` of this project, a model directory or a hub name.
        output: the TSV to write (anchor, positive, negative_1 ... negative_n); never overwritten.
        num_negatives: negatives per row; a row with fewer candidates left is not written.
        range_min: skip the best range_min candidates (positives and duplicates set aside first).
        range_max: consider candidates up to this rank (exclusive).
        sampling: top (the best ranked left) or random (a uniform draw among those left).
        absolute_margin: drop a candidate scoring above the positive's score minus this.
        relative_margin: drop a candidate scoring above (1 - this) x the positive's score (NV-Retriever's
            positive-aware filter: 0.05 keeps what scores at most 95 % of the positive).
        max_score: drop a candidate whose cosine with the anchor is above this.
        pooling: pooling for a model without its own (default mean).
        batch_size: sentences per encoding batch.
        chunk_size: rows and corpus sentences per block of the exact search (memory ~ chunk_size^2 scores).
        precision: 32, or bf16/16 autocast for the encoder.
        device: cpu, cuda, ... (default: cuda when available).
        seed: the draw of sampling random.
    """
    summary = mine_hard_negatives(
        [inputs] if isinstance(inputs, str) else list(inputs), model, output, num_negatives=num_negatives,
        range_min=range_min, range_max=range_max, sampling=sampling, absolute_margin=absolute_margin,
        relative_margin=relative_margin, max_score=max_score, pooling=pooling, batch_size=batch_size,
        chunk_size=chunk_size, precision=precision, device=device, seed=seed, progress=sys.stderr)
    print(summary.format())
    print(f"mined rows written to {output}")


EXAMPLES = """\
examples:
  {prog} --inputs pairs.tsv --model sentence-transformers/all-MiniLM-L6-v2 --output mined.tsv \\
      --num_negatives 3 --range_max 30 --relative_margin 0.05
  # the entailment pairs of NLI files; docs/TRAINING.md ("Mined hard negatives") has every option
  {prog} --inputs "[$SENTEMB_DATA/nli/snli.test.tsv,$SENTEMB_DATA/nli/mnli.dev_matched.tsv]" \\
      --model RUN.ckpt --output runs/mined/nli.tsv --num_negatives 3 --relative_margin 0.05
"""


def main(args: list[str] | None = None) -> None:
    """``python mine.py ...`` / ``sentemb-mine ...``: options as ``mine``'s arguments; an unknown or
    abbreviated option is one error line, as in train.py."""
    _run_cli(args)


@exit_on_user_error
def _run_cli(args: list[str] | None) -> None:
    prog = os.path.basename(sys.argv[0]) or "mine.py"
    summary = " ".join((mine.__doc__ or "").split("\n\n")[0].split())
    run_function_command(mine, prog, summary + "\n\n" + EXAMPLES.format(prog=prog), args)

