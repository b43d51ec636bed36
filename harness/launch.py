"""``train.py``'s first second: does the run need the Hugging Face hub, and can it reach it?

Importing Lightning and transformers takes several seconds before a run looks at its config. A
run whose hub is unreachable (HF_HUB_OFFLINE unset, no network) would spend them, and then meet the
hub. This reads the configs and overrides with YAML alone, finds the hub models and hub data the run
names, and when the hub's host does not answer a connection within seconds, ends with the one
error line that the run itself would give, before those imports. Nothing here is needed for a
correct run: a config it cannot read is left to the full command line, which explains the error.
"""
from __future__ import annotations

import os
import sys
from typing import Any, Iterable, Iterator, Sequence

MODEL_KEYS = ("model_name", "complementary_model")
DATA_KEYS = ("train_source", "train_sources", "val_sources")
LOCAL_SUFFIXES = (".tsv", ".csv", ".jsonl", ".json", ".txt", ".parquet", ".ckpt")


def _merged_config(args: Sequence[str]) -> dict[str, Any]:
    """The configs and ``--a.b.c value`` overrides of a command line, merged in order (YAML only)."""
    import yaml

    from .arguments import resolve_config_args

    merged: dict[str, Any] = {}
    args = resolve_config_args(args)
    i = 0
    while i < len(args):
        arg = args[i]
        if not arg.startswith("--"):
            i += 1
            continue
        key, value = (arg[2:].split("=", 1) + [None])[:2] if "=" in arg else (arg[2:], None)
        if value is None:
            value = args[i + 1] if i + 1 < len(args) and not args[i + 1].startswith("--") else None
            i += 1
        i += 1
        if value is None:
            continue
        if key in ("config", "c"):
            with open(value) as f:
                _merge(merged, yaml.safe_load(f) or {})
        else:
            node = merged
            *parents, last = key.split(".")
            for part in parents:
                node = node.setdefault(part, {}) if isinstance(node.get(part), dict) or part not in node else {}
            node[last] = yaml.safe_load(value)
    return merged


def _merge(into: dict, new: dict) -> None:
    for key, value in new.items():
        if isinstance(value, dict) and isinstance(into.get(key), dict):
            _merge(into[key], value)
        else:
            into[key] = value


def _values(config: Any, keys: Sequence[str]) -> Iterator[str]:
    """Every string under one of ``keys``, at any depth (lists and dicts of sources included)."""
    if isinstance(config, dict):
        for key, value in config.items():
            if key in keys:
                items = value.values() if isinstance(value, dict) else value if isinstance(value, list) else [value]
                yield from (v for v in items if isinstance(v, str))
            else:
                yield from _values(value, keys)
    elif isinstance(config, list):
        for item in config:
            yield from _values(item, keys)


def _without_replaced_dev_sets(config: Any) -> Any:
    """``data.sts_dir`` replaces the ``stsb`` and ``sickr`` dev sets by name (``SentenceDataModule``)."""
    data = (config.get("data") or {}).get("init_args") or {} if isinstance(config, dict) else {}
    if isinstance(data, dict) and data.get("sts_dir") and isinstance(data.get("val_sources"), dict):
        data["val_sources"] = {k: v for k, v in data["val_sources"].items() if k not in ("stsb", "sickr")}
    return config


def _is_hub_data(source: str) -> bool:
    if source.startswith("hf://"):
        return True
    return not os.path.exists(source) and not source.lower().endswith(LOCAL_SUFFIXES)


PATH_KEYS = (*DATA_KEYS, "sts_dir")  # where a config names local data, maybe under ${SENTEMB_DATA}


def unfilled_placeholder(paths: Iterable[str]) -> str | None:
    """The error of a path under ``${SENTEMB_DATA}`` while that variable is not set (``encoders.paths``)."""
    from encoders.paths import PathError, data_path

    for path in paths:
        try:
            data_path(path)
        except PathError as err:
            return str(err)
    return None


def missing_model_path(names: Iterable[str]) -> str | None:
    """The error of a model named by a local-looking path that does not exist (never a hub id), or by a folder
    that holds no model."""
    from encoders.hub import looks_like_path
    from encoders.paths import PathError, data_path

    for name in names:  # a missing *.ckpt start is the checkpoint loader's to name
        try:
            name = data_path(name)
        except PathError as err:
            return str(err)
        path = os.path.expanduser(name)
        if looks_like_path(name) and not name.endswith(".ckpt") and not os.path.exists(path):
            return f"no such model directory: {name}"
        if os.path.isdir(path) and not any(os.path.isfile(os.path.join(path, f)) for f in ("config.json", "modules.json")):
            return f"{name}: not a model directory (no config.json or modules.json)"
    return None


def hub_error(args: Sequence[str]) -> str | None:
    """The error line for a run that needs an unreachable hub, or None (reachable, offline, or not needed)."""
    from encoders.hub import hub_offline, hub_unreachable_reason

    try:
        config = _without_replaced_dev_sets(_merged_config(args))
    except Exception:  # unreadable: the full command line will say why
        return None
    missing = missing_model_path(_values(config, MODEL_KEYS)) or unfilled_placeholder(_values(config, PATH_KEYS))
    if missing is not None:
        return missing
    if hub_offline():
        return None
    models = [m for m in _values(config, MODEL_KEYS) if m != "self" and _needs_hub(m)]
    data = [s for s in _values(config, DATA_KEYS) if _is_hub_data(s)]
    if not models and not data:
        return None
    from huggingface_hub import constants

    reason = hub_unreachable_reason(constants.ENDPOINT)
    if reason is None:
        return None
    for model in models:
        if (error := _uncached_model_error(model, reason)) is not None:
            return error
    if data:
        return (f"{data[0]}: the Hugging Face hub cannot be reached ({reason}); to work offline, set HF_HUB_OFFLINE=1 (a "
                "copy already in the Hugging Face cache is then used as it is), add a configs/overlays/offline_*.yaml "
                "overlay, or give a local file in its place")
    return None


SENTEVAL_TAR = "hf://datasets/princeton-nlp/datasets-for-simcse/senteval.tar"  # datamodules.sts's, not imported:
# importing the data modules takes seconds (datasets, torch); tests hold the two equal


def _options(args: Sequence[str]) -> dict[str, str]:
    """``--key value`` and ``--key=value`` pairs of a flat command line (evaluate.py's)."""
    out, i = {}, 0
    while i < len(args):
        arg = args[i]
        if arg.startswith("--") and "=" in arg:
            key, value = arg[2:].split("=", 1)
            out[key] = value
        elif arg.startswith("--") and i + 1 < len(args) and not args[i + 1].startswith("--"):
            out[arg[2:]] = args[i + 1]
            i += 1
        elif arg.startswith("--"):
            out[arg[2:]] = ""
        i += 1
    return out


def evaluate_hub_error(args: Sequence[str]) -> str | None:
    """evaluate.py's first second: a missing model path, or a hub model or the hub's STS data with
    the hub unreachable, is one error line before torch is imported. A ``--config`` file is left to
    the full command line (it may name the data)."""
    from encoders.hub import hub_offline, hub_unreachable_reason

    options = _options(args)
    if "config" in options or "help" in options:
        return None
    model = options.get("model") or None
    missing = missing_model_path([model] if model else [])
    if missing is not None or hub_offline():
        return missing
    needs_model = model is not None and _needs_hub(model)
    tasks = options.get("tasks", "sts")
    only_transfer = "transfer_dir" in options and not any(
        t.strip(" []'\"") in ("sts", "all") or t.strip(" []'\"").startswith(("sts", "sick"))
        for t in tasks.split(","))
    needs_data = not any(k in options for k in ("sts_dir", "export")) and not only_transfer
    if not needs_model and not needs_data:
        return None
    from huggingface_hub import constants, try_to_load_from_cache

    reason = hub_unreachable_reason(constants.ENDPOINT)
    if reason is None:
        return None
    repo, filename = SENTEVAL_TAR.removeprefix("hf://datasets/").rsplit("/", 1)
    if needs_data and not isinstance(try_to_load_from_cache(repo, filename, repo_type="dataset"), str):
        return (f"{SENTEVAL_TAR} (the STS evaluation data): the Hugging Face hub cannot be reached ({reason}); give "
                "--sts_dir DIR with this project's TSV layout or SentEval's data folder (docs/EVALUATION.md), "
                "or set HF_HUB_OFFLINE=1 to use a copy already in the Hugging Face cache")
    return _uncached_model_error(model, reason) if needs_model else None


def _needs_hub(model: str) -> bool:
    """A model name that only the hub (or its cache) can give: not a folder or path, not the verified offline copy."""
    from encoders.hub import OFFLINE_MODEL_NAMES, looks_like_path, verified_offline_copy

    if "SENTEMB_" in model:  # a path under a placeholder (${SENTEMB_DATA}/models/...): never a hub id
        return False
    return (not os.path.exists(model) and not looks_like_path(model)
            and not (model in OFFLINE_MODEL_NAMES and verified_offline_copy() is not None))


def _uncached_model_error(model: str, reason: str) -> str | None:
    """The error line for a hub model when the hub cannot be reached (``reason``) and its cache has no copy."""
    from encoders.hub import OFFLINE_WAYS, _cached_snapshot

    if _cached_snapshot(model) is not None:
        return None
    return f"model {model!r}: the Hugging Face hub cannot be reached ({reason}) and its cache has no copy; {OFFLINE_WAYS}"


def _checked(check) -> None:
    """One error line and exit 2 when ``check`` finds the command line cannot run (``SENTEMB_DEBUG``
    skips it, so that the full command line shows its traceback)."""
    message = None if os.environ.get("SENTEMB_DEBUG") else check(sys.argv[1:])
    if message is not None:
        print(f"error: {message}", file=sys.stderr)
        sys.exit(2)


TRAIN_HELP = """\
usage: {prog} --config CONFIG [--config OVERLAY ...] [--KEY VALUE ...]

Train any objective: a paper config, overlays merged after it in order, any key overridden. Each run gets its
own directory under trainer.default_root_dir with the resolved config.yaml, TensorBoard logs and checkpoints.

examples:
  # no hub and no data to fetch: the offline all-MiniLM-L6-v2 on the sample pairs that ship with the package
  {prog} --config configs/quickstart.yaml
  {prog} --config configs/quickstart.yaml --trainer.max_epochs 1 --model.init_args.lr 3e-5
  # a paper's setting, its model and data from the hub
  {prog} --config configs/sbert_sts_regression.yaml
  # without the hub: the offline model, the data root of docs/DATA.md, the CPU budget
  export SENTEMB_DATA=$HOME/sentemb-data HF_HUB_OFFLINE=1
  {prog} --config configs/simcse_unsup.yaml --config configs/overlays/offline_wiki.yaml \\
      --config configs/overlays/cpu_300_steps.yaml
  # a config's model and data, staged where the hub answers, for nodes where it does not
  python stage.py --config configs/simcse_unsup.yaml --root /shared/sentemb-data

common options:
  --config FILE                 a config; configs/NAME.yaml finds a shipped one from any folder
  --trainer.max_steps N         or --trainer.max_epochs N
  --trainer.precision P         32, bf16-mixed (GPUs, and CPUs with bf16 units), 16-mixed
  --trainer.devices N           with --trainer.accelerator cpu|gpu and --trainer.strategy ddp
  --trainer.default_root_dir D  where runs go (one experiment per folder)
  --model.init_args.lr LR       the peak learning rate
  --model.init_args.encoder.init_args.model_name NAME
                                a hub id, a model folder, or a *.ckpt of this project to start from
  --data.init_args.per_device_batch_size N
                                examples per device and step (the global batch is this x devices)
  --seed_everything N           the seed, and the batch order unless data.init_args.seed is set
  --ckpt_path last              resume the run furthest into training (none yet: start from scratch)
  --print_config                print the merged config and exit (a key that does not exist is refused)
  --model.help CLASS            every option of one objective, e.g. --model.help SimCSE
  --help_all                    every option of every group (several hundred lines)

Every config's paper setting: docs/TRAINING.md; the SLURM scripts: docs/CLUSTER.md.
"""


def short_help(argv: list[str], text: str) -> list[str]:
    """``-h``/``--help``: print ``text`` (the common options) and exit; ``--help_all``: the parser's full help."""
    if "--help_all" in argv:
        return ["--help" if a == "--help_all" else a for a in argv]
    if "-h" in argv or "--help" in argv:
        from .arguments import for_installed

        prog = os.path.basename(sys.argv[0]) or "train.py"
        print(for_installed(text.format(prog=prog), prog))
        sys.exit(0)
    return argv


def evaluate() -> None:
    """``sentemb-evaluate`` and ``python evaluate.py``: the hub check, then the full command line."""
    _checked(evaluate_hub_error)
    from .evaluate_cli import main

    main()


def slurm_error(args: Sequence[str]) -> str | None:
    """Under srun: the Trainer's layout against the step's (``harness.slurm_layout``); the rendezvous port set."""
    from .slurm_layout import layout_error, set_master_port, under_srun

    if not under_srun(os.environ):
        return None
    try:
        config = _merged_config(args)
    except Exception:  # unreadable: the full command line will say why
        return None
    set_master_port(os.environ)
    return layout_error(config, os.environ)


def train() -> None:
    """``sentemb-train`` and ``python train.py``: the short help, the hub check, under srun the layout check,
    then the full command line."""
    sys.argv[1:] = short_help(sys.argv[1:], TRAIN_HELP)
    _checked(hub_error)
    message = None if os.environ.get("SENTEMB_DEBUG") else slurm_error(sys.argv[1:])
    if message is not None:  # every rank stops; one says why
        if os.environ.get("SLURM_PROCID", "0") == "0":
            print(f"error: {message}", file=sys.stderr)
        sys.exit(2)
    from .train_cli import main

    main()
