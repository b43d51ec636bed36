"""The command line shared by train.py: LightningCLI with the project's defaults, and clear errors."""
from __future__ import annotations

import functools
import os
import sys
from argparse import ArgumentError
import tempfile
import warnings
from datetime import timedelta
from typing import Callable, Optional

import yaml
from lightning.fabric.plugins import CheckpointIO
from lightning.pytorch.callbacks import ModelCheckpoint
from lightning.pytorch.cli import LightningCLI, SaveConfigCallback
from lightning.pytorch.strategies import DDPStrategy, StrategyRegistry
from lightning.pytorch.utilities import rank_zero_info

from datamodules import SentenceDataModule
from datamodules.io import DataError
from encoders.hub import ModelResolutionError
from lightning_modules.base import SentenceEmbeddingModule

from .allocator import keep_freed_memory
from .arguments import (HELP_HINT, CommandLineError, explain, for_installed, help_formatter, join_negative_values,
                        resolve_config_args)
from .checkpoint import AtomicCheckpointIO, CheckpointError, CheckpointWriteError, load_checkpoint, resume_checkpoint
from .checkpointing import PeriodicCheckpoint, SaveFinalState, checkpoint_dirs
from .config_files import check_config_files
from .exact_resume import RandomState, ResumedEpochPosition
from .nonfinite import NonFiniteLossError, StopOnNonFiniteLoss
from .preemption import Preemption
from .rendezvous import RendezvousDDP, RendezvousError


def quiet_expected_warnings() -> None:
    """Silence the warnings a run of this CLI raises by design. Installed when a CLI is built, not when this
    module is imported: pytest (and any ``warnings.catch_warnings`` block) restores the filters after the import,
    and the warnings would come back for every later run of the same process."""
    # Every DataModule of the CLI is a SentenceDataModule, which restores its place in the epoch
    # itself (its state_dict); Lightning only knows stateful DataLoaders and would warn on every resume.
    warnings.filterwarnings("ignore", message="You're resuming from a checkpoint that ended before the epoch ended")
    # A run that ends before its first validation has no val/ figure at all; SaveFinalState says so in one line
    # and writes last.ckpt (a monitor naming a key that validation does not log still warns: other val/ figures
    # exist).
    warnings.filterwarnings("ignore", message=r"`ModelCheckpoint\(monitor='val/[^']*'\)` could not find the monitored "
                                              r"key in the returned metrics: \[(?![^\]]*'val/)")
    # Every rank scores the whole dev set and logs the same figures: there is nothing to synchronise.
    warnings.filterwarnings("ignore", message=r"It is recommended to use `self.log\('val/")


class SaveConfig(SaveConfigCallback):
    """Lightning's SaveConfigCallback (never overwrites a run's ``config.yaml``), except that a run may find
    its own config there: a requeued SLURM job keeps its job id, so Lightning logs it into the same version
    directory, and it continues that run. The same config: nothing is written. The same config on another
    device layout (a job requeued with another task count): ``config.yaml`` stays the first run's, and this
    run's is kept beside it as ``config-restart<N>.yaml``. Anything else is refused, as Lightning does."""

    LAYOUT_KEYS = ("devices", "num_nodes")  # of trainer: what a requeue may change and the run continue

    def setup(self, trainer, pl_module, stage: str) -> None:
        if not self.already_saved and self.save_to_log_dir and not self.overwrite:
            log_dir = trainer.log_dir  # a broadcast: every rank takes part, once (never inside is_global_zero)
            path = os.path.join(log_dir, self.config_filename)
            verdict = None
            if trainer.is_global_zero and os.path.isfile(path):
                with open(path) as f:
                    saved = yaml.safe_load(f)
                mine = yaml.safe_load(self.parser.dump(self.config, skip_none=False))
                verdict = "same" if saved == mine else "layout" if self._layout_only(saved, mine) else None
                if verdict == "layout":
                    n = 1
                    while os.path.exists(os.path.join(log_dir, f"config-restart{n}.yaml")):
                        n += 1
                    with open(os.path.join(log_dir, f"config-restart{n}.yaml"), "w") as f:
                        yaml.safe_dump(mine, f, sort_keys=False)
            if trainer.strategy.broadcast(verdict) is not None:
                self.already_saved = True
                return
        super().setup(trainer, pl_module, stage)

    @classmethod
    def _layout_only(cls, saved: dict, mine: dict) -> bool:
        def without_layout(config: dict) -> dict:
            trainer = {k: v for k, v in (config.get("trainer") or {}).items() if k not in cls.LAYOUT_KEYS}
            return {**config, "trainer": trainer}

        return without_layout(saved) == without_layout(mine)


class SentenceCLI(LightningCLI):
    """``python train.py --config configs/X.yaml [--key value ...]``.

    Any objective (``model.class_path``) and DataModule (``data.class_path``) of the project;
    the best checkpoint is kept by ``val/stsb_spearman`` (``--checkpoint.monitor`` changes it).
    A typo in a key or a wrong type fails before any work, naming the key.

    Every run also gets: ``last.ckpt`` refreshed every 30 minutes of training
    (``--last_checkpoint.*``), a checkpoint and a clean exit on SIGTERM/SIGUSR1 (``Preemption``),
    a stop at the first non-finite loss, random states in checkpoints, checkpoints written
    atomically and read with ``weights_only=True``, and under DDP a bounded wait for a dead rank
    (``--ddp_timeout_minutes``).
    """

    EXAMPLES = """\
Train the quickstart (offline, its sample rows ship with the package), a paper's setting with any key
overridden, or one offline on local data:

  python train.py --config configs/quickstart.yaml
  python train.py --config configs/sbert_sts_regression.yaml --trainer.max_steps 200 --model.init_args.lr 3e-5
  python train.py --config configs/simcse_unsup.yaml --config configs/overlays/offline_wiki.yaml

Installed from a wheel, the same command is `sentemb-train`, and configs/NAME.yaml names the shipped
configs from any directory (`sentemb-configs` lists them). A key that does not exist is refused.
"""

    def __init__(self, args: list[str] | None = None, **kwargs) -> None:
        quiet_expected_warnings()
        kwargs.setdefault("save_config_kwargs", {"overwrite": False})
        kwargs.setdefault("save_config_callback", SaveConfig)
        # Errors are raised, not printed under a usage block; no prefix of an option stands for it.
        description = for_installed(self.EXAMPLES, os.path.basename(sys.argv[0]) or "train.py")
        kwargs["parser_kwargs"] = {"exit_on_error": False, "allow_abbrev": False, "description": description,
                                   "usage": "%(prog)s --config CONFIG [--config OVERLAY ...] [--KEY VALUE ...]",
                                   "formatter_class": help_formatter(),
                                   **kwargs.get("parser_kwargs", {})}
        if args is None:  # a script's own command line (Lightning warns when args and sys.argv both speak)
            sys.argv[1:] = join_negative_values(resolve_config_args(sys.argv[1:]))
        else:
            args = join_negative_values(resolve_config_args(args))
        super().__init__(
            SentenceEmbeddingModule, SentenceDataModule, subclass_mode_model=True, subclass_mode_data=True,
            run=False, args=args, **kwargs,
        )

    def parse_arguments(self, parser, args) -> None:
        argv = sys.argv[1:] if args is None else list(args)
        # every --config file's keys and class paths first: jsonargparse names neither file nor key for them
        check_config_files(argv, {str(k) for k in parser.get_defaults().keys()},
                           {"model": SentenceEmbeddingModule, "data": SentenceDataModule})
        printing = [a for a in argv if a.split("=", 1)[0] == "--print_config"]
        checked = [a for a in argv if a not in printing]  # what a run would parse (explain() parses it again)
        try:
            if printing:  # jsonargparse prints before it checks: check the same command line first
                parser.parse_args(checked)
            super().parse_arguments(parser, args)
        except ArgumentError as err:
            raise CommandLineError(explain(err, checked, parser.parse_args)) from None

    def add_arguments_to_parser(self, parser) -> None:
        parser.add_argument("--ckpt_path", type=Optional[str], default=None,
                            help="checkpoint to resume from; 'last' = the checkpoint of this default_root_dir's runs "
                                 "furthest into training (none yet: start from scratch)")
        parser.add_argument("--validate_first", type=bool, default=True,
                            help="validate the start model before training (the step-0 point of every val/ curve)")
        parser.add_argument("--ddp_timeout_minutes", type=float, default=15.0,
                            help="DDP: how long a rank waits in a collective before the job fails, which bounds "
                                 "the hang when another rank dies (raise it if prepare_data downloads take longer)")
        parser.add_argument("--rendezvous_timeout_minutes", type=float, default=5.0,
                            help="DDP: how long the ranks may take to meet at start-up (MASTER_ADDR:MASTER_PORT) "
                                 "before the job ends with one line, instead of waiting --ddp_timeout_minutes")
        parser.add_argument("--keep_freed_memory", type=bool, default=True,
                            help="glibc: keep freed memory in the process instead of unmapping it and faulting it "
                                 "back in every step (harness/allocator.py); false keeps malloc's defaults")
        parser.add_lightning_class_args(ModelCheckpoint, "checkpoint")
        parser.add_lightning_class_args(SaveFinalState, "save_final_state")
        parser.add_lightning_class_args(PeriodicCheckpoint, "last_checkpoint")
        parser.add_lightning_class_args(Preemption, "preemption")
        parser.add_lightning_class_args(StopOnNonFiniteLoss, "stop_on_nonfinite_loss")
        parser.add_lightning_class_args(RandomState, "random_state")
        parser.add_lightning_class_args(ResumedEpochPosition, "resumed_epoch_position")
        parser.set_defaults({
            "checkpoint.monitor": "val/stsb_spearman",
            "checkpoint.mode": "max",
            "checkpoint.save_last": True,
            "checkpoint.filename": "best-step{step}-stsb{val/stsb_spearman:.2f}",
            "checkpoint.auto_insert_metric_name": False,
            # Our batch sampler shards by rank itself, so every rank keeps the full dev set.
            "trainer.use_distributed_sampler": False,
        })

    def instantiate_classes(self) -> None:
        if self.config.get("keep_freed_memory"):
            keep_freed_memory()  # before the model exists: its buffers come from the kept heap
        super().instantiate_classes()
        # The data tokenizes for the model: its tokenizer and lengths come from the encoder, set once.
        tokenization = getattr(self.model.encoder, "tokenization", None)
        if tokenization is not None and hasattr(self.datamodule, "use_tokenizer"):
            self.datamodule.use_tokenizer(**tokenization())

    def instantiate_trainer(self, **kwargs):
        config = self.config_init.get("trainer") or {}  # run=False: no subcommand level in the config
        plugins = config.get("plugins")
        plugins = [] if plugins is None else list(plugins) if isinstance(plugins, (list, tuple)) else [plugins]
        if not any(isinstance(p, CheckpointIO) for p in plugins):
            kwargs["plugins"] = [*plugins, AtomicCheckpointIO()]
        strategy = config.get("strategy")
        if isinstance(strategy, str) and strategy in StrategyRegistry:
            entry = StrategyRegistry[strategy]
            if issubclass(entry["strategy"], DDPStrategy):
                timeout = timedelta(minutes=self.config_init.get("ddp_timeout_minutes"))
                if entry["strategy"] is DDPStrategy:
                    rendezvous = timedelta(minutes=self.config_init.get("rendezvous_timeout_minutes"))
                    kwargs["strategy"] = RendezvousDDP(**entry["init_params"], timeout=timeout,
                                                       rendezvous_timeout=rendezvous)
                else:
                    kwargs["strategy"] = entry["strategy"](**entry["init_params"], timeout=timeout)
        return super().instantiate_trainer(**kwargs)


# -- before training: output directories and the checkpoint to resume -------------------------------
class OutputDirectoryError(ValueError):
    """default_root_dir (or the logger's or checkpoints' directory) cannot be written."""


def check_output_dirs(trainer) -> None:
    """Fail at start-up, naming the path, when the run could not write its logs or checkpoints."""
    paths = [trainer.default_root_dir]
    if trainer.logger is not None and getattr(trainer.logger, "save_dir", None):
        paths.append(trainer.logger.save_dir)
    callback = trainer.checkpoint_callback
    if isinstance(callback, ModelCheckpoint) and callback.dirpath:
        paths.append(callback.dirpath)
    for path in dict.fromkeys(str(p) for p in paths):
        if "://" in path:
            continue  # remote storage: nothing cheap to check
        try:
            os.makedirs(path, exist_ok=True)
            with tempfile.TemporaryFile(dir=path):
                pass
        except OSError as err:
            raise OutputDirectoryError(f"{path}: the run's output directory is not writable: {err.strerror or err}") \
                from None


def warn(message: str) -> None:
    """One ``warning:`` line on stderr (Lightning's warnings print the file and line of their source as well)."""
    print(f"warning: {message}", file=sys.stderr)


def usable_cores() -> int:
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1


def processes_warning(trainer) -> str | None:
    """The warning for more CPU processes than the cores this process may use: each one then waits for a core,
    and the run is slower than with fewer."""
    from lightning.pytorch.accelerators import CPUAccelerator

    cores = usable_cores()
    if isinstance(trainer.accelerator, CPUAccelerator) and trainer.num_devices > cores:
        return (f"--trainer.devices {trainer.num_devices} starts {trainer.num_devices} training processes on "
                f"{cores} CPU core(s): they take turns on the cores, so the run is slower than with "
                f"--trainer.devices {cores}")
    return None


SCHEDULE_LENGTH_KEYS = ("max_steps", "max_epochs")
DECAYING_SCHEDULES = ("linear", "cosine")  # their curve spans the whole run; constant_with_warmup ends flat


def schedule_warning(path: str, checkpoint: dict, model) -> str | None:
    """The warning for a continuation whose run length differs from the checkpoint's run: a decaying
    learning-rate schedule (and its warmup) is laid over the run's total steps, so the remaining steps follow
    another curve than the original run's."""
    scheduler = model.hparams.get("scheduler")
    if scheduler not in DECAYING_SCHEDULES or not checkpoint.get("run_config") or not model.run_config:
        return None
    before = (yaml.safe_load(checkpoint["run_config"]) or {}).get("trainer") or {}
    now = (yaml.safe_load(model.run_config) or {}).get("trainer") or {}
    changed = [f"trainer.{k} {before.get(k)} -> {now.get(k)}" for k in SCHEDULE_LENGTH_KEYS
               if before.get(k) != now.get(k)]
    if not changed:
        return None
    return (f"{path}: {', '.join(changed)}: the {scheduler} learning-rate schedule spans the run's total steps, so "
            f"from step {checkpoint.get('global_step')} on it follows another curve than the checkpoint's run "
            "(keep the run's length for the same curve; scheduler constant_with_warmup stays flat after warmup)")


def resolve_resume(ckpt_path: str | None, trainer, model) -> str | None:
    """The checkpoint ``fit`` resumes from, checked before any training.

    ``last`` is the readable checkpoint in :func:`checkpoint_dirs` furthest into training (its highest step,
    ``last.ckpt`` at a tie: ``harness.checkpoint.resume_checkpoint``), or None on a first run, so one command
    line (a SLURM script) serves the first run and every requeued one. A path must be a whole checkpoint of the configured
    objective, with weights of the configured model's shapes.
    """
    if ckpt_path is None:
        return None
    if ckpt_path == "last":
        found = resume_checkpoint(checkpoint_dirs(trainer))
        if found is None:
            rank_zero_info(f"--ckpt_path last: no checkpoint under {trainer.default_root_dir} yet; starting afresh")
            return None
        path, checkpoint = found
        rank_zero_info(f"--ckpt_path last: resuming from {path} (step {checkpoint.get('global_step')})")
    else:
        path, checkpoint = ckpt_path, load_checkpoint(ckpt_path, mmap=True)
    if "state_dict" not in checkpoint or "loops" not in checkpoint:
        raise CheckpointError(f"{path}: not a training checkpoint (no state_dict/loops); cannot resume from it")
    expected = f"{type(model).__module__}.{type(model).__qualname__}"
    found_objective = checkpoint.get("objective")
    if found_objective is not None and found_objective != expected:
        raise CheckpointError(f"{path}: a checkpoint of {found_objective}, but this run trains {expected}; "
                              "resume with the config it was trained with (its config.yaml)")
    mine = model.state_dict()
    for key, value in checkpoint["state_dict"].items():
        if key in mine and tuple(mine[key].shape) != tuple(value.shape):
            raise CheckpointError(f"{path}: weight {key} has shape {list(value.shape)}, this model's "
                                  f"{list(mine[key].shape)}; resume with the config it was trained with")
    if trainer.is_global_zero and (message := schedule_warning(path, checkpoint, model)) is not None:
        warn(message)
    return path


# -- errors ------------------------------------------------------------------------------------------
USER_ERRORS = (DataError, ModelResolutionError, ValueError, FileNotFoundError, FileExistsError, PermissionError)
RUN_ERRORS = (NonFiniteLossError, CheckpointWriteError, RendezvousError)  # the run started and stopped for a reason


def _raised_in_jsonargparse(err: BaseException) -> bool:
    tb = err.__traceback__
    while tb is not None and tb.tb_next is not None:
        tb = tb.tb_next
    return tb is not None and f"{os.sep}jsonargparse{os.sep}" in tb.tb_frame.f_code.co_filename


def root_cause(err: BaseException) -> BaseException:
    """Our own error inside jsonargparse's wrapping ("Does not validate against any of the Union
    subtypes ..."): an ``__init__`` of one of our classes refused its arguments."""
    while isinstance(err.__cause__, USER_ERRORS) and _raised_in_jsonargparse(err):
        err = err.__cause__
    return err


def exit_on_user_error(main: Callable[[], object]) -> Callable[[], object]:
    """Bad input ends with one line naming the file, line or key, and exit code 2; a run that
    stops for a reason (non-finite loss, a checkpoint it cannot write) with one line and code 3.

    Set ``SENTEMB_DEBUG=1`` to see the full traceback instead.
    """

    @functools.wraps(main)
    def wrapper(*args, **kwargs):
        try:
            return main(*args, **kwargs)
        except (*USER_ERRORS, *RUN_ERRORS) as err:
            if os.environ.get("SENTEMB_DEBUG"):
                raise
            print(f"error: {root_cause(err)}", file=sys.stderr)
            if isinstance(err, CommandLineError):
                print(HELP_HINT, file=sys.stderr)
            sys.exit(3 if isinstance(err, RUN_ERRORS) else 2)

    return wrapper
