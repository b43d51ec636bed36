"""Is our NLI softmax step the same as sentence-transformers' step? (docs/RESULTS.md, the softmax gap)

Both trainers take the same first ``--steps`` batches (ours: our sampler's, length-grouped as the
shipped config has it; theirs: handed exactly those batches through a ``batch_sampler`` callable),
the same rows (our labelled view of ``DIR/nli``), the same start model (offline all-MiniLM-L6-v2,
mean pooling, no ``Normalize``), the same classifier weights (ours copied into their
``SoftmaxLoss``), AdamW lr 2e-5, weight decay 0.01, 10% linear warmup of ``--total_steps`` and
their default clipping at norm 1.0 on both sides (theirs clips the encoder only, ours encoder and
classifier together, unless ``--match clip_scope``). Dropout is off on both sides (unless
``--dropout``), so a step is a deterministic function of the weights and the batch: equal steps give
equal losses, and a different step shows as losses that part from the first step on.

Prints each step's loss on both sides and, at the end, the largest absolute difference between
the two encoders' weights and between the classifiers' weights. With ``--sts_dir`` both trained
encoders are also scored on the seven STS tasks (``evaluate.py``'s evaluation, bf16): a whole run
without dropout (``--steps 300``) shows whether the two trainers end at the same quality when
nothing random differs. With ``--dropout --same_masks`` both sides re-seed torch just
before their first step: if the two trainers draw and apply their dropout masks the same way, the
losses then agree step by step as they do without dropout. With ``--match clip_scope`` as well, the
two runs are equal to the last bit (docs/RESULTS.md, the NLI softmax gap).

    python benchmarks/softmax_parity.py --data_dir ../shared/data --steps 20 --precision 32
    python benchmarks/softmax_parity.py --data_dir ../shared/data --steps 300 --precision bf16 --sts_dir ../shared/data/sts
    python benchmarks/softmax_parity.py --data_dir ../shared/data --steps 6 --precision 32 --dropout --same_masks --match clip_scope
"""
from __future__ import annotations

import argparse
import json
import os
import tempfile

from common import FixedBatches, set_threads
from st_peer_train import MODEL, NLI_FILES

MAX_GRAD_NORM = 1.0  # their trainer's default max_grad_norm; both sides clip at it


def no_dropout(module) -> None:
    from torch import nn

    for m in module.modules():
        if isinstance(m, nn.Dropout):
            m.p = 0.0


def ours(args, record: list[tuple[float, float]]):
    """Our NLISoftmax trained for ``--steps`` steps; (the module, the batches it took, the rows)."""
    import lightning as L
    import torch

    from datamodules import NLIDataModule
    from encoders.sentence import SentenceEncoder
    from lightning_modules.nli_softmax import NLISoftmax

    torch.manual_seed(args.seed)
    encoder = SentenceEncoder(MODEL, pooling="mean", max_seq_length=args.max_length)
    model = NLISoftmax(encoder, lr=2e-5, weight_decay=0.01, warmup_ratio=0.1)
    start_classifier = {k: v.clone() for k, v in model.classifier.state_dict().items()}
    dm = NLIDataModule(train_sources=[os.path.join(args.data_dir, f) for f in NLI_FILES], view="labelled",
                       per_device_batch_size=args.batch_size, group_by_length=True,
                       seed=args.seed if args.data_seed is None else args.data_seed)
    dm.use_tokenizer(**encoder.tokenization())

    class Record(L.Callback):
        def on_train_batch_start(self, trainer, pl_module, batch, batch_idx):
            if args.same_masks and batch_idx == 0:
                torch.manual_seed(args.seed)  # theirs does the same before its first step

        def on_train_start(self, trainer, pl_module):
            if not args.dropout:
                no_dropout(pl_module)
            # the schedule of a --total_steps run, cut after --steps steps
            scheduler = trainer.lr_scheduler_configs[0].scheduler
            from transformers import get_linear_schedule_with_warmup
            trainer.lr_scheduler_configs[0].scheduler = get_linear_schedule_with_warmup(
                scheduler.optimizer, int(0.1 * args.total_steps), args.total_steps)

        def on_before_optimizer_step(self, trainer, pl_module, optimizer):
            if "clip_scope" in args.match:  # their trainer clips the model's parameters, not the loss's classifier
                torch.nn.utils.clip_grad_norm_(pl_module.encoder.parameters(), MAX_GRAD_NORM)

        def on_train_batch_end(self, trainer, pl_module, outputs, *_):
            record.append((float(outputs["loss"]), trainer.optimizers[0].param_groups[0]["lr"]))

    trainer = L.Trainer(
        accelerator="cpu", devices=1, max_steps=args.steps,
        gradient_clip_val=None if "clip_scope" in args.match else MAX_GRAD_NORM,
        precision="bf16-mixed" if args.precision == "bf16" else "32-true", logger=False,
        enable_checkpointing=False, enable_progress_bar=False, enable_model_summary=False,
        limit_val_batches=0, num_sanity_val_steps=0, callbacks=[Record()], use_distributed_sampler=False,
    )
    trainer.fit(model, datamodule=dm)
    batches = dm.train_sampler.global_batches()[: args.steps]
    rows = dm.train_dataset.select_columns(["sentence1", "sentence2", "label"])
    return model, start_classifier, batches, rows


def theirs(args, batches, rows, start_classifier, record: list[tuple[float, float]], tmp: str):
    import torch
    from sentence_transformers import (SentenceTransformer, SentenceTransformerTrainer,
                                       SentenceTransformerTrainingArguments)
    from sentence_transformers.sentence_transformer.losses import SoftmaxLoss
    from transformers import TrainerCallback, get_linear_schedule_with_warmup

    from encoders.hub import resolve_model_name

    torch.manual_seed(args.seed)
    model = SentenceTransformer(resolve_model_name(MODEL), device="cpu")
    model.max_seq_length = args.max_length
    if type(model[len(model) - 1]).__name__ == "Normalize":
        del model[len(model) - 1]  # ours has no Normalize
    loss = SoftmaxLoss(model, model.get_sentence_embedding_dimension(), num_labels=3)
    loss.classifier.load_state_dict(start_classifier)
    if "classifier_precision" in args.match:
        linear = loss.classifier.forward

        def fp32_classifier(x):  # ours runs its classifier outside autocast
            with torch.autocast(x.device.type, enabled=False):
                return linear(x.float())

        loss.classifier.forward = fp32_classifier
    losses: list[float] = []
    loss.register_forward_hook(lambda module, inputs, output: losses.append(float(output)))

    class NoDropout(TrainerCallback):
        def on_step_begin(self, _args, state, *_, **__):
            if args.same_masks and state.global_step == 0:
                torch.manual_seed(args.seed)  # as ours before its first step: the same mask stream
            if not args.dropout:
                no_dropout(model)  # (the trainer sets train mode each step; p = 0 stays)

        def on_step_end(self, *_, optimizer=None, **__):
            record.append((losses[-1], optimizer.param_groups[0]["lr"]))

    targs = SentenceTransformerTrainingArguments(
        output_dir=os.path.join(tmp, "st-out"), max_steps=args.steps, per_device_train_batch_size=args.batch_size,
        learning_rate=2e-5, weight_decay=0.01, lr_scheduler_type="linear", bf16=args.precision == "bf16",
        max_grad_norm=MAX_GRAD_NORM, use_cpu=True, batch_sampler=lambda *a, **k: FixedBatches(batches),
        save_strategy="no", report_to="none",
        logging_strategy="no", disable_tqdm=True, seed=args.seed, dataloader_num_workers=0,
    )
    trainer = SentenceTransformerTrainer(model=model, args=targs, train_dataset=rows, loss=loss,
                                         callbacks=[NoDropout()])
    trainer.create_optimizer()
    trainer.lr_scheduler = get_linear_schedule_with_warmup(trainer.optimizer, int(0.1 * args.total_steps),
                                                           args.total_steps)
    trainer.train()
    return model, loss


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--data_dir", required=True)
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--total_steps", type=int, default=300, help="the run whose schedule the steps follow")
    parser.add_argument("--batch_size", type=int, default=16)
    parser.add_argument("--max_length", type=int, default=128)
    parser.add_argument("--precision", choices=["32", "bf16"], default="32")
    parser.add_argument("--seed", type=int, default=42)
    parser.add_argument("--data_seed", type=int, default=None, help="our sampler's batch order (default: --seed)")
    parser.add_argument("--threads", type=int, default=None)
    parser.add_argument("--sts_dir", default=None, help="score both trained encoders on the seven STS tasks")
    parser.add_argument("--dropout", action="store_true",
                        help="keep dropout on: the two runs then differ in their random masks too")
    parser.add_argument("--same_masks", action="store_true",
                        help="with --dropout: re-seed torch just before the first step on both sides, so both "
                             "draw the same stream of dropout masks")
    parser.add_argument("--match", action="append", default=[], choices=["clip_scope", "classifier_precision"],
                        help="remove one difference: clip_scope (ours clips only the encoder, as theirs does), "
                             "classifier_precision (theirs runs its classifier in fp32, as ours does)")
    parser.add_argument("--print_every", type=int, default=1, help="print every n-th step's losses")
    args = parser.parse_args()
    if args.same_masks and not args.dropout:
        parser.error("--same_masks needs --dropout")
    set_threads(args.threads)
    import torch
    import transformers

    transformers.logging.set_verbosity_error()
    ours_loss: list[tuple[float, float]] = []  # (loss, learning rate after the step)
    theirs_loss: list[tuple[float, float]] = []
    model, start_classifier, batches, rows = ours(args, ours_loss)
    with tempfile.TemporaryDirectory(prefix="softmax-parity-") as tmp:
        st_model, st_loss = theirs(args, batches, rows, start_classifier, theirs_loss, tmp)
        print(f"{'step':>4} {'loss ours':>10} {'theirs':>10} {'diff':>10}  {'next lr ours':>12} {'theirs':>10}")
        for step, ((a, lr_a), (b, lr_b)) in enumerate(zip(ours_loss, theirs_loss, strict=True), 1):
            if step % args.print_every == 0 or step == 1:
                print(f"{step:>4} {a:10.6f} {b:10.6f} {a - b:10.2e}  {lr_a:12.3e} {lr_b:10.3e}")
        theirs_weights = dict(st_model[0].auto_model.named_parameters())
        encoder_diff = max((p.detach() - theirs_weights[n].detach()).abs().max().item()
                           for n, p in model.encoder.transformer.named_parameters())
        classifier_diff = max((p.detach() - q.detach()).abs().max().item() for p, q in
                              zip(model.classifier.parameters(), st_loss.classifier.parameters(), strict=True))
        moved = max((p.detach() - q).abs().max().item() for p, q in
                    zip(model.classifier.parameters(), start_classifier.values(), strict=True))
        summary = {"precision": args.precision, "steps": args.steps, "seed": args.seed, "dropout": args.dropout,
                   "data_seed": args.data_seed, "same_masks": args.same_masks, "match": args.match,
                   "max_loss_diff": max(abs(a[0] - b[0]) for a, b in zip(ours_loss, theirs_loss)),
                   "max_encoder_weight_diff": encoder_diff, "max_classifier_weight_diff": classifier_diff,
                   "classifier_moved": moved, "torch": torch.__version__}
        print(json.dumps(summary), flush=True)
        if args.sts_dir:
            from evaluate import load_encoder
            from harness.sts_eval import evaluate_sts

            st_model.save(os.path.join(tmp, "theirs"))
            encoders = {"ours": model.encoder, "theirs": load_encoder(None, os.path.join(tmp, "theirs"), None)[0]}
            for side, encoder in encoders.items():
                results = evaluate_sts(lambda s, e=encoder: e.encode(s, batch_size=64, precision="bf16"), args.sts_dir)
                print(json.dumps({side: {k: round(v, 2) for k, v in results.items() if isinstance(v, float)}}))


if __name__ == "__main__":
    main()
