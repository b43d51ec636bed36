"""SentEval-exact STS evaluation: the numbers of the SBERT, SimCSE and DCLR tables.

STS12-16 use SentEval's "all" setting as SimCSE reports it: the cosine scores of every subset
of a year are concatenated and one Spearman correlation is taken over them (not the mean of
the subsets' correlations). STS-B and SICK-R: Spearman of cosine on the test split, with no
regression head. Figures are Spearman x 100; the average is over the seven tasks.
"""
from __future__ import annotations

from typing import Callable, Sequence

import numpy as np
import torch
import torch.nn.functional as F
from scipy.stats import spearmanr

from datamodules import STS_TASKS, load_sts_task


def senteval_text(sentence: str) -> str:
    """SentEval splits each sentence on whitespace and joins the tokens with single spaces."""
    return " ".join(sentence.split())


def spearman_x100(system: Sequence[float], gold: Sequence[float]) -> float:
    return float(spearmanr(system, gold).statistic * 100)


def aggregate_all(subsets: dict[str, tuple[np.ndarray, np.ndarray]]) -> dict[str, float]:
    """Per-subset Spearman and SentEval's "all": Spearman over the concatenated subsets.

    subsets: name -> (system cosines, gold scores)
    """
    result = {name: spearman_x100(sys, gold) for name, (sys, gold) in subsets.items()}
    system = np.concatenate([s for s, _ in subsets.values()])
    gold = np.concatenate([g for _, g in subsets.values()])
    result["all"] = spearman_x100(system, gold)
    return result


def evaluate_sts(
    encode: Callable[[list[str]], torch.Tensor],
    sts_dir: str,
    tasks: Sequence[str] = STS_TASKS,
) -> dict[str, object]:
    """Run the STS tasks with an ``encode(sentences) -> (N, H)`` function on the data in ``sts_dir``:
    this project's TSV layout or SentEval's data folder (``datamodules.sts.sts_layout``).

    Returns ``{task: all-Spearman, ..., "avg": mean, "subsets": {task: {subset: Spearman}},
    "pairs": {task: pairs scored}}``: the pair counts tell SentEval's test sets from a sample.
    """
    results: dict[str, object] = {}
    subsets_out: dict[str, dict[str, float]] = {}
    pairs_out: dict[str, int] = {}
    for task in tasks:
        subsets = {}
        for subset, pairs in load_sts_task(sts_dir, task).items():
            s1 = [senteval_text(s) for s in pairs["sentence1"]]
            s2 = [senteval_text(s) for s in pairs["sentence2"]]
            emb = encode(s1 + s2).float()  # (2N, H), one call so shared sentences batch together
            u, v = emb[: len(s1)], emb[len(s1):]
            cos = F.cosine_similarity(u, v, dim=-1).cpu().numpy()  # (N,)
            subsets[subset] = (cos, np.asarray(pairs["score"], dtype=np.float64))
        scores = aggregate_all(subsets)
        results[task] = scores.pop("all")
        subsets_out[task] = scores
        pairs_out[task] = sum(len(gold) for _, gold in subsets.values())
    results["avg"] = float(np.mean([results[t] for t in tasks]))
    results["subsets"] = subsets_out
    results["pairs"] = pairs_out
    return results


def format_table(rows: dict[str, dict[str, object]], tasks: Sequence[str] = STS_TASKS) -> str:
    """A Markdown table: one row per model, Spearman x 100 with two decimals."""
    header = "| model | " + " | ".join(t.upper().replace("SICKR", "SICK-R").replace("STSB", "STS-B") for t in tasks) + " | avg |"
    lines = [header, "|" + "---|" * (len(tasks) + 2)]
    for name, res in rows.items():
        lines.append(f"| {name} | " + " | ".join(f"{res[t]:.2f}" for t in tasks) + f" | {res['avg']:.2f} |")
    return "\n".join(lines)
