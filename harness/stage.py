"""``stage.py`` / ``sentemb-stage``: put what a config needs from the hub into a data root, for machines without it.

    python stage.py --config configs/simcse_unsup.yaml --root /shared/sentemb-data
    # then, on a compute node without the hub:
    export SENTEMB_DATA=/shared/sentemb-data HF_HUB_OFFLINE=1
    python train.py --config configs/simcse_unsup.yaml --config $SENTEMB_DATA/overlays/simcse_unsup.yaml

Run it where the Hugging Face hub answers (a login node). It reads the configs (and ``--KEY VALUE`` overrides) as
``train.py`` would, and writes into ``--root``, in the layout of docs/DATA.md, which the shipped offline overlays
read too:

- ``models/<hub id>/``: every hub model the config names (the encoder, DCLR's complementary model);
- ``nli/<dataset>.<split>.tsv``, ``sts/stsb.train.tsv`` (any STS training split), ``wiki/<file>``: the training
  data, read and checked by the data modules' own readers, written as this project's TSV;
- ``sts/``: the seven STS evaluation tasks in the TSV layout (STS12-16 by subset, STS-B and SICK-R, all splits,
  so that ``stsb.dev.tsv`` and ``sickr.dev.tsv`` are the dev sets) from SentEval's data (SimCSE's
  ``senteval.tar``, the same file ``evaluate.py`` fetches), and ``senteval/``: SentEval's transfer tasks as
  SentEval lays them out (``evaluate.py --tasks transfer --transfer_dir $SENTEMB_DATA/senteval``);
- ``overlays/<config>.yaml``: an overlay that points the config at all of that through ``${SENTEMB_DATA}``, so the
  root can move (set the variable where it is mounted).

What is already in the root is kept (a rerun adds what a new config needs). ``--no_evaluation`` skips the
evaluation sets. A source that is already local is left where it is.
"""
from __future__ import annotations

import argparse
import contextlib
import os
import shutil
import sys
from pathlib import Path
from typing import Any, Iterator

import yaml

from .launch import DATA_KEYS, MODEL_KEYS, _merged_config, _needs_hub

PLACEHOLDER = "${SENTEMB_DATA}"
TRANSFER_FOLDERS = ("MR", "CR", "SUBJ", "MPQA", "SST", "TREC", "MRPC")


def _walk(node: Any, path: tuple[str, ...] = ()) -> Iterator[tuple[tuple[str, ...], Any]]:
    """Every (key path, value) of a merged config, depth first."""
    if isinstance(node, dict):
        for key, value in node.items():
            yield (*path, str(key)), value
            yield from _walk(value, (*path, str(key)))


def _set(tree: dict, path: tuple[str, ...], value: Any) -> None:
    node = tree
    for key in path[:-1]:
        node = node.setdefault(key, {})
    node[path[-1]] = value


def _clean(text: str) -> str:
    """A sentence as a TSV field: this project's TSV has no quoting, so a tab or line end becomes a space."""
    return " ".join(str(text).replace("\t", " ").split())


def _write_tsv(path: Path, header: list[str], rows: Iterator[list[Any]]) -> int:
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(path.suffix + ".partial")
    n = 0
    with open(tmp, "w", encoding="utf-8") as f:
        f.write("\t".join(header) + "\n")
        for row in rows:
            f.write("\t".join(_clean(v) if isinstance(v, str) else str(v) for v in row) + "\n")
            n += 1
    os.replace(tmp, path)
    return n


def _split_of(source: str) -> str:
    """The split a source names: ``x:validation`` -> validation; a hub file ``.../validation/0000.parquet`` too."""
    if source.startswith("hf://"):
        parts = source.split("/")
        return parts[-2] if len(parts) > 1 and parts[-2] in ("train", "validation", "test", "dev") else "dev"
    return source.rsplit(":", 1)[-1]


def _file_name(source: str) -> str:
    """``snli:train`` -> ``snli.train``; ``nyu-mll/glue:qqp:train`` -> ``nyu-mll__glue.qqp.train``."""
    return source.replace("/", "__").replace(":", ".")


class StagingError(ValueError):
    """Staging needs the hub and it has no answer here: one line naming what was being staged and the way on."""


WAY_FORWARD = ("run stage.py (or sentemb-stage) on a machine where the hub answers (a login node) and point "
               "SENTEMB_DATA at its root here, or skip staging: train with a configs/overlays/offline_*.yaml overlay "
               "(the offline all-MiniLM-L6-v2) or give a local path")


@contextlib.contextmanager
def from_hub(what: str):
    """Staging ``what`` (``model 'bert-base-uncased'``, a data source): a failure because the hub has no answer
    (HF_HUB_OFFLINE set, or its host unreachable) becomes one line naming ``what`` and the way forward, in place
    of huggingface_hub's advice, which offline would be to set HF_HUB_OFFLINE=0."""
    from huggingface_hub import constants

    from encoders.hub import hub_offline, hub_unreachable_reason, is_unreachable_error

    try:
        yield
    except Exception as err:
        from datamodules.io import DataError

        # the data modules' own answer when the hub has none (it names the hub): reworded for staging
        hub_data_error = isinstance(err, DataError) and "Hugging Face" in str(err)
        if not (is_unreachable_error(err) or hub_data_error):
            raise
        if hub_offline():
            raise StagingError(f"{what}: staging downloads from the Hugging Face hub, and HF_HUB_OFFLINE is set here; "
                               f"{WAY_FORWARD}") from None
        reason = hub_unreachable_reason(constants.ENDPOINT)
        if reason is None and not is_unreachable_error(err):
            raise  # the hub answers: the data error is the source's own
        raise StagingError(f"{what}: staging downloads from the Hugging Face hub, which cannot be reached "
                           f"({reason or type(err).__name__}); {WAY_FORWARD}") from None


class Stager:
    def __init__(self, root: Path) -> None:
        self.root = root
        self.overlay: dict = {}
        self.done: list[str] = []

    def say(self, what: str) -> None:
        self.done.append(what)
        print(f"staged {what}", flush=True)

    def model(self, path: tuple[str, ...], name: str) -> None:
        from huggingface_hub import snapshot_download

        target = self.root / "models" / name
        if not (target / "config.json").is_file() and not (target / "modules.json").is_file():
            with from_hub(f"model {name!r}"):
                snapshot_download(name, local_dir=str(target))
        _set(self.overlay, path, f"{PLACEHOLDER}/models/{name}")
        self.say(f"model {name} -> {target}")

    def training(self, source: str, data_class: str) -> str:
        """Write one hub training source as a local file; returns its path under the placeholder."""
        with from_hub(source):
            return self._training(source, data_class)

    def _training(self, source: str, data_class: str) -> str:
        from datamodules.io import fetch_hub_file, is_hub_file, load_source
        from datamodules.nli import LABELS, load_nli
        from datamodules.scored import load_sts_pairs

        if is_hub_file(source) and source.endswith(".txt"):  # sentences (wiki1m_for_simcse.txt): copied as they are
            name = source.rsplit("/", 1)[1]
            target = self.root / "wiki" / name
            if not target.exists():
                target.parent.mkdir(parents=True, exist_ok=True)
                shutil.copyfile(fetch_hub_file(source), target)
            self.say(f"{source} -> {target}")
            return f"{PLACEHOLDER}/{target.relative_to(self.root)}"
        columns = set(load_source(source).column_names)
        if {"premise", "hypothesis"} <= columns:
            rows = load_nli(source)
            target = self.root / "nli" / f"{_file_name(source)}.tsv"
            n = _write_tsv(target, ["premise", "hypothesis", "label"],
                           ([p, h, LABELS[y]] for p, h, y in zip(rows["premise"], rows["hypothesis"], rows["label"])))
        elif {"sentence1", "sentence2"} <= columns or {"sentence_A", "sentence_B"} <= columns:
            pairs = load_sts_pairs(source)  # scores rescaled to [0, 1] from the source's own scale
            sick = "sick" in source.lower()
            target = self.root / "sts" / f"{'sickr' if sick else 'stsb'}.{_split_of(source)}.tsv"
            low, high = (1.0, 5.0) if sick else (0.0, 5.0)  # the TSV layout's scales, known by the file name
            n = _write_tsv(target, ["sentence1", "sentence2", "score"],
                           ([a, b, f"{low + s * (high - low):.4f}"] for a, b, s in
                            zip(pairs["sentence1"], pairs["sentence2"], pairs["score"])))
        else:
            raise ValueError(f"{source} ({data_class}): columns {sorted(columns)} are neither NLI (premise, "
                             "hypothesis, label) nor STS (sentence1, sentence2, score); stage it by hand")
        self.say(f"{source} -> {target} ({n} rows)")
        return f"{PLACEHOLDER}/{target.relative_to(self.root)}"

    def evaluation(self) -> None:
        """The STS tasks in the TSV layout, and SentEval's transfer tasks, from SimCSE's senteval.tar."""
        from datamodules.sts import (SENTEVAL_SPLIT_FILES, SENTEVAL_SUBSETS, STS_TASKS, default_sts_dir, load_sts_task,
                                     read_senteval_split)

        with from_hub("SentEval's STS and transfer data (SimCSE's senteval.tar)"):
            downstream = Path(default_sts_dir())
        sts = self.root / "sts"
        for task in STS_TASKS:
            if task in SENTEVAL_SUBSETS:
                parts = load_sts_task(str(downstream), task)
            else:  # every split the archive has: dev is what training validates on (data.sts_dir)
                parts = {split: read_senteval_split(str(downstream), task, split)
                         for split, path in SENTEVAL_SPLIT_FILES[task].items() if (downstream / path).is_file()}
            for part, pairs in parts.items():
                low, high = (1.0, 5.0) if task == "sickr" else (0.0, 5.0)
                _write_tsv(sts / f"{task}.{part}.tsv", ["sentence1", "sentence2", "score"],
                           ([a, b, f"{low + s * (high - low):.4f}"] for a, b, s in
                            zip(pairs["sentence1"], pairs["sentence2"], pairs["score"])))
        self.say(f"the seven STS tasks and the STS-B and SICK-R splits -> {sts}")
        found = [f for f in TRANSFER_FOLDERS if (downstream / f).is_dir()]
        for folder in found:
            target = self.root / "senteval" / folder
            if not target.exists():
                shutil.copytree(downstream / folder, target)
        missing = sorted(set(TRANSFER_FOLDERS) - set(found))
        self.say(f"SentEval's transfer tasks ({', '.join(found) or 'none'}) -> {self.root / 'senteval'}"
                 + (f"; not in the archive: {', '.join(missing)}" if missing else ""))
        _set(self.overlay, ("data", "init_args", "sts_dir"), f"{PLACEHOLDER}/sts")


def stage(args: list[str], root: Path, evaluation: bool = True) -> Path:
    """Stage what the command line ``args`` (``--config ...`` and overrides) needs into ``root``; returns the
    overlay written for it."""
    config = _merged_config(args)
    configs = [args[i + 1] for i, a in enumerate(args[:-1]) if a in ("--config", "-c")]
    if not configs:
        raise ValueError("give the config to stage with --config (and its overlays, as for train.py)")
    stager = Stager(root)
    for path, value in _walk(config):
        if path[-1] in MODEL_KEYS and isinstance(value, str) and value != "self" and _needs_hub(value):
            stager.model(path, value)
    data_class = str((config.get("data") or {}).get("class_path", ""))
    init = (config.get("data") or {}).get("init_args") or {}
    for key in DATA_KEYS:
        value = init.get(key)
        if key == "val_sources" and isinstance(value, dict):
            dev = {name: source for name, source in value.items() if name not in ("stsb", "sickr") or not evaluation}
            staged = {name: stager.training(source, data_class) if _is_hub(source) else source
                      for name, source in dev.items()}
            if staged:
                _set(stager.overlay, ("data", "init_args", "val_sources"), staged)
        elif isinstance(value, list):
            _set(stager.overlay, ("data", "init_args", key),
                 [stager.training(s, data_class) if _is_hub(s) else s for s in value])
        elif isinstance(value, str) and _is_hub(value):
            _set(stager.overlay, ("data", "init_args", key), stager.training(value, data_class))
    if evaluation:
        stager.evaluation()
    name = Path(configs[0]).stem
    overlay = root / "overlays" / f"{name}.yaml"
    overlay.parent.mkdir(parents=True, exist_ok=True)
    header = (f"# Written by stage.py for {' + '.join(configs)}: the staged model and data of the data root\n"
              "# (export SENTEMB_DATA=<this root>, HF_HUB_OFFLINE=1), merged after the config:\n"
              f"#   python train.py --config {configs[0]} --config $SENTEMB_DATA/overlays/{name}.yaml\n")
    overlay.write_text(header + yaml.safe_dump(stager.overlay, sort_keys=False))
    print(f"overlay: {overlay}\nthen, where the hub cannot be reached:\n  export SENTEMB_DATA={root} HF_HUB_OFFLINE=1\n"
          f"  python train.py {' '.join(f'--config {c}' for c in configs)} --config $SENTEMB_DATA/overlays/{name}.yaml")
    return overlay


def _is_hub(source: str) -> bool:
    from datamodules.io import is_hub_file, is_local
    from encoders.paths import data_path

    if "SENTEMB_" in source:
        return False
    return is_hub_file(source) or not is_local(data_path(source))


def main(argv: list[str] | None = None) -> int:
    from .cli import exit_on_user_error

    from .arguments import for_installed

    prog = os.path.basename(sys.argv[0]) or "stage.py"
    parser = argparse.ArgumentParser(prog=prog,
                                     usage="%(prog)s --config CONFIG [--config OVERLAY ...] [--KEY VALUE ...] --root DIR",
                                     description="Put what a config needs from the hub into a data root, for machines "
                                                 "without the hub.", epilog=for_installed(__doc__.split("\n\n", 1)[1], prog),
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--root", type=Path, default=None,
                        help="the data root to fill (default: $SENTEMB_DATA)")
    parser.add_argument("--no_evaluation", action="store_true", help="skip the STS and transfer evaluation sets")
    known, rest = parser.parse_known_args(argv)
    root = known.root or (Path(os.environ["SENTEMB_DATA"]) if os.environ.get("SENTEMB_DATA") else None)
    if root is None:
        parser.error("give --root DIR (or set SENTEMB_DATA)")
    exit_on_user_error(lambda: stage(rest, root.absolute(), evaluation=not known.no_evaluation))()
    return 0
