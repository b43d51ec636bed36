"""The sentence-transformers directory format, written and read back.

    python evaluate.py --ckpt_path RUN.ckpt --export DIR [--sts_dir DIR]   (harness/export.py adds the card)

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

import json
import os
import shutil
import tempfile
from pathlib import Path
from typing import Any

import torch
import transformers
from safetensors.torch import save_file

from .sentence import Pooling, SentenceEncoder

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


def write_sentence_transformers_dir(encoder: SentenceEncoder, path: str, card: str = "",
                                    truncate_dim: int | None = None) -> Path:
    """Write ``encoder`` as a sentence-transformers directory at ``path`` (new or empty) and return it.

    ``card`` is the directory's README.md (``harness.export.model_card`` writes one for a run).
    ``truncate_dim`` (a Matryoshka model used at D dimensions) is recorded as ``truncate_dim`` in
    ``config_sentence_transformers.json``: this project's loader truncates to it, and
    ``SentenceTransformer(path, truncate_dim=D)`` gives the same vectors (sentence-transformers takes the
    dimension as an argument and leaves the key alone; the model card says so).
    """
    check_exportable(encoder)
    check_export_dir(path)
    check_truncate_dim(encoder, truncate_dim)
    truncate_dim = truncate_dim or encoder.truncate_dim  # re-exporting a truncated export keeps its dimension
    target = Path(path).absolute()
    target.parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=f".{target.name}.export-", dir=target.parent))
    try:
        _write_modules(encoder, staging, truncate_dim)
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


def check_truncate_dim(encoder: Any, dim: int | None) -> None:
    """A truncation keeps between 1 and all of the encoder's dimensions (fewer, when it is already truncated)."""
    width = getattr(encoder, "truncate_dim", None) or encoder.dim
    if dim is not None and not 1 <= dim <= width:
        raise ValueError(f"--truncate_dim {dim}: the embeddings have {width} dimensions; choose 1 to {width}")


def _write_modules(encoder: SentenceEncoder, out: Path, truncate_dim: int | None = None) -> None:
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
        **({"truncate_dim": truncate_dim} if truncate_dim is not None else {}),
    })


# -- loading a sentence-transformers directory back --------------------------------------------
ST_MODULES_IGNORED = ("Normalize",)  # a unit-length rescaling: cosine similarities do not change


def load_sentence_transformers_dir(path: str, pooling: str | None = None) -> SentenceEncoder:
    """A ``SentenceEncoder`` equal to ``SentenceTransformer(path)`` up to normalisation.

    Reads ``modules.json``: the Transformer, the Pooling (or ``pooling`` when given), then Dense
    modules, which are rebuilt as this project's heads: a Linear + Tanh Dense right after
    first-token pooling is SimCSE's MLP head (``cls`` with ``mlp_head``, kept at evaluation), a
    Dense without activation is the linear ``projection``. ``Normalize`` is not a module here (cosines do not
    change); ``pipeline_normalizes`` says that the directory has one. Any other module, or a Dense this encoder cannot represent, is an
    error naming it: evaluating the directory without it would give numbers for another model.
    """
    root = Path(path)
    modules = json.loads((root / "modules.json").read_text())
    dense: list[tuple[str, dict[str, Any]]] = []
    transformer_dir = root
    normalizes = any(m.get("type", "").rsplit(".", 1)[-1] == "Normalize" for m in modules)
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
    # The directory's pipeline ends in unit vectors: what SentenceTransformer.encode hands a classifier
    # (evaluate.py --normalize auto follows it for the transfer tasks).
    encoder.pipeline_normalizes = normalizes
    st_config = root / "config_sentence_transformers.json"
    recorded = json.loads(st_config.read_text()).get("truncate_dim") if st_config.is_file() else None
    if recorded is not None:  # exported at a Matryoshka dimension
        if not isinstance(recorded, int) or not 1 <= recorded <= encoder.dim:
            raise ValueError(f"{st_config}: truncate_dim {recorded!r} is not a dimension of the "
                             f"{encoder.dim}-dimensional embeddings (1 to {encoder.dim})")
        encoder.truncate_dim = recorded
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


def pooling_of_sentence_transformers_dir(path: str) -> Pooling | None:
    """Read the pooling mode of a sentence-transformers directory (modules.json + Pooling config)."""
    modules = Path(path) / "modules.json"
    if not modules.is_file():
        return None
    for module in json.loads(modules.read_text()):
        if module.get("type", "").endswith("Pooling"):
            cfg = json.loads((Path(path) / module["path"] / "config.json").read_text())
            if cfg.get("pooling_mode_mean_tokens"):
                return "mean"
            if cfg.get("pooling_mode_max_tokens"):
                return "max"
            if cfg.get("pooling_mode_cls_token"):
                return "cls_before_pooler"
            mode = cfg.get("pooling_mode")
            if mode in ("mean", "max"):
                return mode
            if mode == "cls":
                return "cls_before_pooler"
    return None
