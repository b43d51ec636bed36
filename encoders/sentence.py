"""The shared sentence encoder: a Hugging Face transformer plus pooling."""
from __future__ import annotations

import contextlib
import logging
from typing import Any, Literal, Sequence, get_args

import torch
from torch import Tensor, nn
from transformers import AutoConfig, AutoModel, AutoTokenizer

from .checkpoint_file import load_encoder_weights, sentence_encoder_start
from .hub import ModelResolutionError, resolve_model_name
from .padding import pad_token_ids
from .unpadded import family, packed_forward, pool_packed

log = logging.getLogger(__name__)

Pooling = Literal["mean", "max", "cls", "cls_before_pooler"]
POOLINGS: tuple[str, ...] = get_args(Pooling)  # the one list of pooling names


class SentenceEncoder(nn.Module):
    """Any Hugging Face encoder with pooling, by hub name or local directory.

    Pooling: ``mean`` over non-padding tokens (SBERT's default), ``max`` over them, ``cls`` (the
    first token's last hidden state, then the MLP head when there is one, as SimCSE's ``cls``),
    ``cls_before_pooler`` (the first token's last hidden state, never through the head).
    With ``mlp_only_train`` the head is used during training only, so at evaluation ``cls``
    equals ``cls_before_pooler`` (SimCSE's unsupervised setting).

    The transformer is put in train mode here: ``from_pretrained`` returns it in eval mode, and
    Lightning keeps each submodule's mode, which would switch dropout off during training.

    Args:
        model_name: hub name or local directory of a Hugging Face encoder, or a ``.ckpt`` of this
            project's ``train.py``: its trained encoder weights, on the transformer it was built from
            (pooling and heads must be the checkpoint's; an error says which differs).
        pooling: how token states become one sentence vector.
        max_seq_length: truncation length for training batches (evaluation uses the model's maximum).
        mlp_head: add a Linear+Tanh head (SimCSE's MLP) after ``cls`` pooling, initialised as the transformer
            initialises its own weights (normal(0, initializer_range), bias 0), as SimCSE's and DCLR's code do.
        mlp_only_train: use the head in training only (SimCSE unsupervised).
        projection_dim: add a trainable linear projection to this size after pooling (kept at
            evaluation and export), e.g. FILM's deep variant over a frozen transformer.
        freeze_transformer: keep the transformer's weights fixed and its dropout off; only the
            heads train.
        pretrained: load pretrained weights; False builds the architecture from the config with
            random weights (tests, throughput benchmarks, rebuilding from a checkpoint).
        trust_remote_code: allow the model repository's own code; off unless a config turns it on.
        compile: run the transformer's training forward and backward through ``torch.compile``
            (inductor, static shapes), each repeated layer compiled once for all of them (regional
            compilation; a transformer without a repeated layer list is compiled whole), at the
            first training step of each shape. Evaluation and ``encode`` stay eager: their shapes
            vary too much to pay a compile each.
        pad_to_multiple_of: round every batch's width up to a multiple of this, so a compiled
            transformer meets at most ``ceil(max_seq_length / pad_to_multiple_of)`` widths (each one
            compiled once); None = 16 when compiling, else 1 (pad to the longest row only).
        padding_free: run the transformer on real tokens only (``encoders/unpadded.py``); None = on
            for the families it knows (BERT, RoBERTa, MiniLM) unless compiling.
    """

    def __init__(
        self,
        model_name: str = "sentence-transformers/all-MiniLM-L6-v2",
        pooling: Pooling = "mean",
        max_seq_length: int = 128,
        mlp_head: bool = False,
        mlp_only_train: bool = False,
        projection_dim: int | None = None,
        freeze_transformer: bool = False,
        pretrained: bool = True,
        trust_remote_code: bool = False,
        compile: bool = False,
        pad_to_multiple_of: int | None = None,
        padding_free: bool | None = None,
    ) -> None:
        super().__init__()
        if pooling not in POOLINGS:
            raise ValueError(f"pooling must be one of {', '.join(POOLINGS)}, got {pooling!r}")
        if mlp_head and pooling != "cls":
            raise ValueError(f"mlp_head applies on top of cls pooling, but pooling is {pooling!r}")
        if max_seq_length < 2:
            raise ValueError(f"max_seq_length must be at least 2, got {max_seq_length}")
        if pad_to_multiple_of is None:
            pad_to_multiple_of = self.COMPILE_BUCKET if compile else 1
        if pad_to_multiple_of < 1:
            raise ValueError(f"pad_to_multiple_of must be positive, got {pad_to_multiple_of}")
        start_state, start_source = None, None
        if model_name.endswith(".ckpt"):
            # A second training step (SBERT: STS-B after NLI) starts from a run of this project: the
            # checkpoint's encoder weights on the transformer it was built from, which is what the
            # config records, so this run's own checkpoints never need the first one.
            architecture = dict(pooling=pooling, mlp_head=mlp_head, mlp_only_train=mlp_only_train,
                                projection_dim=projection_dim)
            start_source = model_name
            model_name, start_state = sentence_encoder_start(model_name, architecture)
            pretrained = False
        self.config_dict: dict[str, Any] = dict(
            model_name=model_name, pooling=pooling, max_seq_length=max_seq_length, mlp_head=mlp_head,
            mlp_only_train=mlp_only_train, projection_dim=projection_dim, freeze_transformer=freeze_transformer,
            trust_remote_code=trust_remote_code, compile=compile, pad_to_multiple_of=pad_to_multiple_of,
            padding_free=padding_free,
        )
        if projection_dim is not None and projection_dim < 1:
            raise ValueError(f"projection_dim must be positive, got {projection_dim}")
        path = resolve_model_name(model_name)
        try:
            self.tokenizer = AutoTokenizer.from_pretrained(path, trust_remote_code=trust_remote_code)
            if pretrained:
                self.transformer = AutoModel.from_pretrained(path, trust_remote_code=trust_remote_code)
            else:
                config = AutoConfig.from_pretrained(path, trust_remote_code=trust_remote_code)
                self.transformer = AutoModel.from_config(config, trust_remote_code=trust_remote_code)
        except OSError as err:
            raise ModelResolutionError(f"cannot load model {model_name!r}: {err}") from err
        self.transformer.train()
        # No pooling mode uses the model's own pooler (BERT's NSP head): freeze it, so DDP does
        # not wait for gradients that never come and the optimizer holds no dead weights.
        pooler = getattr(self.transformer, "pooler", None)
        if isinstance(pooler, nn.Module):
            pooler.requires_grad_(False)
        self.pooling = pooling
        self.max_seq_length = max_seq_length
        self.compile_transformer = compile  # not ``self.compile``: that is nn.Module's own method
        self.pad_to_multiple_of = pad_to_multiple_of
        self.padding_free = self._use_padding_free(padding_free, compile)
        if compile:
            self._compile_layers()
        self.mlp_only_train = mlp_only_train
        hidden = self.transformer.config.hidden_size
        self.mlp = nn.Sequential(nn.Linear(hidden, hidden), nn.Tanh()) if mlp_head else None
        if self.mlp is not None:
            # SimCSE's and DCLR's official code build the head inside the transformer's model class, so its
            # weights get the transformer's own initialisation: normal(0, initializer_range), bias 0.
            std = float(getattr(self.transformer.config, "initializer_range", 0.02))
            nn.init.normal_(self.mlp[0].weight, mean=0.0, std=std)
            nn.init.zeros_(self.mlp[0].bias)
        self.projection = nn.Linear(hidden, projection_dim) if projection_dim is not None else None
        self.freeze_transformer = freeze_transformer
        # encode() keeps the first truncate_dim dimensions (a Matryoshka export records it; training never
        # truncates here): as SentenceTransformer(dir, truncate_dim=D) does, before any normalisation.
        self.truncate_dim: int | None = None
        if freeze_transformer:
            self.transformer.requires_grad_(False)
            self.transformer.eval()
        if start_state is not None:
            load_encoder_weights(self, start_state, start_source)

    def train(self, mode: bool = True) -> "SentenceEncoder":
        super().train(mode)
        if self.freeze_transformer:
            self.transformer.eval()  # a frozen transformer never trains, dropout included
        return self

    @property
    def dim(self) -> int:
        """Size of the sentence embeddings."""
        return self.projection.out_features if self.projection is not None else self.transformer.config.hidden_size

    @property
    def eval_max_length(self) -> int:
        """The longest input the model accepts: evaluation never truncates below this."""
        limits = [self.tokenizer.model_max_length, getattr(self.transformer.config, "max_position_embeddings", None)]
        limits = [x for x in limits if isinstance(x, int) and 0 < x < 1_000_000]
        return min(limits) if limits else 512

    def tokenization(self) -> dict[str, Any]:
        """What a DataModule needs to tokenize for this encoder (``SentenceDataModule.use_tokenizer``)."""
        return {"tokenizer": self.tokenizer, "max_length": self.max_seq_length, "eval_max_length": self.eval_max_length,
                "pad_to_multiple_of": self.pad_to_multiple_of}

    def tokenize(self, sentences: Sequence[str], train: bool = True) -> dict[str, Tensor]:
        """Padded tensors for a list of sentences, truncated as training or evaluation requires."""
        max_length = self.max_seq_length if train else self.eval_max_length
        return self.tokenizer(
            list(sentences), padding=True, truncation=True, max_length=max_length, return_tensors="pt",
            return_token_type_ids=False,
        )

    def forward(self, features: dict[str, Tensor]) -> Tensor:
        """features: input_ids, attention_mask (B, L) -> embeddings (B, H)."""
        pooled = self._pool(features)
        return self.projection(pooled) if self.projection is not None else pooled

    def _pool(self, features: dict[str, Tensor]) -> Tensor:
        mask = features["attention_mask"]
        cut = features.get("embedding_mask")  # a positive view's cutoff (encoders/augment.py)
        with self._embedding_mask(cut, mask) if cut is not None else contextlib.nullcontext():
            if self.padding_free:
                tokens, packing = packed_forward(self.transformer, features["input_ids"], mask)  # (N, H)
                pooled = pool_packed(tokens, packing, self.pooling)  # (B, H)
            else:
                pooled = self._pool_padded(features["input_ids"], mask)
        if self.pooling in ("mean", "max"):
            return pooled
        use_head = self.mlp is not None and self.pooling == "cls" and (self.training or not self.mlp_only_train)
        return self.mlp(pooled) if use_head else pooled

    @contextlib.contextmanager
    def _embedding_mask(self, cut: Tensor, mask: Tensor):
        """Multiply the embedding layer's output by ``cut`` ((B, L, 1) or (B, 1, H), 0/1) during one forward:
        (B, L, H) on the padded path, the real tokens' rows (N, H) on the padding-free one."""
        batch, width = mask.shape

        def apply(module: nn.Module, inputs: tuple, output: Tensor) -> Tensor:
            full = cut.expand(batch, width, output.shape[-1]).to(output.dtype)  # (B, L, H)
            if output.dim() == 3:
                return output * full
            return output * full.reshape(batch * width, -1)[mask.reshape(-1).bool()]  # (N, H), row-major

        handle = self.transformer.embeddings.dropout.register_forward_hook(apply)
        try:
            yield
        finally:
            handle.remove()

    def _pool_padded(self, input_ids: Tensor, mask: Tensor) -> Tensor:
        """Mean, max or first-token vectors (B, H) of the transformer run on the padded batch."""
        eager = self.compile_transformer and not self.training
        with torch.compiler.set_stance("force_eager") if eager else contextlib.nullcontext():
            out = self.transformer(input_ids=input_ids, attention_mask=mask)
        tokens = out.last_hidden_state  # (B, L, H)
        if self.pooling == "mean":
            m = mask.unsqueeze(-1).to(tokens.dtype)  # (B, L, 1)
            return (tokens * m).sum(1) / m.sum(1).clamp(min=1e-9)
        if self.pooling == "max":
            return tokens.masked_fill(~mask.bool().unsqueeze(-1), torch.finfo(tokens.dtype).min).amax(1)
        return tokens[:, 0]  # (B, H)

    def _use_padding_free(self, requested: bool | None, compile: bool) -> bool:
        """Whether ``_pool`` runs padding-free; one log line when a transformer falls back to padding."""
        if requested is False:
            return False
        name = type(self.transformer).__name__
        if family(self.transformer) is None:
            # Asked for explicitly, the fallback is worth a warning; by default it is only news.
            log.log(logging.WARNING if requested else logging.INFO,
                    "padding-free path: %s is not a BERT/RoBERTa-family encoder it knows; using the padded path", name)
            return False
        if compile:
            # The compiled layers are the padded ones (static shapes); the packed token count changes
            # every batch, which would recompile each step.
            if requested:
                log.warning("padding-free path: not combined with compile=True; using the padded, compiled path")
            return False
        return True

    COMPILE_BUCKET = 16  # the default width multiple of a compiled transformer

    def _compile_layers(self) -> None:
        """``nn.Module.compile`` on each layer of the transformer's largest list of same-class layers
        (the whole transformer when it has none): one compiled graph per shape, shared by the layers
        (their weights are graph inputs), in place, so parameter names and state_dict keep theirs."""
        import torch._dynamo

        lists = [m for m in self.transformer.modules() if isinstance(m, nn.ModuleList) and len(m) > 1
                 and len({type(x) for x in m}) == 1]
        layers = max(lists, key=lambda m: sum(p.numel() for p in m.parameters()), default=[self.transformer])
        for layer in layers:
            layer.compile(dynamic=False)
        # Each (batch, width) shape is compiled once. Widths: one per bucket; batch sizes: the
        # objective's one or two, plus an epoch's last batch. Dynamo's default of 8 graphs per
        # function would fall back to eager for long max lengths.
        buckets = -(-self.max_seq_length // self.pad_to_multiple_of)
        config = torch._dynamo.config
        config.recompile_limit = max(config.recompile_limit, 4 * buckets)

    encode_chunk = 1 << 16  # sentences tokenized (and length-sorted) together by encode()

    @torch.inference_mode()
    def encode(
        self,
        sentences: Sequence[str],
        batch_size: int = 64,
        normalize: bool = False,
        precision: Literal["32", "bf16", "16"] = "32",
        device: str | torch.device | None = None,
    ) -> Tensor:
        """Embed sentences in eval mode and return (N, H) float32 embeddings in input order (N, truncate_dim)
        when ``truncate_dim`` is set; ``normalize`` then normalises the truncation).

        Sentences are tokenized once, up to ``encode_chunk`` at a time, and batched in order of
        token count, so each batch pads little (sorting by characters, as sentence-transformers
        does, pads about a third more on STS-B); ``precision`` runs the transformer under
        autocast (bf16 is several times faster on CPUs with bf16 units).
        """
        was_training = self.training
        self.eval()
        device = torch.device(device) if device is not None else next(self.parameters()).device
        dtype = {"32": None, "bf16": torch.bfloat16, "16": torch.float16}[precision]
        autocast = torch.autocast(device.type, dtype=dtype) if dtype is not None else contextlib.nullcontext()
        pad_id = self.tokenizer.pad_token_id or 0
        chunks, order = [], []
        try:
            with autocast:
                for offset in range(0, len(sentences), self.encode_chunk):
                    part = list(sentences[offset:offset + self.encode_chunk])
                    ids = self.tokenizer(part, truncation=True, max_length=self.eval_max_length,
                                         return_attention_mask=False, return_token_type_ids=False)["input_ids"]
                    by_length = sorted(range(len(part)), key=lambda i: -len(ids[i]))
                    for start in range(0, len(by_length), batch_size):
                        rows = [ids[i] for i in by_length[start:start + batch_size]]
                        features = {k: v.to(device) for k, v in pad_token_ids(rows, pad_id).items()}
                        chunks.append(self(features).float())
                    order.extend(offset + i for i in by_length)
        finally:
            self.train(was_training)
        if not chunks:
            return torch.empty(0, self.truncate_dim or self.dim)
        emb = torch.cat(chunks)  # (N, H) in length order
        out = torch.empty_like(emb)
        out[torch.tensor(order, device=emb.device)] = emb
        if self.truncate_dim is not None:
            out = out[:, :self.truncate_dim]  # (N, D)
        return torch.nn.functional.normalize(out, dim=-1) if normalize else out

    @classmethod
    def from_checkpoint_config(cls, config: dict[str, Any]) -> "SentenceEncoder":
        """Rebuild the architecture from a checkpoint's ``encoder_config`` (weights loaded after).

        A checkpoint never turns on ``trust_remote_code``: a file from elsewhere must not run code.
        """
        return cls(**{**config, "trust_remote_code": False}, pretrained=False)
