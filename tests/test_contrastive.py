"""Objective-level checks of the contrastive modules (the maths is tested in test_losses.py)."""
from __future__ import annotations

import lightning as L
import pytest
import torch

import train
from datamodules import NLIDataModule, WikiDataModule
from datamodules.io import DataError
from lightning_modules.dclr import DCLR
from lightning_modules.simcse import SimCSE
from encoders.sentence import SentenceEncoder
from tests.test_train import SIMCSE_ENCODER, objective_config


class ModeProbe(L.Callback):
    """Records the train/eval mode of the encoder and complementary model at every step."""

    def __init__(self) -> None:
        self.modes: list[tuple[bool, bool]] = []

    def on_train_batch_start(self, trainer, pl_module, batch, batch_idx) -> None:
        self.modes.append((pl_module.encoder.transformer.training, pl_module.complementary.training))


def test_dclr_complementary_model_frozen_in_eval_and_unchanged(tmp_path, tiny_model_dir, fixtures_dir):
    config = objective_config(tmp_path, tiny_model_dir, fixtures_dir, "DCLR", "WikiDataModule",
                              encoder_args=SIMCSE_ENCODER, model_args={"complementary_model": tiny_model_dir})
    from harness.cli import SentenceCLI

    cli = SentenceCLI(args=["--config", config])
    probe = ModeProbe()
    cli.trainer.callbacks.append(probe)
    comp_before = {k: v.clone() for k, v in cli.model.complementary.state_dict().items()}
    enc_before = cli.model.encoder.transformer.embeddings.word_embeddings.weight.clone()
    cli.trainer.fit(cli.model, datamodule=cli.datamodule)
    assert probe.modes and all(enc and not comp for enc, comp in probe.modes)
    assert all(p.grad is None and not p.requires_grad for p in cli.model.complementary.parameters())
    for k, v in cli.model.complementary.state_dict().items():
        assert torch.equal(v, comp_before[k]), k
    assert not torch.equal(enc_before, cli.model.encoder.transformer.embeddings.word_embeddings.weight)
    optimised = {id(p) for g in cli.trainer.optimizers[0].param_groups for p in g["params"]}
    assert not optimised & {id(p) for p in cli.model.complementary.parameters()}
    metrics = cli.trainer.callback_metrics
    for name in ("train/masked_fraction", "train/masked_fraction_so_far", "train/masking_batches_so_far",
                 "train/noise_cos_shift", "train/noise_step_norm", "train/noise_lu_after"):
        assert name in metrics, name
    checkpoint = torch.load(cli.trainer.checkpoint_callback.last_model_path, weights_only=True)
    assert not any(k.startswith("complementary.") for k in checkpoint["state_dict"])


def test_dclr_noise_ascent_builds_no_graph_into_the_encoder(tiny_model_dir):
    encoder = SentenceEncoder(tiny_model_dir, pooling="cls", mlp_head=True, mlp_only_train=True)
    model = DCLR(encoder, complementary_model=tiny_model_dir, phi=0.9)
    features = encoder.tokenize(["a cat sleeps", "dogs run fast", "it rains today", "the band plays"])
    calls = []
    handle = encoder.transformer.embeddings.register_full_backward_hook(lambda *a: calls.append(1))
    model.training_loss({"sentence": features})  # noise ascent runs inside, with autograd.grad on the noise only
    handle.remove()
    assert calls == []


@pytest.mark.parametrize("args, message", [
    ({"phi": 1.5}, "phi must be in"),
    ({"phi": 0.0}, "phi must be in"),
    ({"temperature": -0.05}, "temperature must be positive"),
    ({"noise_ratio": -1.0}, "noise_ratio"),
])
def test_dclr_bad_settings(tiny_model_dir, args, message):
    with pytest.raises(ValueError, match=message):
        DCLR(SentenceEncoder(tiny_model_dir), complementary_model=tiny_model_dir, **args)


def test_dclr_complementary_of_another_size_is_an_error(tiny_model_dir):
    with pytest.raises(ValueError, match="complementary_model: its embeddings have 384 dimensions, the encoder's 32"):
        DCLR(SentenceEncoder(tiny_model_dir), complementary_model="sentence-transformers/all-MiniLM-L6-v2")


def test_dclr_complementary_of_another_size_is_fine_when_noise_is_not_weighted(tiny_model_dir):
    # the official large setting: a base complementary model, a large encoder; the official form never weights noise
    model = DCLR(SentenceEncoder(tiny_model_dir), complementary_model="sentence-transformers/all-MiniLM-L6-v2",
                 form="official")
    features = model.encoder.tokenize(["a cat sleeps", "dogs run fast", "it rains today"])
    loss, logs = model.training_loss({"sentence": features})
    assert torch.isfinite(loss) and "masked_fraction" in logs


def test_dclr_official_complementary_runs_in_train_mode_through_the_pooler(tiny_model_dir):
    # a plain model directory with a pooler: the official code reads pooler_output (a hub SimCSE's trained MLP)
    model = DCLR(SentenceEncoder(tiny_model_dir), complementary_model=tiny_model_dir, form="official")
    assert model.complementary_head == "pooler"
    seen = []
    model.complementary.transformer.pooler.register_forward_hook(lambda m, i, o: seen.append(m.training))
    features = model.encoder.tokenize(["a cat sleeps", "dogs run fast", "it rains today", "the band plays"])
    first, second = model._complementary_views(features)
    assert seen == [True, True]  # two passes, dropout on, pooler output used
    assert not torch.equal(first, second)  # two dropout masks: view 1 is scored against view 2
    assert not model.complementary.training  # back in eval mode afterwards
    model.training_loss({"sentence": features})
    paper = DCLR(SentenceEncoder(tiny_model_dir), complementary_model=tiny_model_dir)
    anchors, candidates = paper._complementary_views(features)
    assert anchors is candidates and not paper.complementary.training  # the paper form: one eval pass, with itself


def test_dclr_acting_options_move_their_diagnostics(tiny_model_dir):
    torch.manual_seed(0)
    sentences = [f"sentence number {i} about topic {i % 3}" for i in range(16)]
    logs = {}
    for name, args in {"paper": {}, "acting": {"noise_step": "relative", "noise_beta": 0.2, "phi_quantile": 0.9}}.items():
        model = DCLR(SentenceEncoder(tiny_model_dir), complementary_model=tiny_model_dir, **args)
        _, logs[name] = model.training_loss({"sentence": model.encoder.tokenize(sentences)})
    assert logs["acting"]["noise_cos_shift"] > 100 * abs(logs["paper"]["noise_cos_shift"])
    assert logs["acting"]["masked_fraction"] > 0.05 and "threshold" in logs["acting"]


def test_dclr_counts_every_batchs_mask_and_a_resumed_model_goes_on_counting(tiny_model_dir):
    """The logger sees one step in log_every_n_steps; the tally sees every training batch, and checkpoints keep it."""
    torch.manual_seed(0)
    sentences = [f"sentence number {i} about topic {i % 3}" for i in range(12)]
    batches = [sentences[i:i + 4] for i in (0, 4, 8, 0, 4, 8)]

    def model() -> DCLR:
        return DCLR(SentenceEncoder(tiny_model_dir), complementary_model=tiny_model_dir, phi=0.9, use_noise=False)

    first = model()
    first.complementary.load_state_dict({k: torch.randn_like(v) if v.dtype.is_floating_point else v
                                         for k, v in first.complementary.state_dict().items()})
    first.train()
    fractions, cosines = [], []  # each batch's masked share, and its masked negatives' complementary cosines
    for i, batch in enumerate(batches):
        if i == 3:  # stop and resume: a new module from the checkpoint's dict
            checkpoint = {"state_dict": first.state_dict()}
            first.on_save_checkpoint(checkpoint)
            resumed = model()
            resumed.load_state_dict(checkpoint["state_dict"], strict=False)
            resumed.complementary.load_state_dict(first.complementary.state_dict())
            resumed.on_load_checkpoint(checkpoint)
            resumed.train()
            first = resumed
        seen = []  # the complementary model's views of this batch, as the weighting saw them (dropout is on)
        with pytest.MonkeyPatch.context() as patch:
            patch.setattr(first, "_complementary_views",
                          lambda features, model=first: seen.append(DCLR._complementary_views(model, features)) or seen[-1])
            _, logs = first.training_loss({"sentence": first.encoder.tokenize(batch)})
        anchors, candidates = (torch.nn.functional.normalize(v, dim=-1) for v in seen[0])
        sims = anchors @ candidates.T
        fractions.append(float(logs["masked_fraction"]))
        off_diagonal = ~torch.eye(len(batch), dtype=torch.bool)
        cosines += sims[off_diagonal & (sims >= 0.9)].tolist()  # phi 0.9: what the weighting masks
        assert ("masked_comp_cosine_so_far" in logs) == bool(cosines)  # logged from the first mask on
    assert any(f > 0 for f in fractions) and any(f == 0 for f in fractions), fractions  # some batches mask
    assert logs["masked_fraction_so_far"].item() == pytest.approx(sum(fractions) / len(fractions))
    assert logs["masking_batches_so_far"].item() == pytest.approx(sum(f > 0 for f in fractions) / len(fractions))
    # the mean over every masked negative of the run, not over batches
    assert logs["masked_comp_cosine_so_far"].item() == pytest.approx(sum(cosines) / len(cosines), abs=1e-5)
    first.eval()
    _, logs = first.training_loss({"sentence": first.encoder.tokenize(batches[0])})
    assert "masked_fraction_so_far" not in logs and first.mask_tally[0].item() == len(batches)  # eval: not counted


def test_dclr_resumes_a_tally_written_before_the_masked_cosine_was_counted(tiny_model_dir):
    model = DCLR(SentenceEncoder(tiny_model_dir), complementary_model=tiny_model_dir, use_noise=False)
    model.on_load_checkpoint({"state_dict": {}, "dclr_mask_tally": [10.0, 0.0, 0.0]})  # nothing masked: known, 0
    assert model.mask_tally.tolist() == [10.0, 0.0, 0.0, 0.0]
    model.on_load_checkpoint({"state_dict": {}, "dclr_mask_tally": [10.0, 0.5, 2.0]})  # masked: cosine unknown
    assert model.mask_tally[:3].tolist() == [10.0, 0.5, 2.0] and model.mask_tally[3].isnan()
    logs = {}
    model._count_masks(torch.tensor([[True, False]]), torch.tensor([[0.95, 0.1]]), logs)
    assert "masked_comp_cosine_so_far" not in logs and logs["masked_fraction_so_far"].item() == pytest.approx(1 / 11)


def test_dclr_self_as_complementary_model(tiny_model_dir):
    model = DCLR(SentenceEncoder(tiny_model_dir), complementary_model="self", phi_quantile=0.5)
    assert model.complementary is None and model.frozen_modules() == []
    features = model.encoder.tokenize(["a cat sleeps", "dogs run fast", "it rains today", "the band plays"])
    loss, logs = model.training_loss({"sentence": features})
    assert torch.isfinite(loss) and logs["masked_fraction"] > 0


def test_dclr_without_noise_or_weighting_is_simcse(tiny_model_dir):
    """Both share the in-batch candidates and diagnostics: with its mechanisms off DCLR is SimCSE."""
    encoder = SentenceEncoder(tiny_model_dir, pooling="cls", mlp_head=True, mlp_only_train=True)
    dclr = DCLR(encoder, use_noise=False, use_weighting=False)
    simcse = SimCSE(encoder)
    features = encoder.tokenize(["a cat sleeps", "dogs run fast", "it rains today", "the band plays"])
    torch.manual_seed(3)
    loss_d, logs_d = dclr.training_loss({"sentence": features})
    torch.manual_seed(3)  # the same two dropout masks
    loss_s, logs_s = simcse.training_loss({"sentence": features})
    torch.testing.assert_close(loss_d, loss_s)
    for name in ("accuracy", "alignment", "uniformity"):
        torch.testing.assert_close(logs_d[name], logs_s[name])


def test_batch_of_one_is_an_error(tiny_model_dir, fixtures_dir):
    dm = WikiDataModule(str(fixtures_dir / "sentences.txt"), per_device_batch_size=1)
    dm.use_tokenizer(**SentenceEncoder(tiny_model_dir).tokenization())
    dm.check_objective(SimCSE)  # in-batch negatives
    with pytest.raises(ValueError, match="per_device_batch_size: in-batch negatives need a global batch of at least 2"):
        dm.setup("fit")


def test_triplet_file_and_missing_columns(tmp_path, tiny_model_dir):
    good = tmp_path / "t.tsv"
    good.write_text("anchor\tpositive\tnegative\na\tb\tc\nd\te\tf\n")
    dm = NLIDataModule([str(good)], view="triplets", per_device_batch_size=2)
    dm.use_tokenizer(**SentenceEncoder(tiny_model_dir).tokenization())
    dm.setup("fit")
    assert dm.train_dataset["anchor"] == ["a", "d"]
    bad = tmp_path / "p.tsv"
    bad.write_text("anchor\tpositive\na\tb\n")
    dm = NLIDataModule([str(bad)], view="triplets", per_device_batch_size=2)
    dm.use_tokenizer(**SentenceEncoder(tiny_model_dir).tokenization())
    with pytest.raises(DataError, match=r"missing column\(s\) \['negative'\]"):
        dm.setup("fit")


def test_simcse_two_views_differ_in_training(tmp_path, tiny_model_dir, fixtures_dir):
    """Dropout must be on while training, or SimCSE's positive is the anchor itself."""
    config = objective_config(tmp_path, tiny_model_dir, fixtures_dir, "SimCSE", "WikiDataModule",
                              encoder_args=SIMCSE_ENCODER)
    cli = train.main(["--config", config])
    assert cli.trainer.callback_metrics["train/alignment"] > 0
