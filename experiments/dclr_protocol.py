"""Does DCLR beat SimCSE when both get the same tuning budget? The papers' protocol on one footing, end to end, in
one resumable command.

    python experiments/dclr_protocol.py --sts_dir $SENTEMB_DATA/sts --transfer_dir $SENTEMB_DATA/senteval \\
        --jobs 2 --threads 1 [--stages simcse_dev,simcse,dclr_dev,final,false_negatives,distillation,official,transfer]

The protocol (``configs/overlays/dclr_protocol.yaml``): one epoch of the offline wiki sentences, batch 64, STS-B dev
and SICK-R dev every 50 steps, the best checkpoint on their mean; both methods in the papers' regime (cls pooling,
SimCSE's MLP in training only) from all-MiniLM-L6-v2. Every choice is made on dev alone, seed 42; the seven test
tasks are scored once, for the choices. Each seed has its own batch order. The stages:

1. ``simcse_dev``: SimCSE's search over the knobs both methods share: the positive view (dropout, or dropout plus
   token shuffle or feature cutoff) x lr {1e-5, 3e-5, 5e-5}: ``BUDGET`` (9) cells.
2. ``simcse``: the chosen SimCSE on ``--seeds`` (the arm, and each seed's complementary model: it saw the
   batches), and SimCSE as shipped (dropout, lr 3e-5) on the same seeds, for the dropout-only comparison.
3. ``dclr_dev``: DCLR from SimCSE's chosen view and lr, searching its own knobs with the same number of cells: the
   noise step ``noise_beta`` {0.05, 0.1, 0.2} (relative steps) x the weighting rule (a fixed phi 0.9, or the
   batch quantile 0.95 or 0.99), the complementary model the chosen SimCSE of seed 42.
4. ``final``: the chosen DCLR on ``--seeds`` (paired with the chosen SimCSE by seed); the same DCLR settings with
   the dropout view and lr 3e-5 (paired with SimCSE as shipped: the earlier comparison); and its two halves, noise
   only (``use_weighting=false``) and weighting only (``use_noise=false``), on the first three seeds.
5. ``false_negatives``: batches of near neighbours (``data.init_args.neighbour_batches``: groups of 8 by the start
   model's own embeddings): SimCSE chosen, weighting only and the chosen DCLR, three seeds, each weighting by the
   SimCSE trained on those batches.
6. ``distillation``: the chosen DCLR with distillation in place of weighting (a teacher of two dropout views),
   three seeds, paired with noise only.
7. ``official``: ``form: official`` with its overlay, under the protocol, three seeds, paired with the chosen
   SimCSE.
8. ``transfer``: SentEval's transfer tasks for the start (its pipeline's unit vectors, and the raw pooled ones).
   The ``simcse`` and ``final`` arms score the transfer tasks with the test tasks when ``--transfer_dir`` is given.

Each stage is ``experiments/grid.py`` calls (printed as they start), so every cell resumes after a stop, is never
overwritten and writes its record (``results/protocol_*``); ``experiments/report.py`` builds
docs/results/simcse_dclr.md from the records with the choice rule below (``choose``). ``--config`` adds overlays
after the protocol's (the tests use the tiny model).
"""
from __future__ import annotations

import argparse
import shlex
import subprocess
import sys
import time
from pathlib import Path

import grid
import records
from records import ROOT

STAGES = ("simcse_dev", "simcse", "dclr_dev", "final", "false_negatives", "distillation", "official", "transfer")
# Each method's dev search is 9 cells, declared before any of them ran (the 45 core-hour budget; docs/results/
# simcse_dclr.md says what was cut). SimCSE's views: dropout (SimCSE's own) and the two single augmentations
# ConSERT found strongest, token shuffle and feature cutoff (token and span cutoff are left out).
VIEWS = ("dropout", "token_shuffle", "feature_cutoff")
LRS = ("1e-5", "3e-5", "5e-5")
BUDGET = len(VIEWS) * len(LRS)  # cells of each method's dev search
BETAS = ("0.05", "0.1", "0.2")
# the weighting rule: DCLR's fixed threshold phi 0.9, or a threshold at a batch quantile of the similarities
PHIS = ("0.9",)
QUANTILES = ("0.95", "0.99")
assert len(BETAS) * (len(PHIS) + len(QUANTILES)) == BUDGET  # the same budget for both methods
START = "sentence-transformers/all-MiniLM-L6-v2"
M = "model.init_args."


def dev_mean(record: dict) -> float:
    return (record["dev"]["stsb"] + record["dev"]["sickr"]) / 2


def choose(found: list[dict]) -> dict | None:
    """The dev cell of the highest mean of STS-B dev and SICK-R dev at its selected checkpoint (the first of equals
    in cell order); None while the search has not finished all its cells."""
    if len(found) < BUDGET:
        return None
    return max(sorted(found, key=lambda r: (r["study"], r["cell"])), key=dev_mean)


def settings(record: dict) -> dict[str, str]:
    """A dev cell's model settings: its varied values and its fixed ``model.init_args`` overrides, but the
    complementary model (each later cell takes the one of its own seed) and the noise step (every DCLR cell's)."""
    found = dict(o.partition("=")[::2] for o in record["overrides"] if o.startswith(M))
    found = {**found, **record["values"]}
    return {k: v for k, v in found.items() if k not in (f"{M}complementary_model", f"{M}noise_step")}


class Protocol:
    def __init__(self, args: argparse.Namespace) -> None:
        self.args = args
        self.out: Path = args.out
        overlays = ["configs/overlays/offline_wiki.yaml", "configs/overlays/dclr_protocol.yaml", *args.config]
        self.overlays = overlays
        self.seeds = args.seeds
        self.three = ",".join(args.seeds.split(",")[:3])
        self.simcse = ["--config", "configs/simcse_unsup.yaml"]
        self.dclr = ["--config", "configs/dclr.yaml", "--set", f"{M}noise_step=relative"]
        self.dev_seed = args.seeds.split(",")[0]

    # -- running ------------------------------------------------------------------------------------------------
    def grid(self, name: str, base: list[str], *extra: str, seeds: str | None = None, dev_only: bool = False,
             transfer: bool = False, overlays: list[str] | None = None) -> list[str]:
        command = [sys.executable, str(ROOT / "experiments" / "grid.py"), "--name", name, *base[:2],
                   *[a for c in (overlays or self.overlays) for a in ("--config", c)], *base[2:], *extra,
                   "--sts_dir", self.args.sts_dir, "--select", "best", "--threads", str(self.args.threads),
                   "--eval_precision", self.args.eval_precision, "--out", str(self.out), "--records",
                   str(self.args.records), "--seeds", seeds or self.dev_seed, "--jobs", str(self.args.jobs)]
        if dev_only:
            command.append("--dev_only")
        if transfer and self.args.transfer_dir:
            command += ["--transfer_dir", self.args.transfer_dir]
        return command

    def run_stage(self, stage: str, commands: list[list[str]]) -> bool:
        """The stage's grids one after another, each running ``--jobs`` cells at a time."""
        print(f"== stage {stage}: {len(commands)} grid(s)", flush=True)
        start, codes = time.time(), []
        for c in commands:
            print("$ " + shlex.join(c).replace(str(ROOT) + "/", ""), flush=True)
            codes.append(subprocess.run(c, cwd=ROOT).returncode)
        print(f"== stage {stage}: {time.time() - start:.0f} s, exit codes {codes}", flush=True)
        return all(c == 0 for c in codes)

    def known(self) -> list[dict]:
        return records.load_all(self.args.records)

    def choice(self, studies: tuple[str, ...], what: str) -> dict:
        found = [r for s in studies for r in records.select(self.known(), s)]
        chosen = choose(found)
        if chosen is None:
            raise SystemExit(f"error: {what}'s dev search has {len(found)} of {BUDGET} cells in {self.args.records}; "
                             f"run its stage first")
        return chosen

    def simcse_choice(self) -> dict[str, str]:
        chosen = settings(self.choice(("protocol_simcse_dev",), "SimCSE"))
        return {f"{M}augmentation": chosen[f"{M}augmentation"], f"{M}lr": chosen[f"{M}lr"]}

    def dclr_choice(self) -> dict[str, str]:
        return settings(self.choice(("protocol_dclr_dev_phi", "protocol_dclr_dev_quantile"), "DCLR"))

    def comp(self, study: str) -> str:
        """Each seed's complementary model: the cell of that seed in ``study`` (grid.py fills in {seed})."""
        return f"{M}complementary_model={grid.cell_dir(self.out, study) / grid.MODEL}"

    @staticmethod
    def sets(values: dict[str, str]) -> list[str]:
        return [a for k, v in values.items() for a in ("--set", f"{k}={v}")]

    # -- the stages ---------------------------------------------------------------------------------------------
    def stage_simcse_dev(self) -> list[list[str]]:
        return [self.grid("protocol_simcse_dev", self.simcse, "--vary", f"{M}augmentation={','.join(VIEWS)}",
                          "--vary", f"{M}lr={','.join(LRS)}", dev_only=True)]

    def stage_simcse(self) -> list[list[str]]:
        chosen = self.sets(self.simcse_choice())
        return [self.grid("protocol_simcse", self.simcse, *chosen, seeds=self.seeds, transfer=True),
                self.grid("protocol_simcse_dropout", self.simcse, seeds=self.seeds)]

    def stage_dclr_dev(self) -> list[list[str]]:
        base = [*self.dclr, *self.sets(self.simcse_choice()), "--set", self.comp("protocol_simcse")]
        return [self.grid("protocol_dclr_dev_phi", base, "--vary", f"{M}noise_beta={','.join(BETAS)}",
                          "--vary", f"{M}phi={','.join(PHIS)}", dev_only=True),
                self.grid("protocol_dclr_dev_quantile", base, "--vary", f"{M}noise_beta={','.join(BETAS)}",
                          "--vary", f"{M}phi_quantile={','.join(QUANTILES)}", dev_only=True)]

    def stage_final(self) -> list[list[str]]:
        chosen = {**self.dclr_choice(), **self._comp_of("protocol_simcse")}
        dropout = {**chosen, f"{M}augmentation": "dropout", f"{M}lr": "3e-5"}
        return [
            self.grid("protocol_dclr", self.dclr, *self.sets(chosen), seeds=self.seeds, transfer=True),
            self.grid("protocol_dclr_dropout", self.dclr, *self.sets({**dropout, **self._comp_of("protocol_simcse_dropout")}),
                      seeds=self.seeds),
            self.grid("protocol_dclr_noise_only", self.dclr, *self.sets(chosen), "--set", f"{M}use_weighting=false",
                      seeds=self.three, transfer=True),
            self.grid("protocol_dclr_weighting_only", self.dclr, *self.sets(chosen), "--set", f"{M}use_noise=false",
                      seeds=self.three),
        ]

    def _comp_of(self, study: str) -> dict[str, str]:
        key, _, value = self.comp(study).partition("=")
        return {key: value}

    def stage_false_negatives(self) -> list[list[str]]:
        neighbours = ["--set", f"data.init_args.neighbour_batches={START}", "--set", "data.init_args.neighbour_group_size=8"]
        chosen = {**self.dclr_choice(), **self._comp_of("protocol_fn_simcse")}
        return [
            self.grid("protocol_fn_simcse", self.simcse, *self.sets(self.simcse_choice()), *neighbours, seeds=self.three),
            self.grid("protocol_fn_weighting_only", self.dclr, *self.sets(chosen), "--set", f"{M}use_noise=false",
                      *neighbours, seeds=self.three),
            self.grid("protocol_fn_dclr", self.dclr, *self.sets(chosen), *neighbours, seeds=self.three),
        ]

    def stage_distillation(self) -> list[list[str]]:
        chosen = {**self.dclr_choice(), **self._comp_of("protocol_simcse")}
        return [self.grid("protocol_dclr_distill", self.dclr, *self.sets(chosen),
                          "--set", f"{M}use_weighting=false", "--set", f"{M}distillation_weight=1.0", seeds=self.three)]

    def stage_official(self) -> list[list[str]]:
        overlays = ["configs/dclr/official.yaml", *self.overlays]  # the protocol's cadence and selection win
        base = ["--config", "configs/dclr.yaml", "--set", self.comp("protocol_simcse"),
                *self.sets(self.simcse_choice())]
        return [self.grid("protocol_dclr_official", base, seeds=self.three, overlays=overlays)]

    def stage_transfer(self) -> list[list[str]]:
        if not self.args.transfer_dir:
            raise SystemExit("error: the stage transfer needs --transfer_dir (SentEval's transfer tasks)")
        out = []
        for name, normalize in (("protocol_start_transfer", "auto"), ("protocol_start_transfer_raw", "no")):
            out.append([sys.executable, str(ROOT / "experiments" / "grid.py"), "--name", name, "--model", START,
                        "--sts_dir", self.args.sts_dir, "--transfer_dir", self.args.transfer_dir,
                        f"--eval_arg=--normalize={normalize}", "--eval_precision", self.args.eval_precision,
                        "--threads", str(self.args.threads), "--out", str(self.out), "--records",
                        str(self.args.records)])
        return out

    def run(self) -> int:
        ok = True
        for stage in self.args.stages:
            ok &= self.run_stage(stage, getattr(self, f"stage_{stage}")())
        return 0 if ok else 1


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], epilog=__doc__.split("\n\n", 1)[1],
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--sts_dir", required=True, help="the seven STS tasks' files (evaluate.py's --sts_dir)")
    parser.add_argument("--transfer_dir", default=None, help="SentEval's transfer tasks (the arms and the start)")
    parser.add_argument("--seeds", default="42,43,44,45,46", help="the arms' seeds (default 42,...,46)")
    parser.add_argument("--stages", default=",".join(STAGES), help=f"comma-separated, of {', '.join(STAGES)}")
    parser.add_argument("--config", action="append", default=[], help="overlays after the protocol's")
    parser.add_argument("--jobs", type=int, default=2, help="cells of a grid trained at the same time (default 2)")
    parser.add_argument("--threads", type=int, default=1, help="torch threads of each cell")
    parser.add_argument("--eval_precision", default="32", choices=["32", "bf16", "16"])
    parser.add_argument("--records", type=Path, default=records.RECORDS)
    parser.add_argument("--out", type=Path, default=ROOT / "runs" / "grid")
    args = parser.parse_args(argv)
    args.stages = [s.strip() for s in args.stages.split(",") if s.strip()]
    unknown = [s for s in args.stages if s not in STAGES]
    if unknown:
        parser.error(f"--stages: unknown {', '.join(unknown)}; known: {', '.join(STAGES)}")
    args.out = args.out.absolute()
    return Protocol(args).run()


if __name__ == "__main__":
    sys.exit(main())
