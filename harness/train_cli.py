"""``train.py`` / ``sentemb-train``: train any objective, ``--config configs/X.yaml [--trainer.max_steps 200 ...]``."""
from __future__ import annotations

import torch

from .cli import SentenceCLI, check_output_dirs, exit_on_user_error, processes_warning, resolve_resume, warn


@exit_on_user_error
def main(args: list[str] | None = None) -> SentenceCLI:
    cli = SentenceCLI(args=args)
    cli.model.run_config = cli.parser.dump(cli.config, skip_none=False, skip_check=True)
    check_output_dirs(cli.trainer)
    if cli.trainer.is_global_zero and (message := processes_warning(cli.trainer)) is not None:
        warn(message)
    ckpt_path = resolve_resume(cli.config.ckpt_path, cli.trainer, cli.model)
    if cli.config.validate_first and ckpt_path is None:
        cli.trainer.validate(cli.model, datamodule=cli.datamodule, verbose=False)
    cli.trainer.fit(cli.model, datamodule=cli.datamodule, ckpt_path=ckpt_path)
    log_dir = cli.trainer.log_dir  # a collective call under DDP: every rank must make it
    if cli.trainer.is_global_zero:
        callback = cli.trainer.checkpoint_callback
        print(f"run directory:   {log_dir}")
        if callback.best_model_path:
            print(f"best checkpoint: {callback.best_model_path} ({callback.monitor} = "
                  f"{float(callback.best_model_score or 0):.2f})")
        else:  # it ended before its first validation (SaveFinalState said so and wrote last.ckpt)
            print(f"last checkpoint: {callback.last_model_path or 'none'} (no validation ran, so no best one)")
        print(f"tensorboard:     tensorboard --logdir {log_dir}")
    # Tear the process group down before exit: left to interpreter shutdown, a DDP rank's gloo threads
    # could outlive it and abort the process ("terminate called without an active exception").
    if torch.distributed.is_available() and torch.distributed.is_initialized():
        torch.distributed.destroy_process_group()
    return cli
