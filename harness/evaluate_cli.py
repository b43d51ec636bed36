"""``evaluate.py`` / ``sentemb-evaluate``: SentEval-exact STS evaluation of a checkpoint or a model.

    python evaluate.py --ckpt_path RUN.ckpt --sts_dir DIR [--tasks [sts12,stsb]] [--output results.json]
    python evaluate.py --model sentence-transformers/all-MiniLM-L6-v2 --sts_dir DIR
    python evaluate.py --ckpt_path RUN.ckpt --export DIR [--sts_dir DIR]   # a sentence-transformers directory
    python evaluate.py --ckpt_path RUN.ckpt --sts_dir DIR --truncate_dim [384,256,128,64]   # Matryoshka dimensions
"""
from __future__ import annotations

import json
import os
import sys
from typing import Literal, Optional, Union

import torch

import encoders
from datamodules import STS_TASKS
from datamodules.sts import default_sts_dir
from encoders.sentence import Pooling, SentenceEncoder
from encoders.st_format import check_export_dir, check_exportable, check_truncate_dim
from . import provenance
from .arguments import for_installed
from .cli import exit_on_user_error
from .config_files import run_function_command
from .export import export_run
from .sts_eval import evaluate_sts, format_table
from .transfer import TRANSFER_TASKS, evaluate_transfer, find_downstream, format_transfer_table, task_paths


def load_encoder(ckpt_path: Optional[str], model: Optional[str], pooling: Optional[str]) -> tuple[SentenceEncoder, str]:
    if (ckpt_path is None) == (model is None):
        raise ValueError("give exactly one of --ckpt_path and --model")
    if ckpt_path is not None:
        if pooling is not None:
            raise ValueError("--pooling applies to --model only: a checkpoint's pooling comes from its own config")
        return encoders.load(ckpt_path), os.path.basename(ckpt_path)
    return encoders.load(model, pooling), model


TASK_GROUPS = {"sts": STS_TASKS, "transfer": TRANSFER_TASKS, "all": STS_TASKS + TRANSFER_TASKS}


def parse_tasks(tasks: str | list[str]) -> list[str]:
    """``stsb``, ``stsb,sickr``, ``[stsb, mr]``, a group (``sts``, ``transfer``, ``all``) or a list: the
    task names, checked, in the order given."""
    items = tasks if isinstance(tasks, list) else str(tasks).strip().strip("[]").split(",")
    names = [str(t).strip().strip("'\"") for t in items if str(t).strip()]
    names = list(dict.fromkeys(n for name in names for n in TASK_GROUPS.get(name, (name,))))
    known = STS_TASKS + TRANSFER_TASKS
    unknown = [t for t in names if t not in known]
    if unknown or not names:
        raise ValueError(f"--tasks: {', '.join(unknown) or 'none given'}; choose from {', '.join(known)} "
                         "or a group: sts, transfer, all")
    return names


@exit_on_user_error
def evaluate(
    sts_dir: Optional[str] = None,
    ckpt_path: Optional[str] = None,
    model: Optional[str] = None,
    pooling: Optional[Pooling] = None,
    tasks: Union[str, list[str]] = ",".join(STS_TASKS),
    output: Optional[str] = None,
    batch_size: int = 64,
    precision: Literal["32", "bf16", "16"] = "32",
    device: Optional[str] = None,
    export: Optional[str] = None,
    transfer_dir: Optional[str] = None,
    normalize: Literal["auto", "yes", "no"] = "auto",
    truncate_dim: Union[int, list[int], None] = None,
) -> dict:
    """Evaluate sentence embeddings on the STS tasks (Spearman x 100 of cosine similarity) and
    SentEval's transfer tasks (test accuracy x 100 of SentEval's logistic regression).

    Args:
        sts_dir: the evaluation data: SentEval's data folder (as its and SimCSE's download scripts leave
            it; the transfer tasks need it), or this project's STS layout (sts12.<subset>.tsv ...
            stsb.test.tsv, sickr.test.tsv). Default: SimCSE's senteval.tar from the hub, downloaded once.
        ckpt_path: a checkpoint written by train.py (pooling and model come from its config).
        model: hub name, local Hugging Face directory or sentence-transformers directory.
        pooling: pooling for --model (default: the sentence-transformers config's, else mean).
        tasks: the STS tasks (sts12 ... sickr), the transfer tasks (mr, cr, subj, mpqa, sst2, trec, mrpc), or
            a group (sts, transfer, all): ``stsb``, ``stsb,mr`` or ``[transfer]``; default the seven STS tasks.
        output: write the results as JSON here (never overwrites an existing file).
        batch_size: sentences per encoding batch.
        precision: 32, or bf16/16 autocast.
        device: cpu, cuda, ... (default: cuda when available).
        export: also write the model as a sentence-transformers directory here (new or empty); alone,
            it exports without evaluating; with --sts_dir, the model card holds the results.
        transfer_dir: SentEval's data folder for the transfer tasks when it is not --sts_dir (for
            example STS in this project's TSV layout and the transfer tasks in SentEval's folder).
        normalize: unit-length embeddings: ``auto`` as the model's own pipeline gives them (a
            sentence-transformers folder ending in Normalize, as ``SentenceTransformer.encode`` does), or
            ``yes``/``no``. STS takes cosines, which do not change; the transfer tasks' classifiers see the vectors.
        truncate_dim: score the first D dimensions of each embedding (a Matryoshka model), or each of a list
            ``[384,256,128,64]`` (the sentences are encoded once); normalisation applies to the truncation. With a
            list the results hold one entry per dimension (``by_dim``). With --export (one D) the directory
            records D, so that ``SentenceTransformer(dir, truncate_dim=D)`` and this project's loader agree.
    """
    tasks = parse_tasks(tasks)
    dims = [truncate_dim] if isinstance(truncate_dim, int) else list(truncate_dim or [])
    if any(d < 1 for d in dims) or len(set(dims)) != len(dims):
        raise ValueError(f"--truncate_dim {truncate_dim}: give positive dimensions, each once")
    if export is not None and len(dims) > 1:
        raise ValueError(f"--export records one dimension; give --truncate_dim D (one of {dims}) with --export")
    export_only = export is not None and sts_dir is None and transfer_dir is None
    if export is not None:
        check_export_dir(export)  # before any work
    if export_only and output is not None:
        raise ValueError("--output needs an evaluation: give --sts_dir with --export")
    if output is not None and os.path.exists(output):
        raise FileExistsError(f"{output}: already exists; choose another --output (results are never overwritten)")
    sts = [t for t in tasks if t in STS_TASKS]
    transfer = [t for t in tasks if t in TRANSFER_TASKS]
    if not export_only and sts_dir is None and (sts or transfer_dir is None):
        sts_dir = default_sts_dir()  # the hub's SentEval data, or one error line naming the local ways
    if transfer and not export_only:  # every file before minutes of encoding
        downstream = find_downstream(transfer_dir or sts_dir, transfer)
        for task in transfer:
            task_paths(downstream, task)
    encoder, name = load_encoder(ckpt_path, model, pooling)
    weights = provenance.weights_digest(encoder) if output is not None else None  # as loaded, on the CPU
    for d in dims:
        check_truncate_dim(encoder, d)  # before minutes of evaluation
    if export is not None:
        check_exportable(encoder)
    device = device or ("cuda" if torch.cuda.is_available() else "cpu")
    encoder.to(device)
    if export_only:
        export_run(encoder, export, ckpt_path, source=name, truncate_dim=dims[0] if dims else None)
        return {}
    unit = normalize == "yes" or normalize == "auto" and bool(getattr(encoder, "pipeline_normalizes", False))
    common: dict = {"sts_dir": os.path.abspath(sts_dir)} if sts_dir is not None else {}
    if transfer and transfer_dir is not None:
        common["transfer_dir"] = os.path.abspath(transfer_dir)
    if len(dims) <= 1:
        encode = _encoder_at(encoder, dims[0] if dims else None, batch_size, precision, unit)
        label = f"{name} [{dims[0]} dims]" if dims else name
        results = {**common, **_scores(encode, label, sts, transfer, sts_dir, transfer_dir)}
        if dims:
            results["truncate_dim"] = dims[0]
    else:  # one encoding, scored at each dimension
        full = _remembering(lambda s: encoder.encode(s, batch_size=batch_size, precision=precision))
        by_dim = {}
        for d in dims:
            encode = _at_dim(full, d, unit)
            by_dim[str(d)] = _scores(encode, f"{name} [{d} dims]", sts, transfer, sts_dir, transfer_dir)
        results = {**common, "truncate_dims": dims, "by_dim": by_dim}
        if sts:
            print(f"STS at each dimension ({name}):")
            print(format_table({f"{d} dims": r for d, r in by_dim.items()}, sts))
    if output is not None:
        with open(output, "x") as f:
            json.dump({"model": name, "weights": weights, "pooling": encoder.pooling, "precision": precision,
                       "normalized": unit, **results}, f, indent=2)
        print(f"results written to {output}")
    if export is not None:
        export_run(encoder, export, ckpt_path, results, precision, source=name, truncate_dim=dims[0] if dims else None)
    return results


def _scores(encode, name: str, sts: list[str], transfer: list[str], sts_dir: str | None,
            transfer_dir: str | None) -> dict:
    """The STS and transfer results of one ``encode`` function, with their tables printed."""
    results: dict = {}
    if sts:
        results.update(evaluate_sts(encode, sts_dir, sts, progress=sys.stderr))
        print(format_table({name: results}, sts))
    if transfer:
        found = evaluate_transfer(encode, transfer_dir or sts_dir, transfer, progress=sys.stderr)
        print(format_transfer_table({name: found}, transfer))
        if "avg" in found:  # beside the STS average, under its own name
            found["transfer_avg"] = found.pop("avg")
        results.update(found)
    return results


def _encoder_at(encoder, dim: int | None, batch_size: int, precision: str, unit: bool):
    full = lambda s: encoder.encode(s, batch_size=batch_size, precision=precision)  # noqa: E731
    return _at_dim(full, dim, unit)


def _at_dim(full, dim: int | None, unit: bool):
    """``full``'s embeddings cut to their first ``dim`` dimensions, then normalised when ``unit`` (as
    sentence-transformers truncates before it normalises)."""
    def encode(sentences: list[str]) -> torch.Tensor:
        emb = full(sentences)  # (N, H)
        emb = emb[:, :dim] if dim is not None else emb  # (N, dim)
        return torch.nn.functional.normalize(emb, dim=-1) if unit else emb

    return encode


def _remembering(encode):
    """``encode`` that embeds each call's sentences once, so each Matryoshka dimension reuses them."""
    seen: dict[tuple[str, ...], torch.Tensor] = {}

    def remembered(sentences: list[str]) -> torch.Tensor:
        key = tuple(sentences)
        if key not in seen:
            seen[key] = encode(sentences)
        return seen[key]

    return remembered


EXAMPLES = """\
examples:
  {prog} --ckpt_path runs/X/lightning_logs/version_0/checkpoints/best-step900-stsb85.10.ckpt --output results.json
  {prog} --model sentence-transformers/all-MiniLM-L6-v2 --tasks all
  # without the hub: the evaluation sets of the data root (docs/DATA.md), which stage.py writes
  HF_HUB_OFFLINE=1 {prog} --model sentence-transformers/all-MiniLM-L6-v2 --sts_dir $SENTEMB_DATA/sts \\
      --tasks all --transfer_dir $SENTEMB_DATA/senteval
"""


def main(args: list[str] | None = None) -> None:
    """``python evaluate.py ...`` / ``sentemb-evaluate ...``: options as ``evaluate``'s arguments; an
    unknown or abbreviated option is one error line, as in train.py."""
    _run_cli(args)


@exit_on_user_error
def _run_cli(args: list[str] | None) -> None:
    prog = os.path.basename(sys.argv[0]) or "evaluate.py"
    description = for_installed((evaluate.__doc__ or "").split("\n\n")[0] + "\n\n" + EXAMPLES.format(prog=prog), prog)
    run_function_command(evaluate, prog, description, args)
