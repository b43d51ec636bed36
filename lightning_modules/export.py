"""Export a trained encoder as a sentence-transformers directory, with a model card.

    python evaluate.py --ckpt_path RUN.ckpt --export DIR [--sts_dir DIR]

``SentenceTransformer(DIR)`` then gives the same embeddings as ``SentenceEncoder.encode``:

- the transformer and its tokenizer (``save_pretrained``) in the directory's root;
- ``1_Pooling``: mean, max, or the first token (``cls`` and ``cls_before_pooler``);
- ``2_Dense``: SimCSE's Linear + Tanh head, only when the run used it at evaluation (``cls``
  pooling with ``mlp_head`` and not ``mlp_only_train``); a head used in training only is dropped;
- a further ``N_Dense`` (no activation) for the encoder's linear ``projection``, when it has one;
- ``modules.json``, ``sentence_bert_config.json``, ``config_sentence_transformers.json``;
- ``README.md``: objective, data, hyperparameters and, when evaluated, the STS table.

Heads an objective owns (NLISoftmax's classifier) live outside the encoder and are never
exported. ``max_seq_length`` is the encoder's evaluation length (the model's maximum), because
that is how this project encodes at evaluation; the training truncation length is recorded in
the model card. The files are written in the legacy layout (``sentence_transformers.models.*``
module names, pooling flags), which every sentence-transformers release since 2.x loads, and
without importing sentence-transformers. The directory is built next to ``DIR`` and moved into
place at the end, so a failed export leaves nothing half-written, and an existing non-empty
``DIR`` is never overwritten.
"""
from __future__ import annotations

import importlib
import json
import os
import shutil
import tempfile
from pathlib import Path
from typing import Any, Mapping

import torch
import transformers
import yaml
from safetensors.torch import save_file

from .encoder import SentenceEncoder

POOLING_FLAGS = {  # our pooling -> the sentence-transformers Pooling flag that reproduces it
    "mean": "pooling_mode_mean_tokens",
    "max": "pooling_mode_max_tokens",
    "cls": "pooling_mode_cls_token",
    "cls_before_pooler": "pooling_mode_cls_token",
}


def check_export_dir(path: str) -> None:
    """Fail before any work when ``path`` exists and is not an empty directory."""
    if os.path.isdir(path):
        if os.listdir(path):
            raise FileExistsError(f"{path}: export directory exists and is not empty; choose another --export "
                                  "(an export never overwrites)")
    elif os.path.exists(path):
        raise FileExistsError(f"{path}: exists and is not a directory; choose another --export")


def check_exportable(encoder: Any) -> None:
    """Only the transformer-based SentenceEncoder has a sentence-transformers equivalent."""
    if not isinstance(encoder, SentenceEncoder):
        raise ValueError(f"--export writes SentenceEncoder models only; this checkpoint holds a {type(encoder).__name__}")


def uses_head_at_eval(encoder: SentenceEncoder) -> bool:
    return encoder.mlp is not None and encoder.pooling == "cls" and not encoder.mlp_only_train


def export_sentence_transformers(
    encoder: SentenceEncoder,
    path: str,
    checkpoint: Mapping[str, Any] | None = None,
    results: Mapping[str, Any] | None = None,
    eval_precision: str = "32",
    source: str | None = None,
) -> Path:
    """Write ``encoder`` as a sentence-transformers directory at ``path`` and return it.

    Args:
        encoder: the trained encoder (its pooling and head decide the modules).
        path: new or empty directory.
        checkpoint: the checkpoint dict it came from (``objective``, ``run_config``,
            ``encoder_config``) for the model card; None for a model that was not trained here.
        results: ``evaluate_sts`` output, shown in the model card.
        eval_precision: the precision the results were computed in.
        source: where the model came from (checkpoint path or model name), for the card.
    """
    check_exportable(encoder)
    check_export_dir(path)
    target = Path(path).absolute()
    target.parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=f".{target.name}.export-", dir=target.parent))
    try:
        _write_modules(encoder, staging)
        card = model_card(encoder, target.name, checkpoint, results, eval_precision, source)
        (staging / "README.md").write_text(card, encoding="utf-8")
        check_export_dir(path)  # nothing appeared meanwhile
        if target.is_dir():
            target.rmdir()
        os.replace(staging, target)
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)
        raise
    return target


def _write_json(path: Path, obj: Any) -> None:
    path.write_text(json.dumps(obj, indent=2) + "\n", encoding="utf-8")


def _write_modules(encoder: SentenceEncoder, out: Path) -> None:
    transformer = encoder.transformer
    was_training = transformer.training
    transformer.eval()
    try:
        transformer.save_pretrained(out, safe_serialization=True)
    finally:
        transformer.train(was_training)
    encoder.tokenizer.save_pretrained(out)
    modules = [
        {"idx": 0, "name": "0", "path": "", "type": "sentence_transformers.models.Transformer"},
        {"idx": 1, "name": "1", "path": "1_Pooling", "type": "sentence_transformers.models.Pooling"},
    ]
    # Evaluation never truncates below the model's maximum: neither may the exported model.
    _write_json(out / "sentence_bert_config.json", {"max_seq_length": encoder.eval_max_length, "do_lower_case": False})
    (out / "1_Pooling").mkdir()
    hidden = transformer.config.hidden_size
    pooling = {"word_embedding_dimension": hidden, "pooling_mode_cls_token": False,
               "pooling_mode_mean_tokens": False, "pooling_mode_max_tokens": False,
               "pooling_mode_mean_sqrt_len_tokens": False}
    pooling[POOLING_FLAGS[encoder.pooling]] = True
    _write_json(out / "1_Pooling" / "config.json", pooling)
    heads = []  # (linear, activation) in the order forward() applies them
    if uses_head_at_eval(encoder):
        heads.append((encoder.mlp[0], "torch.nn.modules.activation.Tanh"))  # Sequential(Linear, Tanh)
    projection = getattr(encoder, "projection", None)
    if projection is not None:
        heads.append((projection, "torch.nn.modules.linear.Identity"))
    for linear, activation in heads:
        idx = len(modules)
        folder = f"{idx}_Dense"
        (out / folder).mkdir()
        _write_json(out / folder / "config.json", {
            "in_features": linear.in_features, "out_features": linear.out_features, "bias": linear.bias is not None,
            "activation_function": activation,
        })
        weights = {"linear.weight": linear.weight.detach().float().contiguous().cpu()}
        if linear.bias is not None:
            weights["linear.bias"] = linear.bias.detach().float().contiguous().cpu()
        save_file(weights, str(out / folder / "model.safetensors"))
        modules.append({"idx": idx, "name": str(idx), "path": folder, "type": "sentence_transformers.models.Dense"})
    _write_json(out / "modules.json", modules)
    _write_json(out / "config_sentence_transformers.json", {
        "model_type": "SentenceTransformer",
        "__version__": {"transformers": transformers.__version__, "pytorch": torch.__version__},
        "prompts": {}, "default_prompt_name": None, "similarity_fn_name": "cosine",
    })


# -- model card ---------------------------------------------------------------------------------
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
) -> str:
    """The README.md of an exported model: what it is, how it was trained, how it scores."""
    from .sts_eval import format_table  # imports scipy and the datamodules: only when writing a card

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
              f'model = SentenceTransformer("{name}")',
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
                  f"- Data: `{data.get('class_path', 'not recorded')}`", ""]
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
    if results:
        tasks = [t for t in ("sts12", "sts13", "sts14", "sts15", "sts16", "stsb", "sickr") if t in results]
        lines += ["SentEval-exact STS (Spearman x 100 of cosine similarity; STS12-16 in SentEval's \"all\" "
                  f"setting, STS-B and SICK-R test sets), measured before export with precision {eval_precision}:", "",
                  format_table({name: results}, tasks), ""]
    else:
        lines += ["Not evaluated at export time: `python evaluate.py --ckpt_path RUN.ckpt --sts_dir DIR` gives the STS table.", ""]

    if checkpoint.get("run_config"):
        lines += ["## Full training configuration", "", "<details><summary>config.yaml</summary>", "",
                  "```yaml", checkpoint["run_config"].rstrip("\n"), "```", "", "</details>", ""]
    return "\n".join(lines)


def export_run(
    encoder: SentenceEncoder,
    path: str,
    ckpt_path: str | None = None,
    results: Mapping[str, Any] | None = None,
    eval_precision: str = "32",
    source: str | None = None,
) -> Path:
    """``evaluate.py --export``: the model card's metadata comes from the checkpoint file itself."""
    from .checkpoint import load_checkpoint

    checkpoint = None
    if ckpt_path is not None:
        full = load_checkpoint(ckpt_path)
        checkpoint = {k: full[k] for k in ("encoder_config", "objective", "run_config", "global_step") if k in full}
    target = export_sentence_transformers(encoder, path, checkpoint, results, eval_precision, source or ckpt_path)
    print(f"sentence-transformers model written to {target}")
    return target


# -- loading a sentence-transformers directory back --------------------------------------------
ST_MODULES_IGNORED = ("Normalize",)  # a unit-length rescaling: cosine similarities do not change


def load_sentence_transformers_dir(path: str, pooling: str | None = None) -> SentenceEncoder:
    """A ``SentenceEncoder`` equal to ``SentenceTransformer(path)`` up to normalisation.

    Reads ``modules.json``: the Transformer, the Pooling (or ``pooling`` when given), then Dense
    modules, which are rebuilt as this project's heads: a Linear + Tanh Dense right after
    first-token pooling is SimCSE's MLP head (``cls`` with ``mlp_head``, kept at evaluation), a
    Dense without activation is the linear ``projection``. ``Normalize`` is skipped, since the
    STS evaluation takes cosines. Any other module, or a Dense this encoder cannot represent, is an
    error naming it: evaluating the directory without it would give numbers for another model.
    """
    from .encoder import pooling_of_sentence_transformers_dir

    root = Path(path)
    modules = json.loads((root / "modules.json").read_text())
    dense: list[tuple[str, dict[str, Any]]] = []
    transformer_dir = root
    for module in modules:
        kind = module.get("type", "").rsplit(".", 1)[-1]
        if kind == "Transformer":
            transformer_dir = root / module.get("path", "")  # "" (the root) or "0_Transformer" (older layouts)
        if kind in ("Transformer", "Pooling") or kind in ST_MODULES_IGNORED:
            continue
        if kind != "Dense":
            raise ValueError(f"{root / 'modules.json'}: module {module.get('path')!r} of type {module.get('type')!r} "
                             "is not supported by this project's encoder")
        dense.append((module["path"], json.loads((root / module["path"] / "config.json").read_text())))
    st_pooling = pooling_of_sentence_transformers_dir(str(root)) or "mean"
    if dense and pooling is not None and pooling != st_pooling:
        raise ValueError(f"{path}: --pooling {pooling} cannot replace the pooling of a directory with Dense modules")
    pooling = pooling or st_pooling
    activations = [cfg.get("activation_function", "torch.nn.modules.activation.Tanh").rsplit(".", 1)[-1]
                   for _, cfg in dense]
    mlp = bool(activations) and activations[0] == "Tanh"
    rest = activations[1:] if mlp else activations
    if mlp and pooling != "cls_before_pooler" or rest not in ([], ["Identity"]):
        raise ValueError(f"{path}: Dense modules {[p for p, _ in dense]} with activations {activations} after "
                         f"{pooling} pooling: only [Tanh] after first-token pooling and a final [Identity] are supported")
    projection_dim = dense[-1][1]["out_features"] if rest else None
    encoder = SentenceEncoder(str(transformer_dir), pooling="cls" if mlp else pooling, mlp_head=mlp,
                              projection_dim=projection_dim)
    linears = ([encoder.mlp[0]] if mlp else []) + ([encoder.projection] if rest else [])
    for (folder, cfg), linear in zip(dense, linears):
        if (cfg["in_features"], cfg["out_features"]) != (linear.in_features, linear.out_features):
            raise ValueError(f"{root / folder}: Dense {cfg['in_features']} -> {cfg['out_features']} does not follow "
                             f"a {linear.in_features}-dimensional input")
        linear.load_state_dict(_dense_weights(root / folder, with_bias=cfg.get("bias", True)))
    return encoder.eval()


def _dense_weights(folder: Path, with_bias: bool) -> dict[str, torch.Tensor]:
    if (folder / "model.safetensors").is_file():
        from safetensors.torch import load_file

        state = load_file(str(folder / "model.safetensors"))
    elif (folder / "pytorch_model.bin").is_file():
        state = torch.load(folder / "pytorch_model.bin", map_location="cpu", weights_only=True)
    else:
        raise ValueError(f"{folder}: no model.safetensors or pytorch_model.bin")
    keys = ["linear.weight"] + (["linear.bias"] if with_bias else [])
    missing = [k for k in keys if k not in state]
    if missing:
        raise ValueError(f"{folder}: weights lack {missing}")
    weight = state["linear.weight"]
    bias = state["linear.bias"] if with_bias else torch.zeros(weight.shape[0], dtype=weight.dtype)
    return {"weight": weight, "bias": bias}
