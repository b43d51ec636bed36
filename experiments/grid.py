"""Which setting is best, over seeds? One command for a grid of runs: train every cell, evaluate it, write its
record, skip what is finished, print the table.

    python experiments/grid.py --name dclr_phi --config configs/dclr.yaml --config configs/overlays/offline_wiki.yaml \
        --config configs/overlays/cpu_300_steps.yaml --vary model.init_args.phi=0.5,0.7,0.9 --seeds 42,43,44 \
        --sts_dir $SENTEMB_DATA/sts [--set model.init_args.complementary_model=PATH] [--select best] [--jobs 2]

A cell is one combination of the ``--vary`` values and one seed; it lives in ``OUT/NAME/<values>/seed<S>/``:
``train/`` (the run's logs and checkpoints, trained with ``--ckpt_path last``, so a stopped cell resumes
where it stopped), ``train.log``, then ``eval.json`` (``evaluate.py`` on the selected checkpoint),
``dev.json`` (that checkpoint's dev figures and step) and ``model.ckpt`` (a link to it, a stable path for a
later grid's ``--set``). ``--select last`` (the default) scores the last checkpoint, the same rule for every
method; ``--select best`` the best by the config's ``checkpoint.monitor`` (the papers' model selection). A
cell whose ``eval.json`` exists is skipped, so the command resumes after a stop and never overwrites a result.
``--dev_only`` scores no test task (its ``eval.json`` is empty): a dev grid that chooses settings on dev alone.

``{seed}`` in a ``--set`` or ``--vary`` value is replaced by the cell's seed, so each seed can take its own
complementary model: ``--set model.init_args.complementary_model=runs/grid/simcse/base/seed{seed}/model.ckpt``.

Each finished cell writes to TensorBoard's HParams tab (``tensorboard --logdir OUT/NAME``) every ``--set`` and
``--vary`` value under its full key, the seed, the data seed (the batch order: ``data.init_args.seed`` when
set, else the seed), the configs and the selection rule, with its dev and seven-task figures; ``hp_metric`` is
the seven-task average. The training runs log no ``hp_metric`` of their own (Lightning's placeholder -1). At
the end the markdown table (mean ± std over seeds) is printed and written to ``OUT/NAME/table.md``.

Each finished cell also writes its record, ``results/<NAME>/<cell>/seed<S>.json`` (``--records``; see
``experiments/records.py``): the numbers of eval.json and dev.json with the dev curve, the mechanisms' training
scalars, the overrides, the machine, versions and commit of the attempt that finished it. A finished cell whose
record is missing gets it on a rerun; an existing record is never overwritten. ``--model NAME`` makes the grid's
one cell an evaluation of that model, with no training (a start model's row).

``--jobs 2 --threads 1`` runs two one-thread cells at a time: on 2 cores that is faster than one
two-thread cell after another.
"""
from __future__ import annotations

import argparse
import datetime
import fcntl
import itertools
import json
import os
import re
import shlex
import signal
import statistics
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import records
from records import DEV, ROOT, STS

STS_TASKS = STS
BUSY = 75  # --task: the cell is locked by another driver (EX_TEMPFAIL); a queue tries it again later


def parse_vary(spec: str) -> tuple[str, list[str]]:
    """``KEY=V1,V2,...``; values that hold commas themselves (lists) are separated by ``;`` instead:
    ``model.init_args.features=[u,v];[abs_diff,prod]``."""
    key, sep, values = spec.partition("=")
    if not sep or not key or not values:
        raise SystemExit(f"error: --vary {spec!r}: expected KEY=V1,V2,... (or KEY=V1;V2;... for list values)")
    return key, [v.strip() for v in values.split(";" if ";" in values else ",") if v.strip()]


def cell_label(assignment: dict[str, str]) -> str:
    """``phi=0.5,noise_ratio=2`` from the last component of each varied key; ``base`` with nothing varied."""
    return ",".join(f"{k.rsplit('.', 1)[-1]}={v}" for k, v in assignment.items()) or "base"


MODEL = "model.ckpt"  # in each cell's folder: a link to the checkpoint the cell chose


def cell_dir(out: Path | str, name: str, label: str = "base", seed: int | str = "{seed}") -> Path:
    """A cell's folder, ``OUT/NAME/LABEL/seedSEED``: its logs, its run, its record's source and ``MODEL``. The
    default seed is a literal ``{seed}``, which grid.py replaces by each cell's seed in a ``--set`` value."""
    return Path(out) / name / label / f"seed{seed}"


def last_checkpoint(train_dir: Path) -> Path | None:
    found = sorted(train_dir.glob("**/checkpoints/last.ckpt"), key=os.path.getmtime)
    return found[-1] if found else None


BEST_STEP = re.compile(r"best-step(\d+)")


def best_checkpoint(train_dir: Path) -> Path | None:
    """The checkpoint ModelCheckpoint kept as best by the config's monitor (``best-step<N>-...``)."""
    found = sorted((p for p in train_dir.glob("**/checkpoints/best-step*.ckpt") if BEST_STEP.search(p.name)),
                   key=os.path.getmtime)
    return found[-1] if found else None


def dev_at(train_dir: Path, step: int | None) -> dict[str, float]:
    """``val/<name>_spearman`` of each dev set for the checkpoint of global step ``step`` (None: the last
    logged, the last checkpoint's, since the run validates on its final step). A validation inside training
    is logged at the step before the optimizer step count its checkpoint is named by (Lightning's logging
    step counts the batches stepped before that validation)."""
    if step is not None:
        return _dev_at(train_dir, step - 1) or _dev_at(train_dir, step)
    return _dev_at(train_dir, None)


def _dev_at(train_dir: Path, step: int | None) -> dict[str, float]:
    series = records.scalars(train_dir, [f"val/{name}_spearman" for name in DEV])
    out: dict[str, float] = {}
    for name in DEV:
        values = [v for s, v in series.get(f"val/{name}_spearman", []) if step is None or s == step]
        if values:
            out[name] = float(values[-1])
    return out


def last_dev(train_dir: Path) -> dict[str, float]:
    return dev_at(train_dir, None)


def cell_hparams(args: argparse.Namespace, assignment: dict[str, str], seed: int) -> dict[str, str | int]:
    """What tells this cell apart: every ``--set`` and ``--vary`` value under its full key, the seed, the data
    seed (the batch order), the configs and the selection rule."""
    fixed = {k: v for k, _, v in (o.partition("=") for o in args.set)}
    values = {k: v.replace("{seed}", str(seed)) for k, v in {**fixed, **assignment}.items()}
    data_seed = values.get("data.init_args.seed", str(seed))  # the data module's default: the run's seed
    return {**values, "seed": seed, "data_seed": int(data_seed) if data_seed.lstrip("-").isdigit() else data_seed,
            "config": " + ".join(Path(c).name for c in args.config), "select": args.select,
            "scored": "dev only" if args.dev_only else "dev and test"}


def write_hparams(cell: Path, hparams: dict[str, str | int], metrics: dict[str, float]) -> None:
    """The cell's HParams entry; ``hp_metric`` (TensorBoard's default metric column) is the seven-task average."""
    from torch.utils.tensorboard import SummaryWriter

    values = {f"hparam/{k}": v for k, v in metrics.items()}
    if "avg" in metrics:
        values["hp_metric"] = metrics["avg"]
    with SummaryWriter(log_dir=str(cell / "hparams")) as writer:
        writer.add_hparams(hparams, values, run_name=".")


def cell_overrides(args: argparse.Namespace, assignment: dict[str, str], seed: int) -> list[str]:
    """Every ``--set`` and ``--vary`` value of the cell as ``KEY=VALUE``, ``{seed}`` filled in."""
    return [o.replace("{seed}", str(seed)) for o in [*args.set, *(f"{k}={v}" for k, v in assignment.items())]]


def train_command(args: argparse.Namespace, cell: Path, overrides: list[str], seed: int) -> list[str]:
    # Lightning's own logger, but without its hp_metric placeholder (-1): the cell's HParams entry has the real one.
    logger = json.dumps({"class_path": "lightning.pytorch.loggers.TensorBoardLogger",
                         "init_args": {"save_dir": str(cell / "train"), "default_hp_metric": False}})
    return [sys.executable, str(ROOT / "train.py"), *[a for c in args.config for a in ("--config", c)],
            *[a for o in overrides for a in (f"--{o.partition('=')[0]}", o.partition("=")[2])],
            "--seed_everything", str(seed), "--trainer.default_root_dir", str(cell / "train"),
            "--trainer.logger", logger, "--trainer.enable_progress_bar", "false", "--ckpt_path", "last",
            *layout_args(args)]


def layout_args(args: argparse.Namespace) -> list[str]:
    """A cell of several ranks (``--nodes``, ``--tasks_per_node``): DDP with one rank per task of its array
    task's allocation, on the GPUs when the job has some."""
    if args.nodes * args.tasks_per_node == 1:
        return []
    accelerator = "gpu" if os.environ.get("SLURM_GPUS_ON_NODE") or os.environ.get("SLURM_JOB_GPUS") else "cpu"
    return ["--trainer.accelerator", accelerator, "--trainer.devices", str(args.tasks_per_node),
            "--trainer.num_nodes", str(args.nodes), "--trainer.strategy", "ddp"]


def srun_prefix(args: argparse.Namespace) -> list[str]:
    """The cell's ranks as a step of its array task's allocation (``--overlap``: the driver's own one-task step
    holds a CPU of the first node)."""
    if args.nodes * args.tasks_per_node == 1:
        return []
    return ["srun", "--overlap", f"--nodes={args.nodes}", f"--ntasks={args.nodes * args.tasks_per_node}",
            f"--ntasks-per-node={args.tasks_per_node}"]


def evaluate_command(args: argparse.Namespace, source: list[str], output: Path) -> list[str]:
    command = [sys.executable, str(ROOT / "evaluate.py"), *source, "--sts_dir", args.sts_dir,
               "--precision", args.eval_precision, "--output", str(output)]
    if args.transfer_dir:
        command += ["--tasks", "all", "--transfer_dir", args.transfer_dir]
    return command + list(args.eval_arg)


class Children:
    """The cells' child processes, so that a preemption signal sent to this driver reaches them.

    Under SLURM (``--launcher slurm``) each array task runs this driver for one cell; ``--signal=USR1@90`` and
    ``scancel --signal=USR1`` reach the driver, which passes SIGUSR1 and SIGTERM on to its training run. The run
    saves, requeues the array task and exits 0; the driver then stops without evaluating the unfinished cell,
    and the requeued task resumes it.
    """

    def __init__(self) -> None:
        self.live: set[subprocess.Popen] = set()
        self.signalled: str | None = None

    def install(self) -> None:
        for signum in (signal.SIGUSR1, signal.SIGTERM):
            signal.signal(signum, self._forward)

    def _forward(self, signum: int, frame) -> None:
        self.signalled = signal.Signals(signum).name
        for child in list(self.live):
            child.send_signal(signum)

    def run(self, command: list[str], **kwargs) -> int:
        child = subprocess.Popen(command, **kwargs)
        self.live.add(child)
        try:
            return child.wait()
        finally:
            self.live.discard(child)


CHILDREN = Children()


def run_cell(args: argparse.Namespace, cell: Path, assignment: dict[str, str], seed: int) -> dict | None:
    """Train, evaluate and record one cell; None when it failed (its log says why)."""
    name = cell.relative_to(args.out)
    if (cell / "eval.json").exists():
        print(f"skip {name} (finished)", flush=True)
        write_record(args, cell, assignment, seed)  # a cell finished before its record was written
        return json.loads((cell / "eval.json").read_text())
    if CHILDREN.signalled:  # preempted while another cell ran: start nothing more
        raise SystemExit(0)
    cell.mkdir(parents=True, exist_ok=True)
    lock = open(cell / ".lock", "w")  # held while this process runs the cell; the system frees it when it dies
    try:
        fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        lock.close()
        print(f"busy {name}: another driver is running this cell", flush=True)
        raise Busy(str(name)) from None
    try:
        with open(cell / "attempts.jsonl", "a") as f:  # the machine, versions and commit of each attempt
            f.write(json.dumps(records.attempt(args.threads)) + "\n")
        clock = Elapsed(cell, time.time())
        try:
            return _run_locked(args, cell, assignment, seed, name, clock)
        finally:
            clock.stop()
    finally:
        lock.close()


class Elapsed:
    """The seconds a cell has run over all its attempts, kept in ``elapsed_s`` and refreshed every 30 s while it
    runs, so a cell killed without warning loses at most that much of its count. A cell begun before this file
    was kept counts each earlier attempt from its start to the last file it wrote."""

    def __init__(self, cell: Path, start: float) -> None:
        import threading

        self.path, self.start = cell / "elapsed_s", start
        if self.path.exists():
            self.before = float(self.path.read_text())
        else:
            self.before = self.earlier_attempts(cell)
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._beat, daemon=True)
        self._thread.start()

    @staticmethod
    def earlier_attempts(cell: Path) -> float:
        """Seconds of the attempts before the newest one, for a cell begun before ``elapsed_s`` was kept: each from
        its start to the last file it wrote under ``train/`` before the next attempt started."""
        starts = [datetime.datetime.fromisoformat(json.loads(line)["started"]).timestamp()
                  for line in (cell / "attempts.jsonl").read_text().splitlines() if line.strip()]
        written = [p.stat().st_mtime for p in (cell / "train").rglob("*") if p.is_file()] \
            if (cell / "train").exists() else []
        total = 0.0
        for begun, following in zip(starts, starts[1:]):
            total += max([t for t in written if begun <= t < following], default=begun) - begun
        return total

    def total(self) -> float:
        return self.before + time.time() - self.start

    def _write(self) -> None:
        tmp = self.path.with_suffix(".partial")
        tmp.write_text(f"{self.total():.0f}\n")
        os.replace(tmp, self.path)

    def _beat(self) -> None:
        while not self._stop.wait(30):
            self._write()

    def stop(self) -> None:
        self._stop.set()
        self._write()


class Busy(RuntimeError):
    """Another process holds the cell's lock (two drivers never train one cell)."""


def _run_locked(args: argparse.Namespace, cell: Path, assignment: dict[str, str], seed: int, name: Path,
                clock: Elapsed) -> dict | None:
    path = os.pathsep.join(p for p in (str(ROOT), os.environ.get("PYTHONPATH", "")) if p)  # the user's kept after
    env = dict(os.environ, HF_HUB_OFFLINE="1", TOKENIZERS_PARALLELISM="false", PYTHONPATH=path)
    if args.threads:
        env["OMP_NUM_THREADS"] = env["MKL_NUM_THREADS"] = str(args.threads)
    overrides = cell_overrides(args, assignment, seed)
    partial = cell / "eval.json.partial"
    start = clock.start
    with open(cell / "train.log", "a") as log:
        if args.model:  # an evaluation of a model as it is: no training, no dev curve
            ckpt = None
            source = ["--model", args.model, *(["--pooling", args.pooling] if args.pooling else [])]
            (cell / "command").write_text(shlex.join(evaluate_command(args, source, partial)) + "\n")
            print(f"evaluate {name}", flush=True)
        else:
            command = train_command(args, cell, overrides, seed)
            (cell / "command").write_text(shlex.join(command) + "\n")  # quoted: the logger's JSON holds spaces
            print(f"train {name}", flush=True)
            code = CHILDREN.run([*srun_prefix(args), *command], cwd=ROOT, env=env, stdout=log,
                                stderr=subprocess.STDOUT)
            if CHILDREN.signalled:
                print(f"preempted {name} ({CHILDREN.signalled}): its run saved; a rerun (the requeued task) "
                      "resumes it", flush=True)
                raise SystemExit(0)
            if code != 0:
                print(f"FAILED {name}: see {cell / 'train.log'}", flush=True)
                return None
            ckpt = (best_checkpoint if args.select == "best" else last_checkpoint)(cell / "train")
            if ckpt is None:
                print(f"FAILED {name}: no {args.select} checkpoint under {cell / 'train'}", flush=True)
                return None
            link = cell / MODEL
            link.unlink(missing_ok=True)
            link.symlink_to(ckpt.relative_to(cell))
            source = ["--ckpt_path", str(ckpt)]
        partial.unlink(missing_ok=True)  # a stop during evaluation leaves this; evaluate again
        if args.dev_only:
            partial.write_text("{}\n")
        elif CHILDREN.run(evaluate_command(args, source, partial), cwd=ROOT, env=env, stdout=log,
                          stderr=subprocess.STDOUT) != 0:
            if CHILDREN.signalled:
                raise SystemExit(0)  # the requeued task evaluates again
            print(f"FAILED evaluation of {name}: see {cell / 'train.log'}", flush=True)
            return None
    step = int(BEST_STEP.search(ckpt.name).group(1)) if ckpt is not None and args.select == "best" else None
    dev = dev_at(cell / "train", step) if ckpt is not None else {}
    (cell / "dev.json").write_text(json.dumps({**dev, "select": args.select, "step": step}, indent=2) + "\n")
    results = json.loads(partial.read_text())
    scores = {t: float(results[t]) for t in STS_TASKS if t in results}
    if "avg" in results:
        scores["avg"] = float(results["avg"])
    dev_scores = {f"dev_{k}": dev[k] for k in DEV if k in dev}
    write_hparams(cell, cell_hparams(args, assignment, seed), {**scores, **dev_scores})
    (cell / "wall_s").write_text(f"{clock.total():.0f}\n")  # training and evaluation, every attempt
    os.replace(partial, cell / "eval.json")  # its presence means the cell is finished
    write_record(args, cell, assignment, seed)
    print(f"done  {name}: avg {scores.get('avg', float('nan')):.2f}, "
          f"dev mean {statistics.mean(dev[k] for k in DEV if k in dev) if dev else float('nan'):.2f} "
          f"({time.time() - start:.0f} s)", flush=True)
    return results


def run_or_busy(args: argparse.Namespace, cell: Path, assignment: dict[str, str], seed: int) -> dict | None:
    try:
        return run_cell(args, cell, assignment, seed)
    except Busy:
        return None


def write_record(args: argparse.Namespace, cell: Path, assignment: dict[str, str], seed: int) -> None:
    """The finished cell's record under ``--records`` (never over a different one)."""
    if args.records is None:
        return
    label = cell.parent.name
    path = records.path_of(args.records, args.name, label, seed)
    if path.exists():
        return
    attempts = [json.loads(line) for line in (cell / "attempts.jsonl").read_text().splitlines() if line.strip()] \
        if (cell / "attempts.jsonl").exists() else []
    if not attempts:
        print(f"no record for {cell}: it has no attempts.jsonl (finished before records were kept)", flush=True)
        return
    dev = json.loads((cell / "dev.json").read_text())
    results = json.loads((cell / "eval.json").read_text())
    series = records.scalars(cell / "train") if (cell / "train").exists() else {}
    config = records.run_config(cell / "train") if (cell / "train").exists() else {}
    hparams = cell_hparams(args, assignment, seed)
    monitor = records.nested(config, "checkpoint.monitor") if args.select == "best" else None
    record = records.build(
        study=args.name, cell=label, values=dict(assignment), overrides=cell_overrides(args, assignment, seed),
        configs=list(args.config or []) + ([f"model: {args.model}"] if args.model else [])
        + [f"evaluate.py {a}" for a in args.eval_arg], seed=seed,
        data_seed=hparams["data_seed"],
        selection={"rule": "none" if args.model else args.select, "monitor": monitor, "step": dev.get("step"),
                   "weights": results.get("weights")},
        dev_curve=records.dev_curve(series), dev={k: dev[k] for k in DEV if k in dev},
        test=records.test_scores(results), transfer=records.transfer_scores(results),
        mechanisms=records.mechanisms(series), wall_s=float((cell / "wall_s").read_text()), attempts=attempts,
        precision={"train": records.nested(config, "trainer.precision"), "eval": args.eval_precision})
    if records.write(path, record):
        print(f"record {path.relative_to(args.records.parent) if args.records.parent in path.parents else path}",
              flush=True)


def mean_std(values: list[float]) -> str:
    if not values:
        return "—"
    if len(values) == 1:
        return f"{values[0]:.2f}"
    return f"{statistics.mean(values):.2f} ± {statistics.stdev(values):.2f}"


def table(rows: dict[str, list[Path]]) -> str:
    tasks = [*STS_TASKS, "avg"]
    names = {"sts12": "STS12", "sts13": "STS13", "sts14": "STS14", "sts15": "STS15", "sts16": "STS16",
             "stsb": "STS-B", "sickr": "SICK-R", "avg": "avg"}
    lines = ["| cell | seeds | " + " | ".join(names[t] for t in tasks) + " | STS-B dev | SICK-R dev |",
             "|---" * (len(tasks) + 4) + "|"]
    for label, cells in rows.items():
        done = [c for c in cells if (c / "eval.json").exists()]
        results = [json.loads((c / "eval.json").read_text()) for c in done]
        devs = [json.loads((c / "dev.json").read_text()) for c in done if (c / "dev.json").exists()]
        columns = [mean_std([float(r[t]) for r in results if t in r]) for t in tasks]
        columns += [mean_std([d[k] for d in devs if k in d]) for k in DEV]
        lines.append(f"| {label} | {len(done)}/{len(cells)} | " + " | ".join(columns) + " |")
    return "\n".join(lines)


def without(argv: list[str], flags: dict[str, bool]) -> list[str]:
    """``argv`` without the options in ``flags`` (name -> whether it takes a value), in both spellings."""
    out, skip = [], False
    for arg in argv:
        if skip:
            skip = False
            continue
        name = arg.split("=", 1)[0]
        if name in flags:
            skip = flags[name] and "=" not in arg
            continue
        out.append(arg)
    return out


def submit(args: argparse.Namespace, argv: list[str], cells: int) -> int:
    """One job array of ``cells`` tasks (``--jobs`` at a time), each this command for its cell (``--task``), and
    a job that writes the table once every task has ended. Each task's output: ``OUT/NAME/slurm/<array>_<task>.out``.

    A task preempted before its time limit (``--signal=USR1@90``) saves, requeues itself and resumes; a task
    that ends any other way leaves its cell as the log says, and a rerun of the grid (here or as an array)
    continues from what finished."""
    logs = args.out / "slurm"
    logs.mkdir(parents=True, exist_ok=True)
    base = without(argv, {"--launcher": True, "--wait": False, "--sbatch": True, "--jobs": True})
    script = shlex.join([sys.executable, str(Path(__file__).resolve()), *base])
    threads = str(args.threads or 1)
    # one task per rank of a cell; the driver is a one-task step on the first node, so that a signal to the
    # job's steps (--signal=USR1@90, scancel --signal=USR1) reaches it and its cell's ranks
    layout = ["--ntasks=1"] if args.nodes * args.tasks_per_node == 1 else \
        [f"--nodes={args.nodes}", f"--ntasks-per-node={args.tasks_per_node}"]
    array = ["sbatch", "--parsable", f"--job-name=grid-{args.name}", f"--array=0-{cells - 1}%{max(1, args.jobs)}",
             *layout, f"--cpus-per-task={threads}", "--requeue", "--open-mode=append", "--signal=USR1@90",
             f"--output={logs}/%A_%a.out", f"--chdir={ROOT}", *args.sbatch,
             f"--wrap=srun --nodes=1 --ntasks=1 {script} --task $SLURM_ARRAY_TASK_ID"]
    found = subprocess.run(array, capture_output=True, text=True)
    if found.returncode != 0:
        print(f"error: sbatch refused the array: {found.stderr.strip()}", file=sys.stderr)
        return 2
    array_id = found.stdout.strip().split(";")[0]
    table = ["sbatch", "--parsable", f"--job-name=grid-{args.name}-table", f"--dependency=afterany:{array_id}",
             "--ntasks=1", f"--output={logs}/table-%j.out", f"--chdir={ROOT}", *args.sbatch,
             f"--wrap={script} --table_only", *(["--wait"] if args.wait else [])]
    print(f"submitted job array {array_id} ({cells} cell(s), {max(1, args.jobs)} at a time; logs in {logs})", flush=True)
    done = subprocess.run(table, capture_output=True, text=True)
    if done.returncode != 0 and not args.wait:
        print(f"error: sbatch refused the table job: {done.stderr.strip()}", file=sys.stderr)
        return 2
    print(f"table job {done.stdout.strip() or '?'}: writes {args.out / 'table.md'} when the array ends", flush=True)
    if args.wait:
        print((args.out / "table.md").read_text() if (args.out / "table.md").exists() else "no table written")
    return 0


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--name", required=True, help="the grid's directory under --out")
    parser.add_argument("--config", action="append", default=[], help="train.py config files, merged in order")
    parser.add_argument("--model", default=None,
                        help="no training: the one cell evaluates this model (a hub name or folder) as it is")
    parser.add_argument("--pooling", default=None, help="with --model: its pooling (default: the model's own)")
    parser.add_argument("--set", action="append", default=[], metavar="KEY=VALUE", help="a fixed override")
    parser.add_argument("--vary", action="append", default=[], metavar="KEY=V1,V2", help="a varied key")
    parser.add_argument("--seeds", default="42", help="comma-separated seeds (default 42)")
    parser.add_argument("--sts_dir", required=True, help="the seven STS tasks' files for evaluate.py")
    parser.add_argument("--out", type=Path, default=ROOT / "runs" / "grid")
    parser.add_argument("--jobs", type=int, default=1, help="cells trained at the same time")
    parser.add_argument("--threads", type=int, default=None, help="torch threads of each cell")
    parser.add_argument("--eval_precision", default="bf16", choices=["32", "bf16", "16"])
    parser.add_argument("--select", default="last", choices=["last", "best"],
                        help="the checkpoint scored: the last, or the best by the config's checkpoint.monitor")
    parser.add_argument("--dev_only", action="store_true", help="score no test task: a dev grid that chooses settings")
    parser.add_argument("--transfer_dir", default=None,
                        help="also score SentEval's transfer tasks from this folder (evaluate.py --tasks all)")
    parser.add_argument("--eval_arg", action="append", default=[], metavar="--OPTION=VALUE",
                        help="an extra evaluate.py option of every cell, e.g. --eval_arg=--normalize=no")
    parser.add_argument("--records", type=Path, default=records.RECORDS,
                        help="where each finished cell's record goes (default: results/ of the repository)")
    parser.add_argument("--table_only", action="store_true", help="print the table of what has finished; run nothing")
    parser.add_argument("--launcher", default="local", choices=["local", "slurm"],
                        help="local: run the cells here (--jobs at a time); slurm: submit one job array of one task "
                             "per cell (--jobs at a time) and a job that prints the table once they end")
    parser.add_argument("--sbatch", action="append", default=[], metavar="OPTION",
                        help="with --launcher slurm: an sbatch option for every cell, e.g. --sbatch=--partition=gpu "
                             "--sbatch=--gpus-per-task=1 --sbatch=--time=4:00:00")
    parser.add_argument("--nodes", type=int, default=1,
                        help="with --launcher slurm: nodes of each cell (DDP over --nodes x --tasks_per_node ranks)")
    parser.add_argument("--tasks_per_node", type=int, default=1,
                        help="with --launcher slurm: ranks of each cell per node (one per device: add "
                             "--sbatch=--gpus-per-node=N on GPU nodes)")
    parser.add_argument("--wait", action="store_true", help="with --launcher slurm: return when the table job ends")
    parser.add_argument("--task", type=int, default=None,
                        help="run only the cell of this index (an array task of --launcher slurm)")
    return parser


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    if bool(args.config) == bool(args.model):
        parser.error("give --config (cells that train) or --model (one cell that evaluates a model), not both")
    if args.model and (args.vary or args.set or args.dev_only):
        parser.error("--model evaluates one model as it is: no --vary, --set or --dev_only")
    if args.nodes < 1 or args.tasks_per_node < 1:
        parser.error(f"--nodes {args.nodes} --tasks_per_node {args.tasks_per_node}: both must be at least 1")
    if args.nodes * args.tasks_per_node > 1 and args.launcher != "slurm" and args.task is None \
            and not args.table_only:
        parser.error("--nodes and --tasks_per_node lay out a cell over a SLURM allocation: add --launcher slurm")
    for o in args.set:
        if "=" not in o:
            parser.error(f"--set {o!r}: expected KEY=VALUE")
    varied = [parse_vary(v) for v in args.vary]
    seeds = [int(s) for s in args.seeds.split(",") if s.strip()]
    root = args.out.absolute()
    args.out = root / args.name
    rows: dict[str, list[Path]] = {}
    jobs = []
    for values in itertools.product(*[vals for _, vals in varied]):
        assignment = {key: value for (key, _), value in zip(varied, values)}
        label = cell_label(assignment)
        for seed in seeds:
            cell = cell_dir(root, args.name, label, seed)
            rows.setdefault(label, []).append(cell)
            jobs.append((cell, assignment, seed))
    if args.launcher == "slurm" and not args.table_only:
        return submit(args, argv if argv is not None else sys.argv[1:], len(jobs))
    CHILDREN.install()
    outcomes = []
    if args.task is not None:
        if not 0 <= args.task < len(jobs):
            parser.error(f"--task {args.task}: this grid has {len(jobs)} cell(s), 0 to {len(jobs) - 1}")
        try:
            return 0 if run_cell(args, *jobs[args.task]) is not None else 1  # one cell; the table job prints it
        except Busy:
            return BUSY
    if not args.table_only:
        with ThreadPoolExecutor(max_workers=max(1, args.jobs)) as pool:
            outcomes = list(pool.map(lambda job: run_or_busy(args, *job), jobs))
    args.out.mkdir(parents=True, exist_ok=True)
    text = table(rows)
    (args.out / "table.md").write_text(text + "\n")
    print(text)
    return 0 if all(o is not None for o in outcomes) else 1


if __name__ == "__main__":
    sys.exit(main())
