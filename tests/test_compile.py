"""The compiled training step: bucketed batch widths, and the same loss and gradients as eager."""
import torch
from torch import nn
from torch._dynamo.utils import counters

from datamodules import NLIDataModule
from encoders.padding import pad_token_ids
from encoders.sentence import SentenceEncoder
from lightning_modules.mnr import MNR


def test_widths_round_up_to_the_multiple():
    batch = pad_token_ids([[5, 6, 7], [8]], pad_id=0, multiple=8)
    assert batch["input_ids"].shape == (2, 8)
    assert batch["attention_mask"].tolist() == [[1, 1, 1, 0, 0, 0, 0, 0], [1, 0, 0, 0, 0, 0, 0, 0]]
    assert pad_token_ids([[1] * 9], pad_id=0, multiple=8)["input_ids"].shape == (1, 16)
    assert pad_token_ids([[1] * 9], pad_id=0)["input_ids"].shape == (1, 9)


def test_compiled_encoder_buckets_every_training_batch(fixtures_dir, tiny_model_dir):
    assert SentenceEncoder(tiny_model_dir).tokenization()["pad_to_multiple_of"] == 1
    enc = SentenceEncoder(tiny_model_dir, compile=True, max_seq_length=40)
    assert enc.tokenization()["pad_to_multiple_of"] == SentenceEncoder.COMPILE_BUCKET == 16
    dm = NLIDataModule([str(fixtures_dir / "nli" / "train.tsv")], view="pairs", per_device_batch_size=4,
                       sts_dir=str(fixtures_dir / "sts"))
    dm.check_objective(MNR)
    dm.use_tokenizer(**enc.tokenization())
    dm.setup("fit")
    widths = {batch[col]["input_ids"].shape[1] for batch in dm.train_dataloader() for col in ("anchor", "positive")}
    assert widths and widths <= {16, 32, 48}, widths  # 40 tokens at most: three buckets
    val_widths = {b["sentence"]["input_ids"].shape[1] for loader in dm.val_dataloader() for b in loader}
    assert val_widths and all(w % 16 == 0 for w in val_widths), val_widths


def no_dropout(module: nn.Module) -> None:
    """Dropout masks come from different generators compiled and eager: compare without them."""
    for m in module.modules():
        if isinstance(m, nn.Dropout):
            m.p = 0.0
    module.transformer.config.attention_probs_dropout_prob = 0.0
    for m in module.modules():
        if hasattr(m, "dropout_prob"):
            m.dropout_prob = 0.0


def test_compiled_step_matches_eager(tiny_model_dir, one_torch_thread):
    torch.manual_seed(0)
    eager = SentenceEncoder(tiny_model_dir, max_seq_length=32)
    compiled = SentenceEncoder(tiny_model_dir, compile=True, max_seq_length=32)
    compiled.load_state_dict(eager.state_dict())
    sentences = ["a man plays a guitar", "a dog runs", "two kids are playing in the snow", "rain"]
    batch = pad_token_ids(eager.tokenizer(sentences)["input_ids"], eager.tokenizer.pad_token_id, multiple=16)
    graphs = lambda: counters["stats"]["unique_graphs"]  # noqa: E731
    before = graphs()
    losses, grads = [], []
    for enc in (eager, compiled):
        no_dropout(enc)
        enc.train()
        emb = enc(batch)
        loss = (emb.sum(1) ** 2).mean() + emb.pow(3).mean()
        loss.backward()
        losses.append(loss.detach())
        grads.append(torch.cat([p.grad.flatten() for p in enc.parameters() if p.grad is not None]))
    assert graphs() > before  # the training forward ran compiled
    assert all("_compiled_call_impl" in layer.__dict__ for layer in compiled.transformer.encoder.layer)
    assert list(compiled.state_dict()) == list(eager.state_dict())
    torch.testing.assert_close(losses[1], losses[0], rtol=1e-4, atol=1e-5)
    torch.testing.assert_close(grads[1], grads[0], rtol=1e-3, atol=1e-5)
    compiled.eval()  # evaluation stays eager, at any width
    wide = pad_token_ids([[101] + [2000] * 40 + [102]], eager.tokenizer.pad_token_id)
    compiled_graphs = graphs()
    torch.testing.assert_close(compiled(wide), eager.eval()(wide), rtol=1e-4, atol=1e-5)
    assert graphs() == compiled_graphs  # no compile for the evaluation shape
