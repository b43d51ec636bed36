"""A paper's STS table in one command: train with the paper's protocol, evaluate, print the paper's row beside ours.

    python experiments/reproduce.py --paper simcse_unsup
    python experiments/reproduce.py --paper sbert_nli --config configs/overlays/offline_nli.yaml \\
        --config configs/overlays/cpu_300_steps.yaml --sts_dir $SENTEMB_DATA/sts
    python experiments/reproduce.py --list

Each paper is one or more shipped configs (``--list`` shows them). Training is ``train.py`` on those configs
as shipped: the config's dev cadence, the best dev checkpoint as the CLI's ModelCheckpoint keeps it, the data
the config names (the hub's, unless an overlay points elsewhere). Then the seven STS tasks are scored with
``harness.sts_eval.evaluate_sts`` on the encoder ``encoders.load`` builds from that checkpoint, and the paper's
row, ours and their difference are printed with the table each paper figure comes from. The STS data is
``--sts_dir`` (this project's TSV layout or SentEval's data folder) or, by default, SentEval's data from the hub
(SimCSE's ``senteval.tar``, downloaded once into the Hugging Face cache); it is found before any training.

A paper of two steps (SBERT's NLI then STS-B) trains the second from the first's best checkpoint
(``model_name: <ckpt>``, docs/TRAINING.md). Extra ``--config`` overlays and ``--set KEY=VALUE`` overrides
apply to every step; ``--config STEP:PATH`` and ``--set STEP:KEY=VALUE`` to one step only (the steps of
``sbert_nli_stsb`` are ``nli`` and ``stsb``), since an NLI overlay does not fit the STS-B data module.

Everything goes to ``OUT/<paper>/seed<S>/`` (``--out``, default ``runs/reproduce``): per step ``<step>/train/``
(the run), ``<step>/train.log`` and ``<step>/finished.json``; then ``eval.json``, ``result.json`` and
``result.md``. Nothing there is overwritten. A rerun of the same command resumes: a finished step is not
trained again, an unfinished one continues with ``--ckpt_path last``, a finished evaluation is read back.
A folder holding a run of another command (other overlays, overrides, seed or STS data) is refused.

Devices: every visible CUDA device (``devices: auto``; ``strategy: ddp`` when there are several, with the
per-device batch divided so that the global batch, and with it the in-batch negatives and the step count,
stays the paper's); one CPU device otherwise. Overlays and ``--set`` come after these and win.

Bad input ends with one ``error:`` line and exit code 2, also when a training step refuses its input (its
own error line is repeated: a rerun cannot fix it). A step that stops for a reason (a NaN loss, a checkpoint it
cannot write) ends with its error line and code 3; a step killed or preempted with one ``error:`` line naming
its log and a non-zero code: the same command then resumes it.
"""
from __future__ import annotations

import argparse
import datetime
import json
import math
import os
import re
import signal
import subprocess
import sys
from pathlib import Path
from typing import Sequence

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))
# No HF_HUB_OFFLINE default here (the other experiments set one): the protocol reads the paper's data from the hub.
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

from datamodules.sts import STS_TASKS  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parent))
from papers import COLUMNS, PAPERS, Paper, PaperRow  # noqa: E402,F401

TASK_NAMES = {"sts12": "STS12", "sts13": "STS13", "sts14": "STS14", "sts15": "STS15", "sts16": "STS16",
              "stsb": "STS-B", "sickr": "SICK-R", "avg": "avg"}
BEST_LINE = re.compile(r"^best checkpoint: (?P<path>.*) \((?P<monitor>[^()]*) = (?P<score>[^()]*)\)\s*$")


class ReproduceError(ValueError):
    """Bad input: one ``error:`` line and exit code 2, as every script of the project."""


def stop(message: str, code: int) -> None:
    """A training step that failed or stopped: one ``error:`` line (its log has the rest) and a non-zero exit."""
    print(f"error: {message}", file=sys.stderr, flush=True)
    raise SystemExit(code if code > 0 else 3)


EXAMPLES = """\
examples:
  python experiments/reproduce.py --list
  python experiments/reproduce.py --paper simcse_unsup                  # with the hub: the paper's own data
  # without the hub: the data root (docs/DATA.md), the offline model and a CPU budget
  export SENTEMB_DATA=$HOME/sentemb-data HF_HUB_OFFLINE=1
  python experiments/reproduce.py --paper sbert_nli --config configs/overlays/offline_nli.yaml \\
      --config configs/overlays/cpu_300_steps.yaml --sts_dir $SENTEMB_DATA/sts
  # a root filled by stage.py: the overlay it wrote for the paper's config
  python experiments/reproduce.py --paper simcse_unsup --config $SENTEMB_DATA/overlays/simcse_unsup.yaml \\
      --sts_dir $SENTEMB_DATA/sts
"""


# -- the command line ----------------------------------------------------------------------------------
def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], allow_abbrev=False,
                                     formatter_class=argparse.RawDescriptionHelpFormatter, epilog=EXAMPLES)
    parser.add_argument("--paper", choices=sorted(PAPERS), help="which paper setting (--list describes them)")
    parser.add_argument("--list", action="store_true", help="print the papers, their configs and tables, and exit")
    parser.add_argument("--config", action="append", default=[], metavar="[STEP:]PATH",
                        help="an overlay merged after the paper's configs (every step, or STEP only)")
    parser.add_argument("--set", action="append", default=[], metavar="[STEP:]KEY=VALUE",
                        help="a train.py override, e.g. trainer.max_steps=300 (every step, or STEP only)")
    parser.add_argument("--sts_dir", default=None,
                        help="the seven STS tasks: this project's TSV layout or SentEval's data folder (default: "
                             "SentEval's data from the hub, SimCSE's senteval.tar, downloaded once)")
    parser.add_argument("--seed", type=int, default=42, help="seed_everything of every step (default 42)")
    parser.add_argument("--out", type=Path, default=ROOT / "runs" / "reproduce", help="output folder")
    parser.add_argument("--eval_precision", default="32", choices=["32", "bf16", "16"],
                        help="encoding precision of the evaluation (default 32, as the papers)")
    parser.add_argument("--eval_batch_size", type=int, default=64, help="sentences per encoding batch")
    args = parser.parse_args(argv)
    if not args.list and args.paper is None:
        parser.error("give --paper NAME (or --list)")
    return args


def split_targets(values: list[str], steps: list[str], what: str) -> dict[str, list[str]]:
    """``[STEP:]VALUE`` items -> step -> values (an item without a step goes to every step); config paths
    made absolute and checked, overrides checked for ``KEY=VALUE``."""
    out: dict[str, list[str]] = {s: [] for s in steps}
    for value in values:
        prefix, sep, rest = value.partition(":")
        targeted = sep and prefix in steps and not (what == "--config" and os.path.isfile(value))
        if not targeted and sep and re.fullmatch(r"\w+", prefix) and not os.path.exists(value):
            raise ReproduceError(f"{what} {value!r}: this paper has no step {prefix!r}; its steps: "
                                 f"{', '.join(steps)}")
        item = rest if targeted else value
        if what == "--config":
            if not os.path.isfile(item):
                raise ReproduceError(f"--config {item}: no such file")
            item = str(Path(item).absolute())
        elif "=" not in item or not item.partition("=")[0]:
            raise ReproduceError(f"--set {value!r}: expected KEY=VALUE")
        for s in ([prefix] if targeted else steps):
            out[s].append(item)
    return out


def device_arguments() -> tuple[list[str], int]:
    """train.py arguments that use every visible CUDA device, or one CPU device; and the device count."""
    import torch

    n = torch.cuda.device_count() if torch.cuda.is_available() else 0
    if n == 0:
        return ["--trainer.accelerator", "cpu", "--trainer.devices", "1"], 1
    if n == 1:
        return ["--trainer.accelerator", "gpu", "--trainer.devices", "auto"], 1
    return ["--trainer.accelerator", "gpu", "--trainer.devices", "auto", "--trainer.strategy", "ddp"], n


def default_sts_dir() -> str:
    """SentEval's data from the hub (SimCSE's senteval.tar), downloaded and checked once, then cached; without
    the hub or a cached copy, a DataError naming the local ways."""
    from datamodules.sts import default_sts_dir as hub_senteval_dir

    return str(hub_senteval_dir())


# -- one training step ----------------------------------------------------------------------------------
def train_command(configs: list[str], overlays: list[str], sets: list[str], device_args: list[str], seed: int,
                  root_dir: Path, extra: Sequence[str] = ()) -> list[str]:
    """train.py on the paper's configs, then the devices, the overlays, the overrides and ``extra``.

    The run's log directory is fixed (``version_0``): a resumed run continues in it, so ModelCheckpoint
    restores its record of the best dev score (in a new version directory Lightning would forget it, and the
    first validation after the resume would count as the best whatever its score).
    """
    command = [sys.executable, str(ROOT / "train.py")]
    command += [a for c in configs for a in ("--config", str(ROOT / c))]
    command += ["--trainer.enable_progress_bar", "false", *device_args,  # before the overlays: they may change it
                "--trainer.logger", "lightning.pytorch.loggers.TensorBoardLogger",
                "--trainer.logger.save_dir", str(root_dir), "--trainer.logger.version", "0"]
    command += [a for c in overlays for a in ("--config", c)]
    command += [a for s in sets for a in (f"--{s.partition('=')[0]}", s.partition("=")[2])]
    command += [*extra, "--seed_everything", str(seed), "--trainer.default_root_dir", str(root_dir),
                "--ckpt_path", "last"]
    return command


def print_config_value(command: list[str], key: str):
    """The value of dotted ``key`` in the config ``command`` (a train.py command line) resolves to."""
    import yaml

    check = [a for a in command if a not in ("--ckpt_path", "last")] + ["--print_config"]
    out = subprocess.run(check, cwd=ROOT, capture_output=True, text=True)
    if out.returncode != 0:
        last = (out.stderr.strip().splitlines() or ["(no output)"])[-1].removeprefix("error: ")
        raise ReproduceError(f"the step's config does not resolve: {last}")
    value = yaml.safe_load(out.stdout)
    for part in key.split("."):
        value = value[part]
    return value


def per_device_share(batch: int, devices: int) -> int:
    """The per-device batch that keeps a global batch of ``batch`` over ``devices`` devices."""
    if batch % devices:
        raise ReproduceError(f"the paper's batch of {batch} does not split over {devices} devices; make "
                             f"{math.gcd(batch, devices)} visible (CUDA_VISIBLE_DEVICES) or set "
                             "data.init_args.per_device_batch_size yourself (--set), which changes the global batch")
    return batch // devices


def keep_global_batch(command: list[str], devices: int) -> list[str]:
    """Under DDP, divide the per-device batch so the global batch stays the config's (the paper's)."""
    if devices <= 1:
        return []
    batch = int(print_config_value(command, "data.init_args.per_device_batch_size"))
    share = per_device_share(batch, devices)
    print(f"{devices} CUDA devices: per-device batch {share}, global batch {batch} as the config's")
    return ["--data.init_args.per_device_batch_size", str(share)]


def run_training(command: list[str], log_path: Path) -> dict:
    """Run one train.py command, its output to the console and ``log_path``; the best checkpoint it reports.

    SIGTERM and SIGUSR1 are passed on, so the run saves ``last.ckpt`` before it stops (harness Preemption).
    """
    with open(log_path, "a") as log:
        log.write(f"$ {' '.join(command)}\n")
        log.flush()
        child = subprocess.Popen(command, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                                 bufsize=1, env=dict(os.environ, PYTHONUNBUFFERED="1"))  # lines as they come
        previous = {s: signal.signal(s, lambda signum, frame: child.send_signal(signum))
                    for s in (signal.SIGTERM, signal.SIGUSR1)}
        best, error = None, None
        try:
            for line in child.stdout:
                sys.stdout.write(line)
                sys.stdout.flush()  # progress as it happens, also when the console is a file
                log.write(line)
                log.flush()
                match = BEST_LINE.match(line)
                if match:
                    best = match.groupdict()
                if line.startswith("error: "):
                    error = line.strip().removeprefix("error: ")
            code = child.wait()
        finally:
            for s, handler in previous.items():
                if handler is not None:  # None: a handler not installed from Python, nothing to restore
                    signal.signal(s, handler)
    if code == 2:  # train.py refused its input: a rerun of the same command meets the same refusal
        stop(f"training refused its input: {error or 'see the log'} (log: {log_path}); fix that, then rerun", 2)
    if code == 3:  # it started and stopped for a reason (a NaN loss, a checkpoint it could not write)
        stop(f"training stopped: {error or 'see the log'} (log: {log_path}); once the cause is fixed, the same "
             "command resumes from the last checkpoint", 3)
    if code != 0:
        how = f"was killed by signal {-code}" if code < 0 else f"failed (exit {code})"
        stop(f"training {how}; see {log_path}. The same command resumes it.", code)
    if best is None:
        stop(f"training stopped before its end (preempted?); see {log_path}. The same command resumes it.", 3)
    if not best["path"] or not os.path.isfile(best["path"]):
        raise ReproduceError(f"the run kept no best dev checkpoint ({best['monitor']} never logged: no dev "
                             f"evaluation ran?); see {log_path}")
    return {"best_checkpoint": best["path"], "monitor": best["monitor"], "dev_score": float(best["score"])}


def write_json_once(path: Path, data: dict) -> None:
    """Write atomically; the file's presence means the work it records is finished."""
    partial = path.with_name(path.name + ".partial")
    partial.write_text(json.dumps(data, indent=2) + "\n")
    os.replace(partial, path)


# -- evaluation and the table ---------------------------------------------------------------------------
def evaluate_checkpoint(ckpt: str, sts_dir: str, precision: str, batch_size: int) -> dict:
    import torch

    import encoders
    from harness.sts_eval import evaluate_sts

    encoder = encoders.load(ckpt)
    encoder.to("cuda" if torch.cuda.is_available() else "cpu")
    results = evaluate_sts(lambda s: encoder.encode(s, batch_size=batch_size, precision=precision), sts_dir)
    return {"checkpoint": ckpt, "sts_dir": sts_dir, "precision": precision, **results}


def fmt(value: float | None, signed: bool = False) -> str:
    if value is None:
        return "—"
    return f"{value:+.2f}" if signed else f"{value:.2f}"


def comparison(paper: Paper, ours: dict) -> dict:
    """Paper row, ours and ours - paper per column (None where the paper has no figure)."""
    row = paper.paper_row.scores if paper.paper_row else {}
    mine = {c: float(ours[c]) for c in COLUMNS}
    return {"paper": {c: row.get(c) for c in COLUMNS}, "ours": mine,
            "difference": {c: (mine[c] - row[c]) if c in row else None for c in COLUMNS}}


def table(paper: Paper, compared: dict, seed: int) -> str:
    lines = ["| | " + " | ".join(TASK_NAMES[c] for c in COLUMNS) + " |", "|---" * (len(COLUMNS) + 1) + "|"]
    if paper.paper_row:
        lines.append(f"| paper: {paper.paper_row.row} | " + " | ".join(fmt(compared["paper"][c]) for c in COLUMNS) + " |")
    lines.append(f"| ours (seed {seed}) | " + " | ".join(fmt(compared["ours"][c]) for c in COLUMNS) + " |")
    if paper.paper_row:
        lines.append("| ours - paper | " + " | ".join(fmt(compared["difference"][c], True) for c in COLUMNS) + " |")
    return "\n".join(lines)


def machine() -> str:
    import torch

    from harness import provenance

    if torch.cuda.is_available():
        names = [torch.cuda.get_device_name(i) for i in range(torch.cuda.device_count())]
        where = f"{len(names)} x {names[0]}" if len(set(names)) == 1 else ", ".join(names)
    else:
        where = f"CPU ({provenance.cpu_model()}, {provenance.cores()} cores)"
    return f"{where}, torch {torch.__version__}"


def data_line(evaluation: dict) -> str:
    """Which data the scores come from; a sample (the fixtures) is said to be one."""
    from harness.export import evaluation_data_text

    return evaluation_data_text(evaluation, list(STS_TASKS)) + "."


def report(name: str, paper: Paper, args: argparse.Namespace, steps: dict[str, dict], evaluation: dict,
           commands: dict[str, str]) -> tuple[dict, str]:
    compared = comparison(paper, evaluation)
    source = (f"Paper figures: {paper.paper_row.citation}, row \"{paper.paper_row.row}\"." if paper.paper_row
              else "Paper figures: none.")
    text = "\n".join([
        f"## {paper.title} (`--paper {name}`)", "",
        table(paper, compared, args.seed), "",
        source + (f" {paper.note}" if paper.note else ""),
        f"Ours: Spearman x 100 of cosine, SentEval's \"all\" aggregation. {data_line(evaluation)} "
        f"The best dev checkpoint of each step:",
        *[f"- {step}: `{info['best_checkpoint']}` ({info['monitor']} = {info['dev_score']:.2f})"
          for step, info in steps.items()],
        f"Configs: {'; '.join(' + '.join(c) for _, c in paper.steps)}"
        + (f"; overlays and overrides: `{' '.join(args.config + ['--set ' + s for s in args.set])}`"
           if args.config or args.set else ""),
        f"Measured on {machine()}, {datetime.datetime.now(datetime.timezone.utc):%Y-%m-%d}.",
    ])
    data = {"paper": name, "title": paper.title,
            "citation": paper.paper_row.citation if paper.paper_row else None,
            "paper_row_name": paper.paper_row.row if paper.paper_row else None, "note": paper.note,
            "seed": args.seed, "sts_dir": evaluation["sts_dir"], "eval_precision": evaluation["precision"],
            **compared, "steps": steps, "commands": commands,
            "machine": machine(), "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds")}
    return data, text


def list_papers() -> None:
    for name, paper in PAPERS.items():
        configs = "; then ".join(" + ".join(c) for _, c in paper.steps)
        cited = f"{paper.paper_row.citation}, \"{paper.paper_row.row}\"" if paper.paper_row else "no paper row"
        print(f"{name:20s} {paper.title}\n{'':20s} configs: {configs}\n{'':20s} figures: {cited}")


# -- main -----------------------------------------------------------------------------------------------
def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if args.list:
        list_papers()
        return 0
    paper = PAPERS[args.paper]
    step_names = [s for s, _ in paper.steps]
    overlays = split_targets(args.config, step_names, "--config")
    sets = split_targets(args.set, step_names, "--set")
    sts_dir = str(Path(args.sts_dir).absolute()) if args.sts_dir else None
    if sts_dir is not None and not os.path.isdir(sts_dir):
        raise ReproduceError(f"--sts_dir {args.sts_dir}: no such directory")
    run_dir = (args.out / args.paper / f"seed{args.seed}").absolute()

    # One folder, one command: a resume must not mix in a run of other overlays, overrides or data.
    invocation = {"paper": args.paper, "seed": args.seed, "config": overlays, "set": sets,
                  "sts_dir": sts_dir, "eval_precision": args.eval_precision}
    recorded = run_dir / "invocation.json"
    if recorded.exists():
        before = json.loads(recorded.read_text())
        changed = [k for k in invocation if before.get(k) != invocation[k]]
        if changed:
            raise ReproduceError(f"{run_dir} holds a run of another command ({', '.join(changed)} differ: "
                                 f"see {recorded}); choose another --out to keep both")
    eval_path = run_dir / "eval.json"
    if not eval_path.exists() and sts_dir is None:
        sts_dir = default_sts_dir()  # before any training: a missing evaluation set should not wait for it
    if not recorded.exists():
        run_dir.mkdir(parents=True, exist_ok=True)
        write_json_once(recorded, invocation)

    device_args, devices = device_arguments()
    steps: dict[str, dict] = {}
    commands: dict[str, str] = {}
    previous_best = None
    for step, configs in paper.steps:
        step_dir = run_dir / step
        step_dir.mkdir(exist_ok=True)
        step_sets = list(sets[step])
        if paper.start_from_previous and previous_best is not None:
            step_sets.append(f"model.init_args.encoder.init_args.model_name={previous_best}")  # last: it must win
        command = train_command(list(configs), overlays[step], step_sets, device_args, args.seed, step_dir / "train")
        finished = step_dir / "finished.json"
        if finished.exists():
            info = json.loads(finished.read_text())
            print(f"step {step}: finished earlier, not retrained (best checkpoint {info['best_checkpoint']})")
        else:
            if not any(s.startswith("data.init_args.per_device_batch_size=") for s in step_sets):
                command = train_command(list(configs), overlays[step], step_sets, device_args, args.seed,
                                        step_dir / "train", keep_global_batch(command, devices))
            print(f"step {step}: training (log: {step_dir / 'train.log'})", flush=True)
            info = run_training(command, step_dir / "train.log")
            info["command"] = " ".join(command)
            write_json_once(finished, info)
        steps[step], commands[step] = info, info.get("command", " ".join(command))
        previous_best = info["best_checkpoint"]

    if eval_path.exists():
        evaluation = json.loads(eval_path.read_text())
        print(f"evaluation: read back from {eval_path}")
    else:
        print(f"evaluation: {previous_best} on {sts_dir}", flush=True)
        evaluation = evaluate_checkpoint(previous_best, sts_dir, args.eval_precision, args.eval_batch_size)
        write_json_once(eval_path, evaluation)

    data, text = report(args.paper, paper, args, steps, evaluation, commands)
    print()
    print(text)
    for path, content in ((run_dir / "result.json", json.dumps(data, indent=2) + "\n"),
                          (run_dir / "result.md", text + "\n")):
        if path.exists():
            print(f"kept {path} (written by an earlier run of this command)")
            continue
        with open(path, "x") as f:
            f.write(content)
        print(f"written {path}")
    return 0


if __name__ == "__main__":
    from harness.cli import exit_on_user_error

    sys.exit(exit_on_user_error(main)())
