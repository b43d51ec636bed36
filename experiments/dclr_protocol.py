"""Does DCLR beat SimCSE under the papers' protocol? The acting DCLR end to end: every grid of the protocol,
its dev-only choice of the setting, and the experiments that use the choice, in one resumable command.

    python experiments/dclr_protocol.py --sts_dir $SENTEMB_DATA/sts --jobs 2 --threads 1

Each grid is a ``experiments/grid.py`` call (printed before it runs), so each cell resumes and is never
overwritten. The grids of a stage run at the same time when their cells fit in ``--jobs``. The stages:

1. ``arms``: SimCSE on seeds ``--seeds`` (batch order = seed): the SimCSE arm, and the complementary model
   that saw the batches (SimCSE of the same seed); SimCSE on batch order 1000, dev only: the
   complementary model that never saw them.
2. ``dev``: the first seed, dev only: noise beta x weighting quantile (3 x 3, the complementary model that saw the
   batches). Beside it, cells that need no DCLR choice: SimCSE's positive augmentations (first seed) and
   SimCSE's data fractions.
3. ``dev2``: the first seed, dev only: one factor at a time around the best cell of ``dev``: k (noise_ratio 2, 4),
   the fixed threshold phi 0.5 and 0.7 in place of the quantile, and the complementary model that never saw
   the batches. Beside it, SimCSE's augmentations on the second and third seeds.
   **The choice**: the dev cell (of ``dev`` and ``dev2``) with the highest mean of STS-B dev and SICK-R dev at
   its best checkpoint, written to ``OUT/protocol_choice.json``. No test task has been scored for it.
4. ``final``: the chosen setting on ``--seeds`` (the seven test tasks scored once, here), its two halves
   (noise only: ``use_weighting=false``; weighting only: ``use_noise=false``), and the chosen setting with the
   other complementary model.
5. ``extra``: the chosen setting under each positive augmentation (the first three seeds) and data fraction
   (the first seed), and distillation in place of weighting (the first three seeds).
6. ``transfer``: SentEval's transfer tasks (``--transfer_dir``) for the first seed's models of both arms.

``--stages`` runs a prefix or a selection (a later stage needs the choice of ``dev2``); ``--deadline S`` starts no
stage after S seconds (a stage that started runs to its end). ``--config`` adds overlays after the
protocol's (the test suite's smoke run uses it for the tiny model).
"""
from __future__ import annotations

import argparse
import json
import shlex
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from records import ROOT
STAGES = ("arms", "dev", "dev2", "final", "extra", "transfer")
AUGMENTATIONS = ("token_shuffle", "token_cutoff", "span_cutoff", "feature_cutoff")
# data.init_args.fraction: 30 % keeps 124 steps (dev every 50); the smaller ones validate at their epoch's end
FRACTIONS_LARGE = ("0.3",)
FRACTIONS_SMALL = ("0.1", "0.03", "0.01", "0.003")
M = "model.init_args."


class Protocol:
    def __init__(self, args: argparse.Namespace) -> None:
        self.args = args
        self.out: Path = args.out
        overlays = ["configs/overlays/offline_wiki.yaml", "configs/overlays/dclr_protocol.yaml", *args.config]
        self.common = [a for c in overlays for a in ("--config", c)] + [
            "--sts_dir", args.sts_dir, "--select", "best", "--threads", str(args.threads),
            "--eval_precision", args.eval_precision, "--out", str(self.out)]
        self.simcse = ["--config", "configs/simcse_unsup.yaml"]
        self.acting = ["--config", "configs/dclr.yaml", "--set", f"{M}noise_step=relative"]
        self.dev_seed = args.seeds.split(",")[0]  # the dev grid's, the data fractions' and the transfer models'
        self.three_seeds = ",".join(args.seeds.split(",")[:3])  # augmentations and distillation
        # the complementary models: SimCSE of the cell's seed (grid.py fills in {seed})
        self.comp_saw, self.comp_never = (f"{M}complementary_model={self.out / name}/base/seed{{seed}}/model.ckpt"
                                          for name in ("protocol_simcse", "protocol_simcse_order1000"))

    # -- running ---------------------------------------------------------------------------------------------
    def grid(self, name: str, base: list[str], *extra: str, seeds: str | None = None, dev_only: bool = False,
             cells: int = 1) -> list[str]:
        seeds = seeds or self.dev_seed
        command = [sys.executable, str(ROOT / "experiments" / "grid.py"), "--name", name, *base[:2],
                   *self.common, *base[2:], *extra, "--seeds", seeds, "--jobs", str(cells)]
        return command + (["--dev_only"] if dev_only else [])

    def run_stage(self, stage: str, commands: list[list[str]]) -> bool:
        """The stage's grids at the same time when their cells fit in ``--jobs``, else one after another with
        ``--jobs`` cells each."""
        cells = [int(c[c.index("--jobs") + 1]) if "--jobs" in c else 1 for c in commands]
        together = sum(cells) <= self.args.jobs
        if not together:
            for c in commands:
                if "--jobs" in c:
                    c[c.index("--jobs") + 1] = str(min(self.args.jobs, int(c[c.index("--jobs") + 1])))
        print(f"== stage {stage}: {len(commands)} command(s), {sum(cells)} cell(s), "
              f"{'at the same time' if together else 'one after another'}", flush=True)
        for c in commands:
            print("$ " + shlex.join(c).replace(str(ROOT) + "/", ""), flush=True)
        start = time.time()
        with ThreadPoolExecutor(max_workers=len(commands) if together else 1) as pool:
            codes = list(pool.map(lambda c: subprocess.run(c, cwd=ROOT, stdout=subprocess.DEVNULL).returncode,
                                  commands))
        print(f"== stage {stage}: {time.time() - start:.0f} s, exit codes {codes}", flush=True)
        return all(c == 0 for c in codes)

    # -- the choice --------------------------------------------------------------------------------------------
    def dev_mean(self, cell: Path) -> float | None:
        try:
            dev = json.loads((cell / "dev.json").read_text())
            return (dev["stsb"] + dev["sickr"]) / 2
        except (OSError, KeyError, ValueError):
            return None

    def dev_cells(self, grid: str) -> list[tuple[float, Path]]:
        cells = [(self.dev_mean(c), c) for c in sorted((self.out / grid).glob(f"*/seed{self.dev_seed}"))]
        return [(m, c) for m, c in cells if m is not None]

    def settings(self, cell: Path) -> list[str]:
        """The cell's model overrides as ``KEY=VALUE`` (read from its ``command`` file), the seed as ``{seed}``."""
        words = shlex.split((cell / "command").read_text())
        keep = []
        for flag, value in zip(words, words[1:]):
            if flag.startswith(f"--{M}") and flag != f"--{M}noise_step":
                keep.append(f"{flag[2:]}={value}")
        return [w.replace(f"/seed{self.dev_seed}/", "/seed{seed}/") for w in keep]

    def best_dev(self, grids: list[str]) -> tuple[float, Path]:
        found = [mc for g in grids for mc in self.dev_cells(g)]
        if not found:
            raise SystemExit(f"error: no finished dev cell in {', '.join(grids)} under {self.out}")
        return max(found, key=lambda mc: mc[0])

    def choice(self) -> dict:
        path = self.out / "protocol_choice.json"
        if path.exists():
            return json.loads(path.read_text())
        raise SystemExit(f"error: {path} is missing: run the stages arms, dev and dev2 first")

    # -- the stages ----------------------------------------------------------------------------------------------
    def stage_arms(self) -> list[list[str]]:
        n = len(self.args.seeds.split(","))
        return [self.grid("protocol_simcse", self.simcse, seeds=self.args.seeds, cells=n),
                self.grid("protocol_simcse_order1000", self.simcse, "--set", "data.init_args.seed=1000",
                          seeds=self.args.seeds, dev_only=True, cells=n)]

    def stage_dev(self) -> list[list[str]]:
        return [
            self.grid("protocol_dev_noise_weighting", self.acting, "--set", self.comp_saw,
                      "--vary", f"{M}noise_beta=0.05,0.1,0.2", "--vary", f"{M}phi_quantile=0.95,0.98,0.99",
                      dev_only=True, cells=9),
            self.grid("protocol_simcse_augment", self.simcse, "--vary", f"{M}augmentation={','.join(AUGMENTATIONS)}",
                      cells=len(AUGMENTATIONS)),
            *self.fraction_grids("protocol_simcse_fraction", self.simcse, []),
        ]

    def fraction_grids(self, name: str, base: list[str], chosen: list[str]) -> list[list[str]]:
        return [self.grid(name, base, *chosen, "--vary", f"data.init_args.fraction={','.join(FRACTIONS_LARGE)}",
                          dev_only=True, cells=len(FRACTIONS_LARGE)),
                self.grid(name + "_small", base, *chosen, "--set", "trainer.val_check_interval=1.0",
                          "--vary", f"data.init_args.fraction={','.join(FRACTIONS_SMALL)}", dev_only=True,
                          cells=len(FRACTIONS_SMALL))]

    def stage_dev2(self) -> list[list[str]]:
        mean, best = self.best_dev(["protocol_dev_noise_weighting"])
        around = self.settings(best)
        beta = next(s for s in around if s.startswith(f"{M}noise_beta="))
        quantile = next(s for s in around if s.startswith(f"{M}phi_quantile="))
        print(f"best of the noise x weighting grid: {best.parent.name} (dev mean {mean:.2f})", flush=True)
        return [
            self.grid("protocol_dev_k", self.acting, "--set", self.comp_saw, "--set", beta, "--set", quantile,
                      "--vary", f"{M}noise_ratio=2,4", dev_only=True, cells=2),
            self.grid("protocol_dev_phi", self.acting, "--set", self.comp_saw, "--set", beta,
                      "--vary", f"{M}phi=0.5,0.7", dev_only=True, cells=2),
            self.grid("protocol_dev_comp_never", self.acting, "--set", self.comp_never, "--set", beta, "--set", quantile,
                      dev_only=True),
            self.grid("protocol_simcse_augment", self.simcse, "--vary", f"{M}augmentation={','.join(AUGMENTATIONS)}",
                      seeds=self.three_seeds, cells=2 * len(AUGMENTATIONS)),
        ]

    def choose(self) -> dict:
        grids = ["protocol_dev_noise_weighting", "protocol_dev_k", "protocol_dev_phi", "protocol_dev_comp_never"]
        mean, best = self.best_dev(grids)
        sets = self.settings(best)
        table = {str(c.relative_to(self.out).parent): round(m, 3) for g in grids for m, c in self.dev_cells(g)}
        chosen = {"cell": str(best.relative_to(self.out)), "dev_mean": round(mean, 3), "sets": sets,
                  "complementary": "never" if "protocol_simcse_order1000" in " ".join(sets) else "saw",
                  "dev_grid": table}
        (self.out / "protocol_choice.json").write_text(json.dumps(chosen, indent=2) + "\n")
        print(f"chosen on dev: {chosen['cell']} (dev mean {mean:.2f}): {' '.join(sets)}", flush=True)
        return chosen

    def stage_final(self) -> list[list[str]]:
        chosen = self.choice()
        sets = [a for s in chosen["sets"] for a in ("--set", s)]
        other = self.comp_saw if chosen["complementary"] == "never" else self.comp_never
        other_sets = [a for s in chosen["sets"] if "complementary_model" not in s for a in ("--set", s)]
        n = len(self.args.seeds.split(","))
        seeds = self.args.seeds
        return [
            self.grid("protocol_dclr", self.acting, *sets, seeds=seeds, cells=n),
            self.grid("protocol_dclr_noise_only", self.acting, *sets, "--set", f"{M}use_weighting=false",
                      seeds=seeds, cells=n),
            self.grid("protocol_dclr_weighting_only", self.acting, *sets, "--set", f"{M}use_noise=false",
                      seeds=seeds, cells=n),
            self.grid("protocol_dclr_comp_" + ("saw" if other == self.comp_saw else "never"), self.acting, *other_sets,
                      "--set", other, seeds=seeds, cells=n),
        ]

    def stage_extra(self) -> list[list[str]]:
        chosen = self.choice()
        sets = [a for s in chosen["sets"] for a in ("--set", s)]
        return [
            self.grid("protocol_dclr_augment", self.acting, *sets,
                      "--vary", f"{M}augmentation={','.join(AUGMENTATIONS)}", seeds=self.three_seeds,
                      cells=3 * len(AUGMENTATIONS)),
            *self.fraction_grids("protocol_dclr_fraction", self.acting, sets),
            self.grid("protocol_dclr_distill", self.acting, *sets, "--set", f"{M}use_weighting=false",
                      "--set", f"{M}distillation_weight=1.0", seeds=self.three_seeds, cells=3),
        ]

    def stage_transfer(self) -> list[list[str]]:
        if not self.args.transfer_dir:
            raise SystemExit("error: the stage transfer needs --transfer_dir (SentEval's transfer tasks)")
        commands = []
        for name in ("protocol_simcse", "protocol_dclr"):
            cell = self.out / name / "base" / f"seed{self.dev_seed}"
            commands.append([sys.executable, str(ROOT / "evaluate.py"), "--ckpt_path", str(cell / "model.ckpt"),
                             "--tasks", "transfer", "--transfer_dir", self.args.transfer_dir,
                             "--sts_dir", self.args.sts_dir, "--output", str(cell / "transfer.json")])
        return commands

    def run(self) -> int:
        start = time.time()
        ok = True
        for stage in self.args.stages:
            if self.args.deadline and time.time() - start > self.args.deadline:
                print(f"== deadline: stage {stage} and later not started", flush=True)
                break
            ok &= self.run_stage(stage, getattr(self, f"stage_{stage}")())
            if stage == "dev2":
                self.choose()
        return 0 if ok else 1


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--sts_dir", required=True, help="the seven STS tasks' files (evaluate.py's --sts_dir)")
    parser.add_argument("--seeds", default="42,43,44,45,46", help="the arms' seeds (default 42,...,46)")
    parser.add_argument("--stages", default=",".join(STAGES), help=f"comma-separated, of {', '.join(STAGES)}")
    parser.add_argument("--config", action="append", default=[], help="overlays after the protocol's")
    parser.add_argument("--jobs", type=int, default=2, help="cells trained at the same time (default 2)")
    parser.add_argument("--threads", type=int, default=1, help="torch threads of each cell")
    parser.add_argument("--transfer_dir", default=None, help="SentEval's transfer tasks, for the stage transfer")
    parser.add_argument("--eval_precision", default="bf16", choices=["32", "bf16", "16"])
    parser.add_argument("--deadline", type=float, default=0, help="start no stage after this many seconds (0: none)")
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
