"""``mine.py`` / ``sentemb-mine``: hard negatives for (anchor, positive) rows, written as a TSV that
``NLIDataModule(view="triplets", num_negatives=n)`` trains on (``datamodules.mining`` does the work).

    python mine.py --inputs pairs.tsv --model sentence-transformers/all-MiniLM-L6-v2 --output mined.tsv \\
        --num_negatives 3 --range_max 30 --relative_margin 0.05
"""
from __future__ import annotations

import os
import sys
from pathlib import Path
from typing import Any, Optional

from datamodules.mining import mine_hard_negatives

from .cli import exit_on_user_error
from .config_files import run_function_command


def mine(record: Optional[str] = None, **options: Any) -> None:
    """The command: ``mine_hard_negatives`` with its progress on standard error, then its summary (and, with
    ``record``, the summary as a JSON record)."""
    if record is not None and Path(record).exists() and not Path(record).is_dir():
        raise ValueError(f"--record {record}: not a folder; give a folder for the summary's records")
    summary = mine_hard_negatives(**options, progress=sys.stderr)
    print(summary.format())
    print(f"mined rows written to {options['output']}")
    if record is not None:
        from .measurement import in_clone, write_record

        inputs = options["inputs"]
        folder = Path(record)
        write_record(folder.name, summary.figures(), root=folder.parent, notes={  # paths in the clone: relative
            "inputs": in_clone([inputs])[0] if isinstance(inputs, str) else in_clone([str(p) for p in inputs]),
            "model": options["model"], "output": in_clone([str(options["output"])])[0],
            "options": {k: v for k, v in options.items() if k not in ("inputs", "model", "output")}})


RECORD_HELP = ("also write the summary as a JSON record in this folder (one file per run, named by date and processor, "
               "never overwritten): the options, inputs and model, the machine, versions, commit and date, and every "
               "count and quantile")


EXAMPLES = """\
examples:
  {prog} --inputs pairs.tsv --model sentence-transformers/all-MiniLM-L6-v2 --output mined.tsv \\
      --num_negatives 3 --range_max 30 --relative_margin 0.05
  # the entailment pairs of NLI files; docs/TRAINING.md ("Mined hard negatives") has every option
  {prog} --inputs "[$SENTEMB_DATA/nli/snli.test.tsv,$SENTEMB_DATA/nli/mnli.dev_matched.tsv]" \\
      --model RUN.ckpt --output runs/mined/nli.tsv --num_negatives 3 --relative_margin 0.05
"""


def main(args: list[str] | None = None) -> None:
    """``python mine.py ...`` / ``sentemb-mine ...``: options as ``mine_hard_negatives``' arguments; an unknown or
    abbreviated option is one error line, as in train.py."""
    _run_cli(args)


@exit_on_user_error
def _run_cli(args: list[str] | None) -> None:
    prog = os.path.basename(sys.argv[0]) or "mine.py"
    summary = " ".join((mine_hard_negatives.__doc__ or "").split("\n\n")[0].split())
    run_function_command(mine_hard_negatives, prog, summary + "\n\n" + EXAMPLES.format(prog=prog), args,
                         skip={"progress"}, run=mine, extra={"--record": {"type": Optional[str], "help": RECORD_HELP}})

