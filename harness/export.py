"""Export a run as a sentence-transformers directory with a model card (``evaluate.py --export``)."""
from __future__ import annotations

import importlib
import inspect
import json
import os
from pathlib import Path
from typing import Any, Mapping

import yaml

from datamodules.sts import SENTEVAL_PAIRS, STS_TASKS
from encoders.sentence import SentenceEncoder
from encoders.st_format import uses_head_at_eval, write_sentence_transformers_dir

from .checkpoint import load_checkpoint
from .sts_eval import format_table
from .transfer import TRANSFER_TASKS, format_transfer_table


def _objective_summary(objective: str | None) -> str:
    """``module.Class`` and the first line of its docstring (which names the paper)."""
    if not objective:
        return "not recorded"
    module, _, name = objective.rpartition(".")
    try:
        doc = getattr(importlib.import_module(module), name).__doc__ or ""
    except (ImportError, AttributeError):
        doc = ""
    first = " ".join(doc.strip().split("\n\n")[0].split())
    return f"`{name}` ({objective})" + (f": {first}" if first else "")


def optimizer_summary(model_args: Mapping[str, Any]) -> str:
    """The optimizer and schedule a run trained with, in words; keys the run config lacks take the
    objective base class's defaults (runs from before ``optimizer`` existed all used AdamW)."""
    from lightning_modules.base import SentenceEmbeddingModule

    args = {name: p.default for name, p in inspect.signature(SentenceEmbeddingModule.__init__).parameters.items()
            if p.default is not inspect.Parameter.empty}
    args.update({k: v for k, v in model_args.items() if k in args})
    if args["optimizer"] == "adam":
        text = f"Adam without weight decay (the SBERT paper's), peak lr {args['lr']:g}"
    else:
        text = (f"AdamW, weight decay {args['weight_decay']:g} (not on biases and LayerNorm weights), "
                f"peak lr {args['lr']:g}")
    return text + f"; linear warmup over {args['warmup_ratio']:.0%} of the steps, then a {args['scheduler']} schedule"


def _yaml_value(value: Any) -> str:
    if isinstance(value, (dict, list)):
        return f"`{json.dumps(value)}`"
    return f"`{value}`"


def _table(rows: Mapping[str, Any]) -> list[str]:
    lines = ["| setting | value |", "|---|---|"]
    lines += [f"| {k} | {_yaml_value(v)} |" for k, v in rows.items()]
    return lines


def model_card(
    encoder: SentenceEncoder,
    name: str,
    checkpoint: Mapping[str, Any] | None,
    results: Mapping[str, Any] | None,
    eval_precision: str,
    source: str | None,
    truncate_dim: int | None = None,
) -> str:
    """The README.md of an exported model: what it is, how it was trained, how it scores (at ``truncate_dim``
    dimensions when given)."""
    checkpoint = checkpoint or {}
    encoder_config = dict(checkpoint.get("encoder_config") or encoder.config_dict)
    run = yaml.safe_load(checkpoint["run_config"]) if checkpoint.get("run_config") else {}
    base = str(encoder_config.get("model_name", ""))
    head = "Dense (Linear + Tanh, SimCSE's MLP)" if uses_head_at_eval(encoder) else None
    pooling_text = {"mean": "mean of the token states", "max": "max over the token states",
                    "cls": "first token ([CLS]) state", "cls_before_pooler": "first token ([CLS]) state"}[encoder.pooling]
    if encoder.mlp is not None and not head:
        pooling_text += " (the MLP head was used in training only and is not part of this model)"

    lines = ["---", "library_name: sentence-transformers", "pipeline_tag: sentence-similarity",
             "tags:", "- sentence-transformers", "- sentence-similarity", "- feature-extraction"]
    if base and not os.path.exists(base) and not base.startswith((".", "/", "~")):
        lines.append(f"base_model: {base}")
    lines += ["---", "", f"# {name}", "",
              f"A sentence encoder fine-tuned from `{base}` with this project's PyTorch Lightning code"
              + (f" (exported from `{source}`)." if source else "."), "",
              "```python", "from sentence_transformers import SentenceTransformer", "",
              f'model = SentenceTransformer("{name}"' + (f", truncate_dim={truncate_dim})" if truncate_dim else ")"),
              'embeddings = model.encode(["A man is playing a guitar.", "Someone plays an instrument."])',
              "```", "", "## Architecture", "",
              f"- Transformer: `{base}` ({type(encoder.transformer).__name__}, hidden size "
              f"{encoder.transformer.config.hidden_size}), "
              f"inputs up to {encoder.eval_max_length} tokens",
              f"- Pooling: {pooling_text}"]
    if head:
        lines.append(f"- {head}, {encoder.transformer.config.hidden_size} -> {encoder.transformer.config.hidden_size}")
    if getattr(encoder, "projection", None) is not None:
        p = encoder.projection
        lines.append(f"- Dense (linear projection, no activation), {p.in_features} -> {p.out_features}")
    if truncate_dim:
        lines += [f"- Embedding dimension {encoder.dim}, used at its first {truncate_dim} (a Matryoshka truncation: "
                  f"`truncate_dim: {truncate_dim}` in config_sentence_transformers.json, which this project's loader "
                  "applies; sentence-transformers takes it as the `truncate_dim` argument); compare embeddings with "
                  "cosine similarity", ""]
    else:
        lines += [f"- Embedding dimension {encoder.dim}; compare embeddings with cosine similarity", ""]

    lines += ["## Training", ""]
    if not checkpoint:
        lines += ["Not trained by this project's `train.py` (exported from a model directory).", ""]
    else:
        model_args = dict((run.get("model") or {}).get("init_args") or {})
        model_args.pop("encoder", None)
        data = run.get("data") or {}
        trainer = run.get("trainer") or {}
        lines += [f"- Objective: {_objective_summary(checkpoint.get('objective'))}",
                  f"- Data: `{data.get('class_path', 'not recorded')}`",
                  f"- Optimizer: {optimizer_summary(model_args)}", ""]
        data_args = {k: v for k, v in (data.get("init_args") or {}).items() if v is not None}
        hyper = {f"encoder.{k}": v for k, v in encoder_config.items()}
        hyper.update({f"model.{k}": v for k, v in model_args.items()})
        hyper.update({f"data.{k}": v for k, v in data_args.items()})
        hyper.update({f"trainer.{k}": trainer[k] for k in (
            "precision", "max_steps", "max_epochs", "accumulate_grad_batches", "devices", "num_nodes", "strategy")
            if trainer.get(k) is not None})
        if run.get("seed_everything") is not None:
            hyper["seed_everything"] = run["seed_everything"]
        if "global_step" in checkpoint:
            hyper["optimizer steps taken"] = checkpoint["global_step"]
        lines += _table(hyper) + [""]

    lines += ["## Evaluation", ""]
    tasks = [t for t in STS_TASKS if t in (results or {})]
    if tasks:
        lines += [f"{evaluation_data_text(results, tasks)}. Spearman x 100 of cosine similarity, STS12-16 in "
                  f"SentEval's \"all\" setting; measured before export with precision {eval_precision}:", "",
                  format_table({name: results}, tasks), ""]
    transfer = [t for t in TRANSFER_TASKS if t in (results or {})]
    if transfer:
        lines += ["SentEval's transfer tasks (test accuracy x 100 of SentEval's logistic regression; MRPC "
                  "accuracy/F1):", "", format_transfer_table({name: transfer_row(results)}, transfer), ""]
    if not tasks and not transfer:
        lines += ["Not evaluated at export time: `python evaluate.py --ckpt_path RUN.ckpt --sts_dir DIR` gives the STS table.", ""]

    if checkpoint.get("run_config"):
        lines += ["## Full training configuration", "", "<details><summary>config.yaml</summary>", "",
                  "```yaml", checkpoint["run_config"].rstrip("\n"), "```", "", "</details>", ""]
    return "\n".join(lines)


def transfer_row(results: Mapping[str, Any]) -> dict[str, Any]:
    """evaluate.py's results as ``format_transfer_table`` reads them: its ``avg`` is the transfer average."""
    row = {k: v for k, v in results.items() if k != "avg"}
    if "transfer_avg" in row:
        row["avg"] = row["transfer_avg"]
    return row


def evaluation_data_text(results: Mapping[str, Any], tasks: list[str]) -> str:
    """Which data the model card's scores come from: SentEval's STS test sets only when every task has
    SentEval's pair count; otherwise the folder and its counts, marked as not comparable with papers.
    One sentence without its end punctuation."""
    pairs = dict(results.get("pairs") or {})
    where = f" read from `{results['sts_dir']}`" if results.get("sts_dir") else ""
    if all(pairs.get(t) == SENTEVAL_PAIRS[t] for t in tasks):
        counts = ", ".join(f"{t} {pairs[t]}" for t in tasks)
        return f"SentEval's STS test sets{where} (pairs: {counts}), comparable with the papers' tables"
    counts = ", ".join(f"{t} {pairs.get(t, 'unknown')} (SentEval: {SENTEVAL_PAIRS[t]})" for t in tasks)
    return (f"STS scores on a sample, not SentEval's test sets, so not comparable with the papers' tables: "
            f"data{where or ' not recorded'}, pairs: {counts}")


def export_run(
    encoder: SentenceEncoder,
    path: str,
    ckpt_path: str | None = None,
    results: Mapping[str, Any] | None = None,
    eval_precision: str = "32",
    source: str | None = None,
    truncate_dim: int | None = None,
) -> Path:
    """``evaluate.py --export``: the model card's metadata comes from the checkpoint file itself."""
    checkpoint = None
    if ckpt_path is not None:
        full = load_checkpoint(ckpt_path)
        checkpoint = {k: full[k] for k in ("encoder_config", "objective", "run_config", "global_step") if k in full}
    target = export_sentence_transformers(encoder, path, checkpoint, results, eval_precision, source or ckpt_path,
                                          truncate_dim)
    print(f"sentence-transformers model written to {target}")
    return target


def export_sentence_transformers(
    encoder: SentenceEncoder,
    path: str,
    checkpoint: Mapping[str, Any] | None = None,
    results: Mapping[str, Any] | None = None,
    eval_precision: str = "32",
    source: str | None = None,
    truncate_dim: int | None = None,
) -> Path:
    """Write ``encoder`` as a sentence-transformers directory at ``path``, with its model card.

    Args:
        encoder: the trained encoder (its pooling and head decide the modules).
        path: new or empty directory.
        checkpoint: the checkpoint dict it came from (``objective``, ``run_config``,
            ``encoder_config``) for the model card; None for a model that was not trained here.
        results: ``evaluate_sts`` output, shown in the model card.
        eval_precision: the precision the results were computed in.
        source: where the model came from (checkpoint path or model name), for the card.
        truncate_dim: record that the model is used at its first this many dimensions (Matryoshka).
    """
    truncate_dim = truncate_dim or getattr(encoder, "truncate_dim", None)
    card = model_card(encoder, Path(path).absolute().name, checkpoint, results, eval_precision, source, truncate_dim)
    return write_sentence_transformers_dir(encoder, path, card, truncate_dim)
