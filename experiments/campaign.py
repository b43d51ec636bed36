"""Which cells are left, in what order, and when will they be done? Every study's cells as one resumable queue,
the SimCSE/DCLR headline first.

    python experiments/campaign.py --plan                          # what is left, in order, with its cost
    python experiments/campaign.py [--jobs 2] [--threads 1] [--commit]

The plan is a list of cells, each an ``experiments/grid.py`` cell (one setting, one seed) with the records it
waits for. A cell starts when every record it needs exists: a dev grid before its choice, SimCSE's choice
before DCLR's grid, the chosen SimCSE of a seed before the DCLR cells that take it as their complementary model.
The ready cells start in plan order, ``--jobs`` at a time, so the answers come early:

1. the headline: SimCSE's dev grid, DCLR's dev grid, and the five paired final seeds of both
   (``experiments/dclr_protocol.py``'s stages ``simcse_dev``, ``simcse``, ``dclr_dev``, ``final``);
2. the objectives study's remaining cells, until every row of the front page is filled
   (``experiments/objectives.py``);
3. the start model's transfer rows;
4. FILM's pair pipeline as a record (``experiments/film_pairs.py --record``).

What the budget could not hold is in ``CUT``, with the reason; ``--plan`` lists it and the study page says it.

A cell with a record is never run again, with one exception that keeps its record: a seed whose chosen checkpoint
later cells read (a DCLR seed's complementary SimCSE, the MNR checkpoints scored at each truncation) is trained
again on a machine that lacks the file (``runs/`` is not in git), before those cells. A stopped cell (SIGTERM,
SIGKILL, a machine that went away) resumes from its ``last.ckpt`` (refreshed at every validation and every 10
minutes of the protocol's cells), because grid.py trains with ``--ckpt_path last``; SIGTERM or SIGINT to this
command reaches the training runs, which save at the next step and exit. Two drivers never train one cell:
grid.py holds a lock on the cell while it runs it.

Each cell's cost is estimated from the records' wall times: the mean of its own study's records, else of the
studies named as its kin, else of every training record (``--plan`` names the source of each estimate).
``--commit`` commits each finished cell's record with the pages ``experiments/report.py`` regenerates from it,
as soon as it lands. Progress: a bar on a terminal, else one line per started or finished cell, each with
cells done and left, core-hours spent and left, and the estimated end.
"""
from __future__ import annotations

import argparse
import datetime
import fcntl
import glob as globlib
import itertools
import os
import signal
import statistics
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

import dclr_protocol as protocol
import grid
import objectives
import records
from records import ROOT

BUDGET_CORE_HOURS = 45.0
SEEDS = (42, 43, 44, 45, 46)  # the headline's five paired seeds: never cut
M = "model.init_args."
BUSY = grid.BUSY
# one epoch of the 26,616 wiki sentences in full batches of 64 (configs/overlays/dclr_protocol.yaml)
PROTOCOL_STEPS = 415
OBJECTIVE_STEPS = 300  # configs/overlays/cpu_dev_choice.yaml
# objectives without records of their own yet: the study whose per-step cost is nearest (batch 64 of pairs)
KIN = {"mnr": ("objectives_dev_mnr",), "mnr_hard_negatives": ("objectives_dev_mnr",),
       "simcse_sup": ("objectives_dev_mnr",), "simcse_unsup": ("objectives_dev_mnr",),
       "dclr": ("objectives_dev_simcse_unsup", "objectives_dev_mnr")}

# the objectives whose seeds' chosen checkpoints later cells read: unsupervised SimCSE as DCLR's complementary
# model, and the two MNR rows scored at each truncation
TRUNCATED = ("mnr", "mnr_matryoshka")
READ = ("simcse_unsup", *TRUNCATED)

# Grids of the studies that the budget could not hold, and why (docs/results/simcse_dclr.md prints this).
CUT: dict[str, str] = {
    "protocol_dclr_noise_only": "DCLR's halves, noise only (3 seeds): the first cut, DCLR's extra arms",
    "protocol_dclr_weighting_only": "DCLR's halves, weighting only (3 seeds): the first cut",
    "protocol_fn_simcse": "the false-negative study on near-neighbour batches (3 arms x 3 seeds): the first cut",
    "protocol_fn_weighting_only": "the false-negative study (as above)",
    "protocol_fn_dclr": "the false-negative study (as above)",
    "protocol_dclr_distill": "distillation in place of weighting (3 seeds): the first cut",
    "protocol_dclr_official": "the official form under the protocol (3 seeds): the first cut",
    "protocol_simcse_dropout": "the dropout-only comparison, SimCSE as shipped (dropout view, lr 3e-5; 5 seeds): the "
                               "second cut",
    "protocol_dclr_dropout": "the dropout-only comparison's DCLR arm (5 seeds): the second cut",
}
CUT_DEV_GRIDS = (f"both dev searches from 15 to {protocol.BUDGET} cells each (SimCSE: 3 views x 3 learning rates; "
                 "DCLR: 3 noise steps x 3 weighting rules), declared before any of them ran: the third cut, since "
                 "the headline and the objectives study were estimated above the budget with the first two")


@dataclass(frozen=True)
class Need:
    """Records that must exist before a cell starts: every planned cell of ``study`` (of ``seed`` only, if
    given)."""
    study: str
    seed: int | None = None


@dataclass
class Job:
    """One cell of the plan."""
    study: str
    label: str
    seed: int
    part: str
    command: Callable[[], list[str]]  # built when the cell starts: it may read a dev grid's choice
    needs: tuple[Need, ...] = ()
    kin: tuple[str, ...] = ()  # studies whose wall times estimate this one's
    steps: int | None = None  # optimizer steps it trains: a kin record's wall time is scaled to them
    done_glob: str | None = None  # a job that writes no cell record: done when this glob finds a (committed) record
    task: int | None = None  # the cell's index in its grid (grid.py --task)
    # a file that the cells needing this job read (ignored by git, so a fresh clone lacks it): while it is missing,
    # the job counts as done by its record but its dependants wait, and the queue writes the file again with
    # ``remake``, the same command without a new record
    output: str | None = None
    remake: Callable[[], list[str]] | None = None

    @property
    def key(self) -> str:
        return f"{self.study}/{self.label}/seed{self.seed}"


@dataclass
class Plan:
    jobs: list[Job] = field(default_factory=list)

    def grid(self, study: str, part: str, command: Callable[[], list[str]], *,
             vary: dict[str, tuple[str, ...]] | None = None, seeds: tuple[int, ...] = (42,),
             needs: Callable[[int], tuple[Need, ...]] = lambda seed: (), kin: tuple[str, ...] = (),
             steps: int | None = None, models: Path | None = None) -> None:
        """The cells of one grid.py grid, in grid.py's order (the varied values, then the seeds). ``models``: the
        grids' run folder (grid.py ``--out``), given when later cells read these cells' ``model.ckpt``: a fresh
        clone lacks it, so the queue trains such a cell again (its record stays as it is) before they start."""
        if study in CUT:
            return
        vary = vary or {}
        assignments = [dict(zip(vary, values)) for values in itertools.product(*vary.values())]
        for i, assignment in enumerate(assignments):
            for j, seed in enumerate(seeds):
                label = grid.cell_label(assignment)
                model = None if models is None else str(grid.cell_dir(models, study, label, seed) / grid.MODEL)
                self.jobs.append(Job(study, label, seed, part, command, needs(seed), kin, steps,
                                     task=i * len(seeds) + j, output=model, remake=command if model else None))


def build_plan(args: argparse.Namespace) -> Plan:
    """Every cell of the campaign, in the order the answers are wanted."""
    plan = Plan()
    data = args.data
    proto = protocol.Protocol(argparse.Namespace(
        sts_dir=f"{data}/sts", transfer_dir=f"{data}/senteval", seeds=",".join(map(str, SEEDS)), threads=args.threads,
        jobs=1, eval_precision="32", records=args.records, out=args.out, config=[], stages=[]))
    views = {f"{M}augmentation": protocol.VIEWS, f"{M}lr": protocol.LRS}
    headline = "1 headline"
    # before their own records land, the protocol's cells are estimated from the same objective in the objectives
    # study (or from MNR, whose batch of 64 pairs is as many sentences as SimCSE's two views of 64), per step
    simcse_kin = ("protocol_simcse_dev", "objectives_dev_simcse_unsup", "objectives_simcse_unsup", "objectives_dev_mnr")
    dclr_kin = ("protocol_dclr_dev_phi", "protocol_dclr_dev_quantile", "objectives_dev_dclr", "objectives_dclr",
                *simcse_kin)
    steps = PROTOCOL_STEPS
    plan.grid("protocol_simcse_dev", headline, lambda: proto.stage_simcse_dev()[0], vary=views, kin=simcse_kin,
              steps=steps)
    plan.grid("protocol_simcse", headline, lambda: proto.stage_simcse()[0], seeds=SEEDS,
              needs=lambda seed: (Need("protocol_simcse_dev"),), kin=simcse_kin, steps=steps, models=args.out)
    dclr_needs = lambda seed: (Need("protocol_simcse_dev"), Need("protocol_simcse", SEEDS[0]))  # noqa: E731
    plan.grid("protocol_dclr_dev_phi", headline, lambda: proto.stage_dclr_dev()[0], needs=dclr_needs,
              vary={f"{M}noise_beta": protocol.BETAS, f"{M}phi": protocol.PHIS}, kin=dclr_kin, steps=steps)
    plan.grid("protocol_dclr_dev_quantile", headline, lambda: proto.stage_dclr_dev()[1], needs=dclr_needs,
              vary={f"{M}noise_beta": protocol.BETAS, f"{M}phi_quantile": protocol.QUANTILES}, kin=dclr_kin,
              steps=steps)
    plan.grid("protocol_dclr", headline, lambda: proto.stage_final()[0], seeds=SEEDS,
              needs=lambda seed: (Need("protocol_dclr_dev_phi"), Need("protocol_dclr_dev_quantile"),
                                  Need("protocol_simcse", seed)), kin=dclr_kin, steps=steps)

    # 2. the objectives study (experiments/objectives.py): each objective's dev grid, then its chosen lr on 3 seeds
    ob = argparse.Namespace(data=data, threads=args.threads, eval_precision="32", records=args.records,
                            out=args.out, precision=None)
    test_seeds = tuple(int(s) for s in objectives.SEEDS.split(","))
    lrs = {f"{M}lr": objectives.LRS}
    part = "2 objectives"
    for name, (configs, sets) in [*objectives.OBJECTIVES.items(), ("dclr", objectives.DCLR)]:
        if name == "dclr":
            sets = tuple(s.format(out=args.out) for s in sets)
            comp = lambda seed: (Need("objectives_simcse_unsup", seed),)  # noqa: E731
        else:
            comp = lambda seed: ()  # noqa: E731
        dev = f"objectives_dev_{name}"
        plan.grid(dev, part, lambda c=configs, s=sets, d=dev: objectives.grid(
            ob, d, (*c, objectives.BUDGET), s, "--select", "best", "--dev_only", "--vary",
            f"{M}lr={','.join(objectives.LRS)}", "--seeds", "42"), vary=lrs, needs=lambda seed, comp=comp: comp(42),
            kin=KIN.get(name, ()), steps=OBJECTIVE_STEPS)
        plan.grid(f"objectives_{name}", part, lambda n=name, c=configs, s=sets: _test_grid(ob, n, c, s),
                  seeds=test_seeds, needs=lambda seed, d=dev, comp=comp: (Need(d), *comp(seed)),
                  kin=(dev, *KIN.get(name, ())), steps=OBJECTIVE_STEPS, models=args.out if name in READ else None)
    for name, (configs, sets) in objectives.FILM.items():
        plan.grid(name, part, lambda n=name, c=configs, s=sets: objectives.grid(
            ob, n, c, tuple(x.format(data=data) for x in (*s, "data.init_args.sts_dir={data}/sts")), "--seeds", "42"))

    # 2b. the newer rows: mining first (one file, by the start model), then each row's dev grid and seeds, then the
    # Matryoshka row and plain MNR scored at each truncation (an evaluation of each seed's chosen checkpoint)
    part = "2b mined, matryoshka"
    mined = objectives.MINED.format(out=args.out)
    mine = [sys.executable, str(ROOT / "mine.py"), "--inputs",
            f"[{data}/nli/snli.test.tsv,{data}/nli/mnli.dev_matched.tsv]", "--model", objectives.START, "--output",
            mined, *objectives.MINE]
    mining_records = Path(args.records) / "benchmarks" / "mining_nli"
    plan.jobs.append(Job("mined_nli", "base", 42, part, lambda: [*mine, "--record", str(mining_records)],
                         done_glob=str(mining_records / "*.json"), output=mined, remake=lambda: mine))
    for name, (configs, sets) in objectives.NEWER.items():
        sets = tuple(x.format(out=args.out) for x in sets)
        base = (Need("mined_nli"),) if name == "mnr_mined" else ()
        dev = f"objectives_dev_{name}"
        plan.grid(dev, part, lambda c=configs, s=sets, d=dev: objectives.grid(
            ob, d, (*c, objectives.BUDGET), s, "--select", "best", "--dev_only", "--vary",
            f"{M}lr={','.join(objectives.LRS)}", "--seeds", "42"), vary=lrs, needs=lambda seed, b=base: b,
            kin=("objectives_dev_mnr",), steps=OBJECTIVE_STEPS)
        plan.grid(f"objectives_{name}", part, lambda n=name, c=configs, s=sets: _test_grid(ob, n, c, s),
                  seeds=test_seeds, needs=lambda seed, d=dev, b=base: (Need(d), *b), kin=(dev, "objectives_dev_mnr"),
                  steps=OBJECTIVE_STEPS, models=args.out if name in READ else None)
    for name in TRUNCATED:
        for dim in objectives.TRUNCATE_DIMS:
            for seed in test_seeds:
                study = f"objectives_{name}_dim{dim}"
                plan.grid(study, part, lambda n=name, st=study, d=dim, s=seed: [
                    sys.executable, str(ROOT / "experiments" / "grid.py"), "--name", st, "--model",
                    str(grid.cell_dir(args.out, f"objectives_{n}", seed=s) / grid.MODEL), "--seeds", str(s),
                    "--sts_dir", f"{data}/sts", f"--eval_arg=--truncate_dim={d}", "--eval_precision", "32",
                    "--threads", str(args.threads), "--records", str(args.records), "--out", str(args.out)],
                    seeds=(seed,), needs=lambda _, n=name, s=seed: (Need(f"objectives_{n}", s),), kin=("start_mean",))

    # 3. the start's transfer rows: its pipeline's unit vectors and the raw pooled ones
    for i, name in enumerate(("protocol_start_transfer", "protocol_start_transfer_raw")):
        plan.grid(name, "3 transfer", lambda i=i: proto.stage_transfer()[i], kin=("start_mean",))

    # 4. FILM's duplicate-detection pipeline, one record (results/benchmarks/film_pairs/)
    if "film_pairs" not in CUT:
        plan.jobs.append(Job("film_pairs", "base", 42, "4 film pairs", lambda: [
            sys.executable, str(ROOT / "experiments" / "film_pairs.py"), "--sts_dir", f"{data}/sts", "--record",
            "--threads", str(args.threads)], kin=("start_mean",),
            done_glob=str(Path(args.records) / "benchmarks" / "film_pairs" / "*.json")))
    return plan


def _test_grid(ob: argparse.Namespace, name: str, configs: tuple[str, ...], sets: tuple[str, ...]) -> list[str]:
    command = objectives.test_grid(ob, name, configs, sets, records.load_all(ob.records))
    if command is None:
        raise RuntimeError(f"{name}: its dev grid has no choice yet")  # the plan's needs rule this out
    return command


# -- state ----------------------------------------------------------------------------------------------------
class State:
    """What the records say: which cells are done, and the wall times that estimate the rest."""

    def __init__(self, plan: Plan, root: Path, known: list[dict] | None = None) -> None:
        self.root = root
        self.known = records.load_all(root) if known is None else known
        self.done_keys = {f"{r['study']}/{r['cell']}/seed{r['seed']}" for r in self.known}
        self.planned: dict[str, list[Job]] = {}
        for job in plan.jobs:
            self.planned.setdefault(job.study, []).append(job)

    def done(self, job: Job) -> bool:
        if job.done_glob is not None:
            return bool(globlib.glob(job.done_glob))
        return job.key in self.done_keys

    def usable(self, job: Job) -> bool:
        """Done, and the file it writes for the cells that need it is on disk."""
        return self.done(job) and (job.output is None or os.path.exists(job.output))

    def to_remake(self, plan: Plan) -> list[Job]:
        """The done jobs whose output file a cell without a record needs but this machine lacks (Job.output)."""
        left = [j for j in plan.jobs if not self.done(j)]
        missing = {n.key for j in left for n in self.needed(j) if self.done(n) and not self.usable(n)}
        return [j for j in plan.jobs if j.key in missing]

    def needed(self, job: Job) -> list[Job]:
        return [j for need in job.needs for j in self.planned.get(need.study, [])
                if need.seed is None or j.seed == need.seed]

    def ready(self, job: Job) -> bool:
        return all(self.usable(j) for j in self.needed(job))

    def walls(self, study: str, steps: int | None = None) -> list[float]:
        """Core-seconds of the study's records, each scaled to ``steps`` optimizer steps when given."""
        out = []
        for r in self.known:
            if r["study"] != study:
                continue
            cost = r["wall_s"] * (r["machine"].get("threads") or 1)
            trained = max((p["step"] for p in r["dev_curve"]), default=0)
            out.append(cost * steps / trained if steps and trained else cost)
        return out

    def estimate(self, job: Job) -> tuple[float, str]:
        """The cell's cost in core-seconds, and where the figure comes from."""
        found = self.walls(job.study)
        if found:
            return statistics.mean(found), f"{len(found)} record(s) of {job.study}"
        for study in job.kin:
            found = self.walls(study, job.steps)
            if found:
                return statistics.mean(found), f"{len(found)} record(s) of {study}" + (
                    f", scaled to {job.steps} steps" if job.steps else "")
        trained = [r["wall_s"] * (r["machine"].get("threads") or 1) for r in self.known
                   if r["selection"]["rule"] != "none"]
        if trained:
            return statistics.mean(trained), f"the mean of all {len(trained)} training records"
        return 3600.0, "no record yet: one core-hour assumed"

    def spent(self, plan: Plan) -> float:
        """Core-seconds of the plan's finished cells, from their records."""
        studies = {j.study for j in plan.jobs}
        return sum(r["wall_s"] * (r["machine"].get("threads") or 1) for r in self.known if r["study"] in studies)


@dataclass
class Summary:
    done: int
    left: int
    spent_h: float
    left_h: float
    end: datetime.datetime

    def text(self) -> str:
        total = self.spent_h + self.left_h
        over = f", over the {BUDGET_CORE_HOURS:.0f} budget" if total > BUDGET_CORE_HOURS else ""
        return (f"{self.done} of {self.done + self.left} cells done, {self.left} left; {self.spent_h:.1f} core-hours "
                f"spent, about {self.left_h:.1f} left ({total:.1f} in all{over}); end about "
                f"{self.end:%Y-%m-%d %H:%M} UTC")


def summarize(plan: Plan, state: State, jobs: int, now: datetime.datetime | None = None,
              remakes: bool = True) -> Summary:
    """Cells done and left, with their cost. ``remakes``: count the cells that this machine trains again for a file
    it lacks; a page generated from the records leaves them out, so that it reads the same on every clone."""
    left = [j for j in plan.jobs if not state.done(j)]
    left_s = sum(state.estimate(j)[0] for j in [*left, *(state.to_remake(plan) if remakes else [])])
    now = now or datetime.datetime.now(datetime.timezone.utc)
    return Summary(len(plan.jobs) - len(left), len(left), state.spent(plan) / 3600, left_s / 3600,
                   now + datetime.timedelta(seconds=left_s / max(1, jobs)))


def print_plan(plan: Plan, state: State, jobs: int) -> None:
    print(f"campaign: {summarize(plan, state, jobs).text()}; {jobs} cell(s) at a time")
    print(f"{'#':>3}  {'part':<14} {'cell':<66} {'core-h':>6}  estimated from")
    n = 0
    for job in plan.jobs:
        if state.done(job):
            continue
        n += 1
        cost, source = state.estimate(job)
        wait = "" if state.ready(job) else "  (waits for " + ", ".join(
            need.study + ("" if need.seed is None else f" seed {need.seed}") for need in job.needs) + ")"
        print(f"{n:>3}  {job.part:<14} {job.key:<66} {cost / 3600:>6.2f}  {source}{wait}")
    remakes = state.to_remake(plan)
    if remakes:
        print("done, but the file that cells above read is not on this machine: trained again first, with the same "
              "command (their records stay as they are; the first line's core-hours count them)")
        for job in remakes:
            cost, source = state.estimate(job)
            print(f"     {job.part:<14} {job.key:<66} {cost / 3600:>6.2f}  {source}; writes {job.output}")
    print("cut, and why (in the order of cuts):")
    for study, why in CUT.items():
        print(f"  {study}: {why}")
    print(f"  dev searches: {CUT_DEV_GRIDS}")


# -- running --------------------------------------------------------------------------------------------------
class Runner:
    def __init__(self, args: argparse.Namespace, plan: Plan) -> None:
        self.args, self.plan = args, plan
        self.running: dict[str, tuple[Job, subprocess.Popen, float]] = {}
        self.failed: set[str] = set()
        self.remaking: set[str] = set()  # done jobs writing their output file again (Job.remake)
        self.busy_until: dict[str, float] = {}
        self.stopping: str | None = None
        self.tty = sys.stdout.isatty()
        args.out.mkdir(parents=True, exist_ok=True)

    def install(self) -> None:
        for signum in (signal.SIGTERM, signal.SIGINT, signal.SIGUSR1):
            signal.signal(signum, self._stop)

    def _stop(self, signum: int, frame) -> None:
        self.stopping = signal.Signals(signum).name
        for _, child, _ in self.running.values():
            child.send_signal(signal.SIGTERM if signum == signal.SIGINT else signum)

    def state(self) -> State:
        return State(self.plan, self.args.records)

    def start(self, job: Job, state: State) -> None:
        remake = state.done(job)
        command = job.remake() if remake else job.command()
        if job.task is not None:
            command = [*command, "--task", str(job.task)]
        log = open(self.args.out / "campaign.log", "a")
        log.write(f"\n== {datetime.datetime.now(datetime.timezone.utc):%Y-%m-%d %H:%M:%S} {job.key}\n")
        log.flush()
        threads = str(self.args.threads)
        env = dict(os.environ, OMP_NUM_THREADS=threads, MKL_NUM_THREADS=threads, HF_HUB_OFFLINE="1",
                   TOKENIZERS_PARALLELISM="false")
        child = subprocess.Popen(command, cwd=ROOT, stdout=log, stderr=subprocess.STDOUT, env=env)
        log.close()
        self.running[job.key] = (job, child, time.time())
        if remake:
            self.remaking.add(job.key)

    def reap(self) -> list[Job]:
        """The cells whose process ended; returns those that landed a record."""
        landed = []
        state = self.state()
        for key, (job, child, started) in list(self.running.items()):
            code = child.poll()
            if code is None:
                continue
            del self.running[key]
            if key in self.remaking:
                self.remaking.discard(key)
                if state.usable(job):
                    self.say(f"remade {job.output} ({time.time() - started:.0f} s); its record was already there",
                             state)
                elif not self.stopping:
                    self.failed.add(key)
                    self.say(f"FAILED to remake {job.output} (exit {code}): see {self.args.out / 'campaign.log'}",
                             state)
            elif state.done(job):
                landed.append(job)
                self.say(f"done  {key} ({time.time() - started:.0f} s since this start; its record counts every "
                         "attempt)", state)
            elif code == BUSY:
                self.busy_until[key] = time.time() + 300
            elif self.stopping:
                self.say(f"stopped {key}: it resumes from its last checkpoint on the next start", state)
            else:
                self.failed.add(key)
                self.say(f"FAILED {key} (exit {code}): see {self.args.out / 'campaign.log'} and the cell's "
                         "train.log; it is not retried until the next start", state)
        return landed

    def say(self, line: str, state: State) -> None:
        summary = summarize(self.plan, state, self.args.jobs)
        if self.tty:
            width = 30
            filled = int(width * summary.done / max(1, summary.done + summary.left))
            sys.stdout.write("\r\033[K" + line + "\n")
            sys.stdout.write(f"[{'#' * filled}{'.' * (width - filled)}] {summary.text()}")
        else:
            sys.stdout.write(f"{line} | {summary.text()}\n")
        sys.stdout.flush()

    def next_ready(self, state: State) -> list[Job]:
        """The cells to start, in plan order: those without a record whose needs are met, and the done jobs whose
        output file a waiting cell needs but a fresh clone lacks (written again, without a new record)."""
        now = time.time()
        missing = {j.key for j in state.to_remake(self.plan)}
        return [j for j in self.plan.jobs if (not state.done(j) or j.key in missing) and j.key not in self.running
                and j.key not in self.failed and self.busy_until.get(j.key, 0) <= now
                and (j.key in missing or state.ready(j))]

    def run(self) -> int:
        self.install()
        while True:
            landed = self.reap()
            if landed and self.args.commit:
                commit(landed, self.args.records)
            if self.stopping:
                if not self.running:
                    print(f"\nstopped on {self.stopping}; the same command resumes the queue", flush=True)
                    return 0
                time.sleep(0.5)
                continue
            state = self.state()
            for job in self.next_ready(state)[: self.args.jobs - len(self.running)]:
                try:
                    self.start(job, state)
                except Exception as err:  # a choice that cannot be read: the cell waits, the others go on
                    self.failed.add(job.key)
                    self.say(f"FAILED {job.key}: {err}", state)
                    continue
                self.say(f"remake {job.output} ({job.key} again)" if job.key in self.remaking else f"start {job.key}",
                         state)
            if not self.running:
                left = [j for j in self.plan.jobs if not state.done(j)]
                waiting = [j for j in left if j.key in self.busy_until]
                if waiting:
                    time.sleep(self.args.poll)
                    continue
                if not left:
                    print("\nevery cell of the plan has its record", flush=True)
                    return 0
                print(f"\n{len(left)} cell(s) cannot start: {', '.join(sorted(self.failed))} failed (their logs say "
                      "why; the same command tries them again)", flush=True)
                return 1
            time.sleep(self.args.poll)


def commit(landed: list[Job], root: Path) -> None:
    """The landed records and the pages regenerated from them, as one commit (only those files)."""
    # in a fresh process, so that the pages are what the checked-out report.py writes, not the one this queue
    # imported when it started
    written = subprocess.run([sys.executable, str(ROOT / "experiments" / "report.py"), "--records", str(root)],
                             cwd=ROOT, capture_output=True, text=True)
    if written.returncode != 0:
        print(f"could not regenerate the pages ({written.stderr.strip()}); the records stay on disk under {root}",
              flush=True)
        return
    pages = [line.split(" ", 1)[1] for line in written.stdout.splitlines() if line.startswith("rewrote ")]
    names = " ".join(j.key for j in landed)
    message = f"Records: {len(landed)} finished cell(s) ({names}), with the tables regenerated"
    for attempt in range(5):
        lock = open(ROOT / ".git" / "campaign-commit.lock", "w")  # one committer at a time
        fcntl.flock(lock, fcntl.LOCK_EX)
        try:
            add = subprocess.run(["git", "add", "--", str(root), *pages], cwd=ROOT, capture_output=True, text=True)
            done = add.returncode == 0 and subprocess.run(
                ["git", "commit", "-q", "-m", message, "--", str(root), *pages], cwd=ROOT, capture_output=True,
                text=True).returncode == 0
        finally:
            lock.close()
        if done:
            print(f"committed: {message}", flush=True)
            return
        time.sleep(5 * (attempt + 1))  # another git command held the index
    print(f"could not commit the records of {names}; they are on disk under {root}", flush=True)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], epilog=__doc__.split("\n\n", 1)[1],
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--data", default=os.environ.get("SENTEMB_DATA"),
                        help="the data root (docs/DATA.md; default $SENTEMB_DATA)")
    parser.add_argument("--plan", action="store_true", help="print what is left, in order, with its cost; run nothing")
    parser.add_argument("--jobs", type=int, default=2, help="cells trained at the same time (default 2)")
    parser.add_argument("--threads", type=int, default=1, help="torch threads of each cell (default 1)")
    parser.add_argument("--commit", action="store_true",
                        help="commit each landed record with the pages regenerated from it")
    parser.add_argument("--records", type=Path, default=records.RECORDS)
    parser.add_argument("--out", type=Path, default=ROOT / "runs" / "grid")
    parser.add_argument("--poll", type=float, default=10.0, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if not args.data:
        parser.error("give --data DIR or set SENTEMB_DATA (the data root, docs/DATA.md)")
    args.data = str(Path(args.data).absolute())
    args.out, args.records = args.out.absolute(), args.records.absolute()
    os.environ["SENTEMB_DATA"] = args.data  # the overlays' ${SENTEMB_DATA}, for every cell
    plan = build_plan(args)
    if args.plan:
        print_plan(plan, State(plan, args.records), args.jobs)
        return 0
    return Runner(args, plan).run()


if __name__ == "__main__":
    sys.exit(main())
