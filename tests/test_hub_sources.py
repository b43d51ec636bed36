"""Hub sources, offline: the shipped configs' hub addresses resolve (the download replaced by a fake
that hands back a fixture file), and a hub that cannot be reached is one error line, not a retry loop."""
from __future__ import annotations

import glob
import shutil
import socket
import time
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import yaml
from huggingface_hub.errors import LocalEntryNotFoundError

import datamodules.io as io
import encoders.hub as hub
from datamodules import WikiDataModule
from datamodules.scored import load_sts_pairs, score_range_of
from datamodules.io import DataError, load_source, parse_hub_file
from encoders.sentence import SentenceEncoder
from tests.conftest import ROOT, run_script

# Hub datasets (name:split) the configs may name, each checked on the hub to be data files with no
# loading script (datasets>=4 refuses those): SNLI and MultiNLI were converted to parquet in the hub
# repos `snli`/`multi_nli` redirect to (stanfordnlp/snli, nyu-mll/multi_nli); sentence-transformers/stsb
# never had a script. A new hub dataset in a config is checked the same way and added here.
SCRIPT_FREE_HUB_DATASETS = {"snli", "multi_nli", "sentence-transformers/stsb"}


def config_sources(path: str) -> list[str]:
    data = (yaml.safe_load(Path(path).read_text()) or {}).get("data") or {}
    args = data.get("init_args") or {}
    train = args.get("train_sources") or [args.get("train_source")]
    return [s for s in [*train, *(args.get("val_sources") or {}).values()] if isinstance(s, str)]


def shipped_source(config: str, pick) -> str:
    return pick(yaml.safe_load((ROOT / "configs" / config).read_text())["data"]["init_args"])


class FakeHub:
    """hf_hub_download that 'downloads' a fixture file into a cache directory on the first call
    and, like the real one, answers ``local_files_only`` from that cache alone."""

    def __init__(self, fixture: Path, cache: Path):
        self.fixture, self.cache, self.calls = fixture, cache, []

    def __call__(self, repo_id, filename, *, repo_type=None, revision=None, local_files_only=False, **_):
        self.calls.append(dict(repo_id=repo_id, filename=filename, repo_type=repo_type, revision=revision,
                               local_files_only=local_files_only))
        cached = self.cache / repo_id / (revision or "main") / filename
        if not cached.exists():
            if local_files_only:
                raise LocalEntryNotFoundError("not in the cache")
            cached.parent.mkdir(parents=True, exist_ok=True)
            shutil.copy(self.fixture, cached)
        return str(cached)

    @property
    def downloads(self) -> int:
        return sum(not c["local_files_only"] for c in self.calls)


@pytest.fixture
def online(monkeypatch):
    """As if the network were there: offline mode off and the hub's host reachable."""
    monkeypatch.setattr(io, "_hub_offline", lambda: False)
    monkeypatch.setattr(io, "_hub_unreachable_reason", lambda endpoint: None)


def test_shipped_configs_name_only_loadable_hub_sources():
    sources = [s for c in sorted(glob.glob(str(ROOT / "configs" / "**" / "*.yaml"), recursive=True))
               for s in config_sources(c)]
    assert sources, "no data sources found in configs/"
    for source in sources:
        if io.is_hub_file(source):
            parse_hub_file(source)  # raises on a malformed address
        elif not io.is_local(source):
            assert source.split(":")[0] in SCRIPT_FREE_HUB_DATASETS, source


def test_wiki1m_downloads_once_in_prepare_data_and_setup_reads_the_cache(
        online, monkeypatch, tmp_path, fixtures_dir, tiny_model_dir):
    for config in ("simcse_unsup.yaml", "dclr.yaml"):
        source = shipped_source(config, lambda a: a["train_source"])
        assert source == "hf://datasets/princeton-nlp/datasets-for-simcse/wiki1m_for_simcse.txt", config
    fake = FakeHub(fixtures_dir / "sentences.txt", tmp_path / "cache")
    monkeypatch.setattr(io, "hf_hub_download", fake)
    dm = WikiDataModule(source, per_device_batch_size=4)
    dm.prepare_data()
    dm.prepare_data()  # a second run finds it in the cache
    assert fake.downloads == 1
    assert fake.calls[-1] == dict(repo_id="princeton-nlp/datasets-for-simcse", filename="wiki1m_for_simcse.txt",
                                  repo_type="dataset", revision=None, local_files_only=True)
    dm.use_tokenizer(**SentenceEncoder(tiny_model_dir).tokenization())
    dm.setup("fit")
    assert fake.downloads == 1 and fake.calls[-1]["local_files_only"]
    lines = (fixtures_dir / "sentences.txt").read_text().splitlines()
    assert len(dm.train_dataset) == len(lines)


def test_sickr_validation_is_the_parquet_export_with_sick_columns_and_range(online, monkeypatch, tmp_path):
    source = shipped_source("dclr.yaml", lambda a: a["val_sources"]["sickr"])
    assert parse_hub_file(source) == ("RobZamp/sick", "refs/convert/parquet", "default/validation/0000.parquet")
    assert score_range_of(source) == (1.0, 5.0)
    # SICK's own columns, as the parquet export of the hub's `sick` has them (relatedness 1-5)
    table = pa.table({
        "id": ["1", "2", "3"],
        "sentence_A": ["A man is playing a guitar.", "A dog runs.", "Kids are in a yard."],
        "sentence_B": ["A man plays the guitar.", "A cat sleeps.", "Children play outside."],
        "label": [0, 1, 1],
        "relatedness_score": [4.9, 1.0, 3.0],
        "entailment_AB": ["A_entails_B", "A_neutral_B", "A_neutral_B"],
    })
    pq.write_table(table, tmp_path / "sick.parquet")
    fake = FakeHub(tmp_path / "sick.parquet", tmp_path / "cache")
    monkeypatch.setattr(io, "hf_hub_download", fake)
    pairs = load_sts_pairs(source)
    assert pairs.column_names == ["sentence1", "sentence2", "score"]
    assert pairs["sentence1"][0] == "A man is playing a guitar."
    assert pairs["score"] == pytest.approx([(4.9 - 1) / 4, 0.0, 0.5])
    assert fake.calls[-1]["revision"] == "refs/convert/parquet"


def test_hub_file_addresses():
    assert parse_hub_file("hf://datasets/o/n@refs%2Fconvert%2Fparquet/c/validation/0000.parquet") == \
        ("o/n", "refs/convert/parquet", "c/validation/0000.parquet")
    assert parse_hub_file("hf://datasets/o/n@v1.0/dir/f.txt") == ("o/n", "v1.0", "dir/f.txt")
    for bad in ("hf://datasets/o/n", "hf://datasets/o/n@/f.txt", "hf://datasets//n/f.txt"):
        with pytest.raises(DataError, match="hf://datasets/<owner>/<name>"):
            parse_hub_file(bad)
    assert io.describe_row("hf://datasets/o/n/f.txt", 4) == "hf://datasets/o/n/f.txt:5"


def test_unreachable_hub_split_is_one_error_naming_the_way_out(online, monkeypatch):
    def no_answer(*args, **kwargs):  # what datasets raises once huggingface_hub has given up
        raise ConnectionError("Couldn't reach 'sentence-transformers/stsb' on the Hub (LocalEntryNotFoundError)")

    monkeypatch.setattr(io.datasets, "load_dataset", no_answer)
    with pytest.raises(DataError) as err:
        load_source("sentence-transformers/stsb:validation")
    message = str(err.value)
    assert message.startswith("sentence-transformers/stsb:validation: the Hugging Face hub cannot be reached")
    assert "HF_HUB_OFFLINE=1" in message and "local file" in message and "\n" not in message


def test_unreachable_host_fails_at_once_without_the_retry_loop(monkeypatch):
    def no_route(*args, **kwargs):
        raise socket.gaierror(-2, "Name or service not known")

    def never(*args, **kwargs):
        raise AssertionError("the hub was asked although its host is unreachable")

    monkeypatch.setattr(io, "_hub_offline", lambda: False)
    for var in ("HTTPS_PROXY", "https_proxy", "ALL_PROXY", "all_proxy"):
        monkeypatch.delenv(var, raising=False)
    monkeypatch.setattr(hub.socket, "create_connection", no_route)
    monkeypatch.setattr(io.datasets, "load_dataset", never)
    monkeypatch.setattr(io, "hf_hub_download", lambda *a, local_files_only=False, **k:
                        (_ for _ in ()).throw(LocalEntryNotFoundError("not cached")) if local_files_only else never())
    io._hub_unreachable_reason.cache_clear()
    try:
        for source in ("snli:train", "hf://datasets/princeton-nlp/datasets-for-simcse/wiki1m_for_simcse.txt"):
            with pytest.raises(DataError, match=r"cannot be reached \(huggingface\.co: Name or service not known\)"
                                                r".*HF_HUB_OFFLINE=1"):
                load_source(source)
    finally:
        io._hub_unreachable_reason.cache_clear()


def test_offline_and_not_cached_is_one_error(monkeypatch):
    monkeypatch.setattr(io, "_hub_offline", lambda: True)  # HF_HUB_OFFLINE=1, as the tests run
    source = "hf://datasets/no-such-owner-3f9c/no-such-repo/wiki.txt"  # the real hf_hub_download, offline
    with pytest.raises(DataError, match="not in the Hugging Face cache, and HF_HUB_OFFLINE=1 forbids"):
        load_source(source)


def test_train_cli_unreachable_hub_source_is_one_line_exit_2(tmp_path):
    start = time.monotonic()
    result = run_script("train.py", "--config", "configs/quickstart.yaml",
                        "--trainer.default_root_dir", str(tmp_path), "--trainer.logger", "false",
                        "--data.init_args.val_sources", "{extra: no-such-owner-3f9c/sts:validation}")
    assert result.returncode == 2, result.stderr[-3000:]
    errors = [line for line in result.stderr.splitlines() if line.startswith("error:")]
    assert len(errors) == 1 and "Traceback" not in result.stderr, result.stderr[-3000:]
    assert errors[0].startswith("error: no-such-owner-3f9c/sts:validation: ") and "HF_HUB_OFFLINE=1" in errors[0]
    assert time.monotonic() - start < 120
