import pytest
import torch

from encoders import hub
from encoders.sentence import SentenceEncoder

SENTENCES = ["A dog runs in the park.", "Cats sleep.", "The orchestra performed a long symphony last night."]


def test_dropout_on_in_training_and_off_in_eval(tiny_model_dir):
    enc = SentenceEncoder(tiny_model_dir)
    assert enc.training and enc.transformer.training, "from_pretrained's eval mode must not survive"
    features = enc.tokenize(SENTENCES)
    torch.manual_seed(0)
    a, b = enc(features), enc(features)
    assert not torch.allclose(a, b), "two training passes must differ (dropout on)"
    enc.eval()
    assert torch.equal(enc(features), enc(features))


def test_encode_returns_input_order_and_restores_mode(tiny_model_dir):
    enc = SentenceEncoder(tiny_model_dir)
    together = enc.encode(SENTENCES, batch_size=2)
    one_by_one = torch.cat([enc.encode([s]) for s in SENTENCES])
    assert together.shape == (3, 32)
    torch.testing.assert_close(together, one_by_one, atol=1e-5, rtol=1e-5)
    assert enc.training
    normed = enc.encode(SENTENCES, normalize=True)
    torch.testing.assert_close(normed.norm(dim=-1), torch.ones(3))


@pytest.mark.parametrize("pooling", ["mean", "max", "cls", "cls_before_pooler"])
def test_pooling_ignores_padding(tiny_model_dir, pooling):
    enc = SentenceEncoder(tiny_model_dir, pooling=pooling).eval()
    alone = enc(enc.tokenize(["Cats sleep."]))
    padded = enc(enc.tokenize(["Cats sleep.", SENTENCES[2]]))[:1]
    torch.testing.assert_close(alone, padded, atol=1e-5, rtol=1e-5)


def test_mean_pooling_by_hand(tiny_model_dir):
    enc = SentenceEncoder(tiny_model_dir).eval()
    features = enc.tokenize(["Cats sleep.", SENTENCES[2]])
    tokens = enc.transformer(**features).last_hidden_state
    n = int(features["attention_mask"][0].sum())
    torch.testing.assert_close(enc(features)[0], tokens[0, :n].mean(0))


def test_mlp_head_only_in_training(tiny_model_dir):
    enc = SentenceEncoder(tiny_model_dir, pooling="cls", mlp_head=True, mlp_only_train=True)
    features = enc.tokenize(SENTENCES)
    enc.eval()
    cls = enc.transformer(**features).last_hidden_state[:, 0]
    torch.testing.assert_close(enc(features), cls)
    enc.train()
    enc.transformer.eval()  # isolate the head from dropout
    torch.testing.assert_close(enc(features), enc.mlp(cls))


def test_truncation_for_training_not_for_evaluation(tiny_model_dir):
    enc = SentenceEncoder(tiny_model_dir, max_seq_length=8)
    long = " ".join(["word"] * 40)
    assert enc.tokenize([long])["input_ids"].shape[1] == 8
    assert enc.tokenize([long], train=False)["input_ids"].shape[1] == 42


def test_offline_model_resolves_to_verified_copy(monkeypatch):
    path = hub.resolve_model_name("sentence-transformers/all-MiniLM-L6-v2")
    assert path.endswith("model") and hub.sha256_of(hub.Path(path) / "model.safetensors") == hub.OFFLINE_MODEL_SHA256
    monkeypatch.setattr(hub, "hub_offline", lambda: False)
    monkeypatch.setattr(hub, "hub_unreachable_reason", lambda endpoint: None)
    assert hub.resolve_model_name("bert-base-uncased") == "bert-base-uncased"  # with the hub, hub names unchanged


def test_offline_a_hub_name_is_the_caches_copy_or_one_error_naming_the_ways(monkeypatch, tmp_path):
    monkeypatch.setattr(hub, "hub_offline", lambda: True)
    monkeypatch.setattr(hub, "_cached_snapshot", lambda name: str(tmp_path) if name == "cached/model" else None)
    assert hub.resolve_model_name("cached/model") == str(tmp_path)
    with pytest.raises(hub.ModelResolutionError, match=r"model 'bert-base-uncased': HF_HUB_OFFLINE is set and the "
                                                        r"Hugging Face cache has no copy; stage it"):
        hub.resolve_model_name("bert-base-uncased")


def test_offline_model_hash_mismatch_is_an_error():
    with pytest.raises(hub.ModelResolutionError, match="sha256"):
        hub.verified_offline_copy.__wrapped__("0" * 64)


def test_missing_model_directory_is_an_error(tmp_path):
    with pytest.raises(hub.ModelResolutionError, match="no such model directory: "):
        SentenceEncoder(str(tmp_path / "no-such-model"))
