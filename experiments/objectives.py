"""What does each objective give here, chosen on dev on one footing? The front page's study, in one resumable
command.

    python experiments/objectives.py --jobs 2 --threads 1 [--data DIR] [--stages start,dev,film,test]

Every objective that trains the transformer starts from all-MiniLM-L6-v2 in its paper's pooling, runs 300 steps
with dev every 100 (``configs/overlays/cpu_dev_choice.yaml``), and gets the same dev budget: the learning rate
in ``LRS``, seed 42, the best checkpoint's mean of STS-B dev and SICK-R dev (stage ``dev``, no test task
scored). The best learning rate of each objective is then trained on seeds 42, 43 and 44, each with its own
batch order, and scored once on the seven test tasks (stage ``test``). ``start`` scores the start model as it is,
in mean pooling and in the first token's state (the cls regime's start); ``film`` runs FILM's three forms as
shipped (one cell each: FILM has no learning rate to search; its deep form trains a linear head only); ``dclr``
runs DCLR at its paper settings with the same budget, its complementary model the chosen SimCSE of the same seed
(after ``test`` has trained it).

Every cell is an ``experiments/grid.py`` cell, so it resumes after a stop, is never overwritten and writes its
record under ``results/objectives_*``; ``experiments/report.py`` builds the front page's table from the records,
with the same choice rule (``choose`` below). Unsupervised SimCSE and DCLR also have a study of their own at a
full epoch (``experiments/dclr_protocol.py``).
"""
from __future__ import annotations

import argparse
import os
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import records
from grid import MODEL, cell_dir
from records import ROOT

LRS = ("1e-5", "3e-5", "5e-5")
SEEDS = "42,43,44"
START = "sentence-transformers/all-MiniLM-L6-v2"
BUDGET = "configs/overlays/cpu_dev_choice.yaml"
# name -> (configs, fixed overrides): the paper config, the overlay pointing it at the offline model and data
OBJECTIVES: dict[str, tuple[tuple[str, ...], tuple[str, ...]]] = {
    "nli_softmax": (("configs/sbert_nli_softmax.yaml", "configs/overlays/offline_nli.yaml"), ()),
    "sts_regression": (("configs/sbert_sts_regression.yaml", "configs/overlays/offline_stsb.yaml"), ()),
    "triplet": (("configs/sbert_triplet.yaml", "configs/overlays/offline_nli.yaml"), ()),
    "mnr": (("configs/mnr_nli.yaml", "configs/overlays/offline_nli.yaml"), ()),
    "mnr_hard_negatives": (("configs/mnr_nli.yaml", "configs/overlays/offline_nli.yaml"),
                           ("data.init_args.view=triplets",)),
    # the paper's batch is 512; 64 here, the CPU budget's (as MNR's)
    "simcse_sup": (("configs/simcse_sup.yaml", "configs/overlays/offline_nli.yaml"),
                   ("data.init_args.per_device_batch_size=64",)),
    # cls pooling with SimCSE's MLP in training only, as the papers: the start's first token is below its target
    "simcse_unsup": (("configs/simcse_unsup.yaml", "configs/overlays/offline_wiki.yaml"), ()),
}
# DCLR at its paper settings, its complementary model the chosen SimCSE of the same seed (it saw the batches, as
# the paper's does): its cells wait for SimCSE's test cells (stage dclr, after test). ``{out}`` is filled in with
# grid.py's --out before the grid runs, and ``{seed}`` by grid.py with each cell's seed
DCLR = (("configs/dclr.yaml", "configs/overlays/offline_wiki.yaml"),
        (f"model.init_args.complementary_model="
         f"{cell_dir('{out}', 'objectives_simcse_unsup', seed='{{seed}}') / MODEL}",))
FILM = {
    "film_tfidf": (("configs/film_tfidf.yaml",), ("data.init_args.train_sources=[{data}/nli/snli.test.tsv,"
                                                  "{data}/nli/mnli.dev_matched.tsv]",)),
    # its features in fp32, as every cell of the study (the config's bf16 gives other numbers on a CPU with bf16 units)
    "film_frozen_encoder": (("configs/film_frozen_encoder.yaml",), ("data.init_args.train_sources=[{data}/nli/"
                                                                    "snli.test.tsv]", "model.init_args.encode_precision=32")),
    "film_deep_triplet": (("configs/film_deep_triplet.yaml", "configs/overlays/offline_nli.yaml", BUDGET), ()),
}
# Two rows of what embedding trainers reach for now, on the same dev budget (run by experiments/campaign.py, which
# mines the file first): MNR with three mined negatives per anchor, beside MNR with NLI's contradiction, and MNR
# with Matryoshka dimensions, beside plain MNR, each scored at the first TRUNCATE_DIMS dimensions too
MINED = "{out}/mined/nli_minilm_3neg.tsv"
MINE = ("--num_negatives", "3", "--range_max", "30", "--relative_margin", "0.05")  # configs/mnr_nli/mined.yaml's
NEWER: dict[str, tuple[tuple[str, ...], tuple[str, ...]]] = {
    "mnr_mined": (("configs/mnr_nli.yaml", "configs/overlays/offline_nli.yaml", "configs/mnr_nli/mined.yaml"),
                  (f"data.init_args.train_sources=[{MINED}]",)),
    "mnr_matryoshka": (("configs/mnr_nli.yaml", "configs/overlays/offline_nli.yaml", "configs/mnr_nli/matryoshka.yaml"),
                       ()),
}
TRUNCATE_DIMS = (256, 128, 64, 32)  # 384, the whole embedding, is the row itself
STAGES = ("dev", "test", "start", "film", "dclr")


def choose(found: list[dict]) -> dict | None:
    """The dev cell with the highest mean of STS-B dev and SICK-R dev at its selected checkpoint (the first of
    equals in learning-rate order), or None when not every learning rate has finished."""
    cells = sorted(found, key=lambda r: LRS.index(r["values"]["model.init_args.lr"]))
    if [r["values"]["model.init_args.lr"] for r in cells] != list(LRS):
        return None
    return max(cells, key=lambda r: (r["dev"]["stsb"] + r["dev"]["sickr"]) / 2)


def grid(args: argparse.Namespace, name: str, configs: tuple[str, ...], sets: tuple[str, ...], *extra: str) -> list[str]:
    command = [sys.executable, str(ROOT / "experiments" / "grid.py"), "--name", name,
               *[a for c in configs for a in ("--config", c)], *[a for s in sets for a in ("--set", s)],
               "--sts_dir", f"{args.data}/sts", "--threads", str(args.threads), "--eval_precision", args.eval_precision,
               "--records", str(args.records), "--out", str(args.out), *extra]
    if args.precision:
        command += ["--set", f"trainer.precision={args.precision}"]
    return command


def test_grid(args: argparse.Namespace, name: str, configs: tuple[str, ...], sets: tuple[str, ...],
              known: list[dict]) -> list[str] | None:
    """The chosen learning rate of ``name``'s dev grid on the test seeds, or None while the grid is unfinished."""
    chosen = choose(records.select(known, f"objectives_dev_{name}"))
    if chosen is None:
        print(f"{name}: its dev grid has not finished; no test cells yet", flush=True)
        return None
    lr = chosen["values"]["model.init_args.lr"]
    return grid(args, f"objectives_{name}", (*configs, BUDGET), (*sets, f"model.init_args.lr={lr}"),
                "--select", "best", "--seeds", SEEDS)


def commands(args: argparse.Namespace, stage: str) -> list[list[str]]:
    data = {"data": args.data}
    if stage == "dev":
        return [grid(args, f"objectives_dev_{name}", (*configs, BUDGET), sets, "--select", "best", "--dev_only",
                     "--vary", f"model.init_args.lr={','.join(LRS)}", "--seeds", "42")
                for name, (configs, sets) in OBJECTIVES.items()]
    if stage == "test":
        known = records.load_all(args.records)
        found = [test_grid(args, name, configs, sets, known) for name, (configs, sets) in OBJECTIVES.items()]
        return [c for c in found if c is not None]
    if stage == "dclr":  # one grid after the other: the test cells need the dev grid's choice
        configs, sets = DCLR[0], tuple(s.format(out=args.out) for s in DCLR[1])
        dev = grid(args, "objectives_dev_dclr", (*configs, BUDGET), sets, "--select", "best", "--dev_only",
                   "--vary", f"model.init_args.lr={','.join(LRS)}", "--seeds", "42")
        subprocess.run(dev, cwd=ROOT)
        final = test_grid(args, "dclr", configs, sets, records.load_all(args.records))
        return [final] if final is not None else []
    if stage == "start":
        return [[sys.executable, str(ROOT / "experiments" / "grid.py"), "--name", f"start_{pooling}", "--model", START,
                 "--pooling", pooling, "--sts_dir", f"{args.data}/sts", "--threads", str(args.threads),
                 "--eval_precision", args.eval_precision, "--records", str(args.records), "--out", str(args.out)]
                for pooling in ("mean", "cls_before_pooler")]
    return [grid(args, name, configs, tuple(s.format(**data) for s in (*sets, "data.init_args.sts_dir={data}/sts")),
                 "--seeds", "42") for name, (configs, sets) in FILM.items()]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--data", default=os.environ.get("SENTEMB_DATA"),
                        help="the data root (docs/DATA.md; default $SENTEMB_DATA), which the offline overlays read")
    parser.add_argument("--stages", default=",".join(STAGES), help=f"comma-separated, of {', '.join(STAGES)}")
    parser.add_argument("--jobs", type=int, default=2, help="cells trained at the same time (default 2)")
    parser.add_argument("--threads", type=int, default=1, help="torch threads of each cell")
    parser.add_argument("--precision", default=None, help="trainer.precision of every cell (default: the overlay's 32)")
    parser.add_argument("--eval_precision", default="32", choices=["32", "bf16", "16"])
    parser.add_argument("--records", type=Path, default=records.RECORDS)
    parser.add_argument("--out", type=Path, default=ROOT / "runs" / "grid")
    args = parser.parse_args(argv)
    if not args.data:
        parser.error("give --data DIR or set SENTEMB_DATA (the data root, docs/DATA.md)")
    args.data = str(Path(args.data).absolute())
    os.environ["SENTEMB_DATA"] = args.data  # the overlays' ${SENTEMB_DATA}, for every cell
    stages = [s.strip() for s in args.stages.split(",") if s.strip()]
    unknown = [s for s in stages if s not in STAGES]
    if unknown:
        parser.error(f"--stages: unknown {', '.join(unknown)}; known: {', '.join(STAGES)}")
    ok = True
    for stage in stages:
        todo = commands(args, stage)
        print(f"== stage {stage}: {len(todo)} grid(s)", flush=True)
        # --jobs grids at a time, each running its cells one after another
        with ThreadPoolExecutor(max_workers=args.jobs) as pool:
            codes = list(pool.map(lambda c: subprocess.run(c, cwd=ROOT).returncode, todo))
        ok &= all(code == 0 for code in codes)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
