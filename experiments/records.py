"""One record per finished cell: the JSON file behind every figure of the docs.

A record is what a reviewer needs to check a figure without the run's machine: the study and cell, every
override and config, the seed and batch order, how the checkpoint was selected (and, for a cell scored on the
test tasks, a digest of the weights scored) and the dev curve it was selected on, the seven test tasks with their
subsets (and the transfer tasks when run), the mechanisms' training scalars, the wall time, and the machine,
versions, precision and commit. Records live in ``results/<study>/<cell>/seed<S>.json`` of the repository and
are committed; ``experiments/report.py`` builds every results table of the docs from them, and nothing else
writes a figure a doc shows.

Checkpoints and event files stay in ``runs/`` (ignored by git); a record holds numbers only.
"""
from __future__ import annotations

import copy
import datetime
import json
import os
import sys
from pathlib import Path
from typing import Any, Iterable

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from harness import provenance  # noqa: E402

RECORDS = ROOT / "results"
SCHEMA = 1
STS = ("sts12", "sts13", "sts14", "sts15", "sts16", "stsb", "sickr")
DEV = ("stsb", "sickr")
TRANSFER = ("mr", "cr", "subj", "mpqa", "sst2", "trec", "mrpc")

# field -> the types it may hold; every record has every field (None where it does not apply)
FIELDS: dict[str, tuple[type, ...]] = {
    "schema": (int,), "study": (str,), "cell": (str,), "values": (dict,), "overrides": (list,),
    "configs": (list,), "seed": (int,), "data_seed": (int, str), "selection": (dict,), "dev_curve": (list,),
    "dev": (dict,), "test": (dict, type(None)), "transfer": (dict, type(None)), "mechanisms": (dict,),
    "wall_s": (int, float), "attempts": (int,), "machine": (dict,), "versions": (dict,), "precision": (dict,),
    "commit": (str, type(None)), "date": (str,),
}
MACHINE_FIELDS = ("cpu", "bf16_units", "cores", "threads", "gpu")
SELECTION_FIELDS = ("rule", "monitor", "step")  # and "weights" in the records that have kept it


class RecordError(ValueError):
    """A record that is missing a field, or holds one of the wrong type; the message names file and key."""


def check(record: dict, where: str) -> dict:
    """``record`` if it has every field with a right type, else a RecordError naming ``where`` and the key."""
    for key, types in FIELDS.items():
        if key not in record:
            raise RecordError(f"{where}: missing field {key!r}")
        if not isinstance(record[key], types) or isinstance(record[key], bool):
            raise RecordError(f"{where}: field {key!r} is {type(record[key]).__name__}, expected "
                              f"{' or '.join(t.__name__ for t in types)}")
    unknown = sorted(set(record) - set(FIELDS))
    if unknown:
        raise RecordError(f"{where}: unknown field {unknown[0]!r}")
    for key in MACHINE_FIELDS:
        if key not in record["machine"]:
            raise RecordError(f"{where}: missing field 'machine.{key}'")
    for key in SELECTION_FIELDS:
        if key not in record["selection"]:
            raise RecordError(f"{where}: missing field 'selection.{key}'")
    if record["test"] is not None:
        for task in (*STS, "avg"):
            if not isinstance(record["test"].get(task), (int, float)):
                raise RecordError(f"{where}: missing field 'test.{task}'")
    return record


def path_of(root: Path, study: str, cell: str, seed: int) -> Path:
    return Path(root) / study / cell / f"seed{seed}.json"


def write(path: Path, record: dict) -> bool:
    """Write a checked record; an existing file is never overwritten. Returns whether it was written
    (False: the same record was already there). A different record at that path is an error."""
    check(record, str(path))
    text = json.dumps(record, indent=1, sort_keys=True) + "\n"
    if path.exists():
        if json.loads(path.read_text()) == json.loads(text):
            return False
        raise RecordError(f"{path}: a different record is already there; records are never overwritten "
                          "(remove it by hand, with its reason in the commit, to replace it)")
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".json.partial")
    tmp.write_text(text)
    os.replace(tmp, path)
    return True


def load(path: Path) -> dict:
    try:
        record = json.loads(Path(path).read_text())
    except json.JSONDecodeError as err:
        raise RecordError(f"{path}:{err.lineno}: not JSON ({err.msg})") from None
    return check(record, str(path))


def load_all(root: Path = RECORDS) -> list[dict]:
    """Every record under ``root``, checked, in path order."""
    return [load(p) for p in sorted(Path(root).glob("**/seed*.json"))]


def select(records: Iterable[dict], study: str, cell: str | None = None, **values: str) -> list[dict]:
    """The records of one study (and cell), optionally those whose ``values`` hold these, sorted by seed."""
    found = [r for r in records if r["study"] == study and (cell is None or r["cell"] == cell)
             and all(r["values"].get(k) == v for k, v in values.items())]
    return sorted(found, key=lambda r: r["seed"])


# -- what a finished run leaves, read back ------------------------------------------------------------------
def attempt(threads: int | None = None) -> dict:
    """The provenance of one attempt at a cell, taken when it starts (a resumed cell has several); ``threads``:
    the torch threads the cell runs with (None: torch's default here)."""
    return {"machine": provenance.machine(threads=threads), "versions": provenance.versions(),
            "commit": provenance.commit(), "started": datetime.datetime.now(datetime.timezone.utc).isoformat(
                timespec="seconds")}


def scalars(directory: Path, tags: Iterable[str] | None = None) -> dict[str, list[tuple[int, float]]]:
    """``tag -> [(step, value), ...]`` from every TensorBoard log below ``directory``, the logs in the order they
    were written (a resumed run's later ``version_*`` last); ``tags`` None: every scalar tag."""
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    files = sorted(Path(directory).glob("**/events.out.tfevents.*"), key=os.path.getmtime)
    logs = list(dict.fromkeys(f.parent for f in reversed(files)))[::-1]  # each folder once, at its newest file
    series: dict[str, list[tuple[int, float]]] = {}
    for log in logs:
        acc = EventAccumulator(str(log), size_guidance={"scalars": 0})
        acc.Reload()
        found = acc.Tags()["scalars"]
        for tag in found if tags is None else set(tags) & set(found):
            series.setdefault(tag, []).extend((e.step, e.value) for e in acc.Scalars(tag))
    return series


def optimizer_step(logged: int) -> int:
    """The optimizer step of a validation logged at TensorBoard step ``logged``: Lightning logs a validation
    inside training at the step before the optimizer step count (the one its checkpoint is named by); the
    start's validation (``validate_first``) is logged at 0, before any step."""
    return logged + 1 if logged > 0 else 0


def dev_curve(series: dict[str, list[tuple[int, float]]]) -> list[dict]:
    """``[{"step", "stsb", "sickr"}, ...]`` of every validation, in step order (the last write of a step wins:
    a resumed run validates again where it stopped)."""
    points: dict[int, dict] = {}
    for name in DEV:
        for logged, value in series.get(f"val/{name}_spearman", []):
            step = optimizer_step(logged)
            points.setdefault(step, {"step": step})[name] = round(float(value), 4)
    return [points[s] for s in sorted(points)]


def mechanisms(series: dict[str, list[tuple[int, float]]]) -> dict[str, dict]:
    """Every ``train/`` scalar but the learning rate: its mean over the logged steps, its last value and count."""
    out = {}
    for tag, points in sorted(series.items()):
        if not tag.startswith("train/") or tag == "train/lr" or not points:
            continue
        values = [v for _, v in points]
        out[tag.removeprefix("train/")] = {"mean": sum(values) / len(values), "last": values[-1], "n": len(values)}
    return out


def run_config(train_dir: Path) -> dict:
    """The resolved config Lightning saved with the newest run below ``train_dir`` (empty if none)."""
    import yaml

    found = sorted(Path(train_dir).glob("**/config.yaml"), key=os.path.getmtime)
    return yaml.safe_load(found[-1].read_text()) if found else {}


def nested(config: dict, key: str, default: Any = None) -> Any:
    node: Any = config
    for part in key.split("."):
        if not isinstance(node, dict) or part not in node:
            return default
        node = node[part]
    return node


def test_scores(results: dict | None) -> dict | None:
    """The seven tasks, their average, subsets and pair counts of an ``evaluate.py`` output; None: none scored."""
    if not results or "avg" not in results:
        return None
    return {**{t: float(results[t]) for t in STS if t in results}, "avg": float(results["avg"]),
            "subsets": results.get("subsets", {}), "pairs": results.get("pairs", {})}


def transfer_scores(results: dict | None) -> dict | None:
    if not results or not any(t in results for t in TRANSFER):
        return None
    keep = (*TRANSFER, "mrpc_f1", "transfer_avg", "transfer_details")
    return {k: results[k] for k in keep if k in results}


def build(*, study: str, cell: str, values: dict, overrides: list[str], configs: list[str], seed: int,
          data_seed: int | str, selection: dict, dev_curve: list, dev: dict, test: dict | None,
          transfer: dict | None, mechanisms: dict, wall_s: float, attempts: list[dict], precision: dict) -> dict:
    """A record from its parts; machine, versions and commit are the last attempt's (the one that finished), and
    ``wall_s`` is that attempt's training and evaluation."""
    last = copy.deepcopy(attempts[-1])
    record = {
        "schema": SCHEMA, "study": study, "cell": cell, "values": values, "overrides": overrides, "configs": configs,
        "seed": seed, "data_seed": data_seed, "selection": selection, "dev_curve": dev_curve, "dev": dev,
        "test": test, "transfer": transfer, "mechanisms": mechanisms, "wall_s": round(float(wall_s), 1), "attempts": len(attempts),
        "machine": last["machine"], "versions": last["versions"], "precision": precision,
        "commit": last["commit"], "date": last["started"][:10],
    }
    return check(record, f"{study}/{cell}/seed{seed}")
