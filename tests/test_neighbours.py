"""Batches that hold near neighbours (datamodules/neighbours.py): the groups are the neighbours they promise, the
sampler deals them whole, and any objective's data module takes the option."""
from __future__ import annotations

import pytest
import torch

import train
from datamodules import WikiDataModule
from datamodules.batching import SentenceBatchSampler
from datamodules.neighbours import nearest, neighbour_groups
from encoders.sentence import SentenceEncoder
from tests.test_train import objective_config


def clusters(n_clusters: int = 4, size: int = 8, dim: int = 16, seed: int = 0) -> tuple[torch.Tensor, list[set[int]]]:
    """Tight clusters around random directions, their rows shuffled; returns the rows and each cluster's rows."""
    g = torch.Generator().manual_seed(seed)
    centres = torch.randn(n_clusters, dim, generator=g)
    rows = centres.repeat_interleave(size, 0) + 0.01 * torch.randn(n_clusters * size, dim, generator=g)
    perm = torch.randperm(len(rows), generator=g)
    members = [set() for _ in range(n_clusters)]
    for new, old in enumerate(perm.tolist()):
        members[old // size].add(new)
    return rows[perm], members


def test_groups_are_the_clusters_of_near_neighbours():
    rows, members = clusters()
    groups = neighbour_groups(rows, size=8, seed=3)
    assert sorted(map(sorted, groups)) == sorted(map(sorted, members))
    assert sorted(i for g in groups for i in g) == list(range(len(rows)))  # every row once
    # the nearest neighbours of a row are its cluster
    near = nearest(rows, 7)
    assert all(set(near[i].tolist()) | {i} in members for i in range(len(rows)))


def test_a_group_size_that_does_not_divide_keeps_every_row_once():
    rows, _ = clusters(n_clusters=3, size=5)
    groups = neighbour_groups(rows, size=4, seed=0)
    assert sorted(i for g in groups for i in g) == list(range(15)) and all(len(g) <= 4 for g in groups)


def test_the_sampler_deals_whole_groups_in_a_new_order_each_epoch():
    rows, members = clusters(n_clusters=6, size=4)
    groups = neighbour_groups(rows, size=4, seed=0)
    sampler = SentenceBatchSampler([0] * len(rows), batch_size=8, groups=groups, seed=1)
    first = list(sampler)
    assert all(any(set(batch) == a | b for a in members for b in members if a != b) for batch in first)
    sampler.set_epoch(1)
    assert list(sampler) != first
    with pytest.raises(ValueError, match="choose one"):
        SentenceBatchSampler([0] * len(rows), batch_size=8, groups=groups, group_by_length=True)


def test_a_data_module_groups_its_rows_by_a_models_neighbours(tiny_model_dir, fixtures_dir):
    encoder = SentenceEncoder(tiny_model_dir)
    dm = WikiDataModule(train_source=str(fixtures_dir / "sentences.txt"), per_device_batch_size=8,
                        neighbour_batches=tiny_model_dir, neighbour_group_size=4, seed=0)
    dm.use_tokenizer(**encoder.tokenization())
    dm.setup("fit")
    groups = dm.train_sampler.groups
    sentences = list(dm.train_dataset["sentence"])
    emb = torch.nn.functional.normalize(SentenceEncoder(tiny_model_dir).encode(sentences), dim=-1)
    within = torch.stack([emb[g[0]] @ emb[g[1]] for g in groups if len(g) > 1]).mean()
    everyone = (emb @ emb.T).mean()
    assert within > everyone  # a group's rows are nearer each other than rows at random
    batches = list(dm.train_sampler)
    as_groups = {frozenset(g) for g in groups}
    whole = sum(any(frozenset(b[i:i + 4]) in as_groups for i in range(0, 8, 4)) for b in batches if len(b) == 8)
    assert whole >= len(batches) // 2  # whole groups, save where a repeated sentence moved one on


@pytest.mark.parametrize("model, data, extra", [
    ("SimCSE", "WikiDataModule", {}),
    ("MNR", "NLIDataModule", {"view": "pairs"}),
])
def test_any_objective_trains_on_neighbour_batches(tmp_path, tiny_model_dir, fixtures_dir, model, data, extra):
    config = objective_config(tmp_path, tiny_model_dir, fixtures_dir, model, data,
                              data_args={**extra, "neighbour_batches": tiny_model_dir, "neighbour_group_size": 4})
    cli = train.main(["--config", config, "--trainer.max_steps", "2", "--validate_first", "false"])
    assert cli.trainer.global_step == 2 and cli.datamodule.train_sampler.groups is not None
