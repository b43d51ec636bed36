"""FILM as an objective: short fits of both shipped configs, checkpoint -> evaluate round trip, bad input."""
from __future__ import annotations

from pathlib import Path

import pytest
import torch

import evaluate
import train
from encoders.checkpoint import encoder_from_checkpoint, load_checkpoint
from encoders.sentence import SentenceEncoder
from encoders.film import FILMEncoder
from tests.conftest import ROOT

SENTENCES = ["A dog runs in the park.", "The weather is cold today.", "Cats sleep.", "zzz qqq"]


pytestmark = pytest.mark.usefixtures("one_torch_thread")


def film_args(config: str, tmp_path: Path, fixtures: Path, *extra: str, train_source: str | None = None) -> list[str]:
    """A shipped FILM config pointed at the fixture data, small enough for a test."""
    return [
        "--config", str(ROOT / "configs" / config),
        "--trainer.default_root_dir", str(tmp_path / "runs"),
        "--trainer.max_steps", "12", "--trainer.val_check_interval", "5", "--trainer.log_every_n_steps", "1",
        "--trainer.enable_progress_bar", "false", "--trainer.enable_model_summary", "false",
        "--data.init_args.train_sources", f"[{train_source or fixtures / 'nli' / 'train.tsv'}]",
        "--data.init_args.sts_dir", str(fixtures / "sts"),
        "--model.init_args.dim", "4", "--model.init_args.rank", "null",
        *extra,
    ]


def tiny_encoder(tiny: str) -> list[str]:
    # rank 8 of the 32 dimensions: the random tiny model's weakest directions have tiny singular
    # values, which whitening would amplify until float32 rounding shows in the embeddings
    return ["--model.init_args.encoder.init_args.model_name", tiny, "--model.init_args.encode_precision", "32",
            "--model.init_args.rank", "8"]


def check_fit(cli) -> str:
    metrics = cli.trainer.callback_metrics
    assert 1 <= cli.trainer.global_step <= 12
    assert torch.isfinite(metrics["train/loss"])
    assert {"train/active_set_size", "train/step_size", "train/orthogonality_error"} <= set(metrics)
    assert metrics["train/orthogonality_error"] < 1e-8
    assert {"val/stsb_spearman", "val/sickr_spearman", "val/avg_spearman"} <= set(metrics)
    best = cli.trainer.checkpoint_callback.best_model_path
    assert Path(best).is_file() and Path(cli.trainer.checkpoint_callback.last_model_path).is_file()
    return cli.trainer.checkpoint_callback.last_model_path


def check_round_trip(cli, path: str, fixtures: Path) -> None:
    """The checkpoint alone (weights_only) rebuilds the model; evaluate.py scores it like any encoder."""
    expected = cli.model.encode(SENTENCES)  # (4, d)
    assert expected.shape == (4, 4) and torch.isfinite(expected).all()
    encoder, checkpoint = encoder_from_checkpoint(path)
    assert isinstance(encoder, FILMEncoder) and checkpoint["objective"].endswith("FILMObjective")
    torch.testing.assert_close(encoder.encode(SENTENCES), expected, rtol=0, atol=0)
    results = evaluate.evaluate(sts_dir=str(fixtures / "sts"), ckpt_path=path, tasks=["stsb", "sickr"])
    assert all(-100 <= results[t] <= 100 for t in ("stsb", "sickr"))


def test_tfidf_config_fits_round_trips_and_resumes(tmp_path, fixtures_dir):
    cli = train.main(film_args("film_tfidf.yaml", tmp_path, fixtures_dir))
    path = check_fit(cli)
    # stopped after 5 steps and resumed: the solver continues from its saved state (the optimizer's)
    first = train.main(film_args("film_tfidf.yaml", tmp_path / "resumed", fixtures_dir, "--trainer.max_steps", "5"))
    resumed = train.main(film_args("film_tfidf.yaml", tmp_path / "resumed", fixtures_dir, "--ckpt_path", "last"))
    assert resumed.trainer.global_step == cli.trainer.global_step > 5
    history = resumed.model._state.history
    assert [h["iteration"] for h in history[:5]] == [2, 3, 4, 5, 6]
    assert history[:4] == first.model._state.history[-4:]
    checkpoint = load_checkpoint(path)
    vocabulary = checkpoint["encoder_config"]["vocabulary"]
    assert checkpoint["state_dict"]["encoder.projection"].shape == (4, len(vocabulary))
    assert "dog" in vocabulary and "zzz" not in vocabulary
    check_round_trip(cli, path, fixtures_dir)
    # the model applies L as the solver does (FILM.transform on the fitted features)
    sentences = cli.datamodule.train_sentences[:6]
    X = cli.model.encoder._tfidf().transform(sentences).T  # (D, 6)
    torch.testing.assert_close(cli.model.encoder.project(sentences), torch.from_numpy(cli.model.solver.transform(X)))
    # the vectorizer rebuilt from vocabulary + idf gives scikit-learn's own fitted features
    rebuilt = encoder_from_checkpoint(path)[0]
    fitted = cli.model.encoder._tfidf().transform(SENTENCES)
    assert abs(rebuilt._tfidf().transform(SENTENCES) - fitted).max() == 0


def test_frozen_encoder_config_fits_and_round_trips(tmp_path, fixtures_dir, tiny_model_dir):
    cli = train.main(film_args("film_frozen_encoder.yaml", tmp_path, fixtures_dir, *tiny_encoder(tiny_model_dir)))
    path = check_fit(cli)
    base = cli.model.encoder.base
    assert not base.training and not any(p.requires_grad for p in base.parameters())
    untouched = SentenceEncoder(tiny_model_dir)
    assert all(torch.equal(a, b) for a, b in zip(base.state_dict().values(), untouched.state_dict().values()))
    check_round_trip(cli, path, fixtures_dir)
    # validation's remembered features are the frozen encoder's own
    dev = cli.datamodule.dev_sets["stsb"].sentences[:8]
    torch.testing.assert_close(cli.model.encoder(dev), cli.model.encode(dev), rtol=1e-4, atol=1e-5)


def test_triplets_from_sts_pairs(tmp_path, fixtures_dir):
    cli = train.main(film_args("film_tfidf.yaml", tmp_path, fixtures_dir, "--data.init_args.triplets_from", "sts",
                               train_source=fixtures_dir / "sts" / "stsb.train.tsv"))
    check_fit(cli)
    triplets = cli.datamodule.train_triplets
    assert triplets.shape[1] == 3 and (triplets[:, 0] != triplets[:, 1]).all()


def write_nli(path: Path, rows: list[tuple[str, str, str]]) -> str:
    path.write_text("premise\thypothesis\tlabel\n" + "".join(f"{p}\t{h}\t{y}\n" for p, h, y in rows))
    return str(path)


def bad_input_message(args: list[str], capsys) -> str:
    """The last line of stderr (the whole of it for errors in a model's arguments, which jsonargparse reports)."""
    with pytest.raises(SystemExit) as exit_info:
        train.main(args)
    assert exit_info.value.code == 2
    err = capsys.readouterr().err
    assert "Traceback" not in err
    return err if "Given value" in err else err.strip().splitlines()[-1]


def test_dim_larger_than_rank_fails_before_any_work(tmp_path, fixtures_dir, capsys):
    args = film_args("film_tfidf.yaml", tmp_path, fixtures_dir, "--model.init_args.rank", "2")
    message = bad_input_message(args, capsys)
    assert "model.dim d=4 is larger than model.rank r=2; need d <= r" in message


def test_dim_larger_than_the_features_rank(tmp_path, fixtures_dir, capsys):
    args = film_args("film_tfidf.yaml", tmp_path, fixtures_dir, "--model.init_args.dim", "500")
    message = bad_input_message(args, capsys)
    assert message.startswith("error: dim d=500 is larger than the rank r=")


def test_no_triplets_names_the_files(tmp_path, fixtures_dir, capsys):
    source = write_nli(tmp_path / "neutral.tsv", [("A man sleeps.", "A man rests.", "neutral"),
                                                   ("A man sleeps.", "Nobody sleeps.", "contradiction")])
    message = bad_input_message(film_args("film_tfidf.yaml", tmp_path, fixtures_dir, train_source=source), capsys)
    assert message == (f"error: {source}: no triplets could be generated from the data: "
                       "no premise has both an entailment and a contradiction")


def test_empty_vocabulary(tmp_path, fixtures_dir, capsys):
    source = write_nli(tmp_path / "letters.tsv", [("a", "b", "entailment"), ("a", "c", "contradiction")])
    message = bad_input_message(film_args("film_tfidf.yaml", tmp_path, fixtures_dir, train_source=source), capsys)
    assert message.startswith("error: empty vocabulary: the sentences contain no token the vectorizer keeps")


def test_nan_features_name_a_sentence(tmp_path, fixtures_dir, tiny_model_dir, capsys, monkeypatch):
    def nan_encode(self, sentences, **kwargs):
        return torch.full((len(sentences), self.dim), float("nan"))

    monkeypatch.setattr(SentenceEncoder, "encode", nan_encode)
    args = film_args("film_frozen_encoder.yaml", tmp_path, fixtures_dir, *tiny_encoder(tiny_model_dir))
    message = bad_input_message(args, capsys)
    assert message.startswith(f"error: the frozen encoder {tiny_model_dir!r} gives NaN or inf features for ")


def test_encoder_and_features_must_agree(tmp_path, fixtures_dir, tiny_model_dir, capsys):
    args = film_args("film_tfidf.yaml", tmp_path, fixtures_dir, "--model.init_args.encoder",
                     "encoders.SentenceEncoder",
                     "--model.init_args.encoder.init_args.model_name", tiny_model_dir)
    assert "model.encoder is only used with features='encoder'" in bad_input_message(args, capsys)
