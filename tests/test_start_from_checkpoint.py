"""A run that starts from another run's checkpoint (SBERT's two steps: NLI, then STS-B):
``encoder.init_args.model_name: <run>/checkpoints/last.ckpt``."""
from __future__ import annotations

import lightning as L
import pytest
import torch

import train
from encoders.checkpoint import CheckpointError, load_checkpoint
from encoders.sentence import SentenceEncoder
from harness.cli import SentenceCLI
from tests.test_train import objective_config


@pytest.fixture(scope="module")
def first_run(tmp_path_factory, tiny_model_dir, fixtures_dir):
    """Step one: NLI softmax on the tiny model, 2 optimizer steps."""
    tmp = tmp_path_factory.mktemp("first")
    config = objective_config(tmp, tiny_model_dir, fixtures_dir, "NLISoftmax", "NLIDataModule",
                              data_args={"view": "labelled"})
    cli = train.main(["--config", config, "--trainer.max_steps", "2", "--validate_first", "false"])
    return cli.trainer.checkpoint_callback.last_model_path


def encoder_weights(ckpt: str) -> dict[str, torch.Tensor]:
    state = load_checkpoint(ckpt)["state_dict"]
    return {k[len("encoder."):]: v for k, v in state.items() if k.startswith("encoder.")}


def test_second_run_starts_from_the_first_runs_weights(first_run, tmp_path, tiny_model_dir, fixtures_dir):
    trained = encoder_weights(first_run)
    config = objective_config(tmp_path, tiny_model_dir, fixtures_dir, "STSRegression", "STSDataModule",
                              encoder_args={"model_name": first_run})
    cli = SentenceCLI(args=["--config", config, "--trainer.max_steps", "2"])
    at_start = {}

    class RecordStart(L.Callback):
        def on_train_start(self, trainer, pl_module):
            at_start.update({k: v.detach().clone() for k, v in pl_module.encoder.state_dict().items()})

    cli.trainer.callbacks.append(RecordStart())
    cli.trainer.fit(cli.model, datamodule=cli.datamodule)
    assert at_start.keys() == trained.keys()
    for name, value in trained.items():
        torch.testing.assert_close(at_start[name], value, rtol=0, atol=0, msg=name)
    fresh = SentenceEncoder(tiny_model_dir).state_dict()
    assert not all(torch.equal(fresh[k], v) for k, v in trained.items())  # the first run did move them
    # The second run records the transformer it was built on, so its checkpoints stand alone.
    second = load_checkpoint(cli.trainer.checkpoint_callback.last_model_path)
    assert second["encoder_config"]["model_name"] == tiny_model_dir
    assert cli.config.model.init_args.encoder.init_args.model_name == first_run  # where it started: the run's config


def test_pooling_must_be_the_checkpoints(first_run):
    with pytest.raises(CheckpointError, match=r"was trained with pooling 'mean', this encoder asks for 'cls'; "
                                              r"set encoder.init_args.pooling: mean"):
        SentenceEncoder(first_run, pooling="cls")


def test_missing_checkpoint_is_one_clear_error(tmp_path):
    with pytest.raises(CheckpointError, match="checkpoint file not found"):
        SentenceEncoder(str(tmp_path / "nope.ckpt"))
