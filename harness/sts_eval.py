"""SentEval-exact STS evaluation: the numbers of the SBERT, SimCSE and DCLR tables.

STS12-16 use SentEval's "all" setting as SimCSE reports it: the cosine scores of every subset
of a year are concatenated and one Spearman correlation is taken over them (not the mean of
the subsets' correlations). STS-B and SICK-R: Spearman of cosine on the test split, with no
regression head. Figures are Spearman x 100; the average is over the seven tasks.
"""
from __future__ import annotations

from typing import IO, Callable, Sequence

import numpy as np
import torch
import torch.nn.functional as F
from scipy.stats import spearmanr

from datamodules import STS_TASKS, load_sts_task

from .figures import figure
from .progress import Progress


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
    progress: IO[str] | None = None,
) -> dict[str, object]:
    """Run the STS tasks with an ``encode(sentences) -> (N, H)`` function on the data in ``sts_dir``:
    this project's TSV layout or SentEval's data folder (``datamodules.sts.sts_layout``).

    Every distinct sentence is encoded once: the seven tasks' 37,700 sentences hold 26,126 distinct
    ones, and ``encode`` batches each call's sentences by length. A task's call holds the sentences no
    earlier task had, so its figures are known (and, with ``progress``, reported with the time left)
    as soon as it is done. A sentence's embedding does not depend on what it is batched with, up to
    floating-point rounding, so the figures are those of encoding every pair.

    Returns ``{task: all-Spearman, ..., "avg": mean, "subsets": {task: {subset: Spearman}},
    "pairs": {task: pairs scored}}``: the pair counts tell SentEval's test sets from a sample.
    """
    data = {task: load_sts_task(sts_dir, task) for task in tasks}  # every file read before any encoding
    rows: dict[str, int] = {}  # distinct sentence -> row of the embedding matrix
    texts: dict[tuple[str, str], tuple[list[str], list[str]]] = {}
    new: dict[str, list[str]] = {}  # the sentences each task adds
    for task, task_subsets in data.items():
        before = len(rows)
        for subset, pairs in task_subsets.items():
            s1 = [senteval_text(s) for s in pairs["sentence1"]]
            s2 = [senteval_text(s) for s in pairs["sentence2"]]
            texts[task, subset] = (s1, s2)
            for s in s1 + s2:
                rows.setdefault(s, len(rows))
        new[task] = list(rows)[before:] if len(rows) > before else []
    report = Progress("STS", {t: len(new[t]) for t in tasks}, stream=progress) if progress is not None else None
    if report is not None:  # the first task holds most of the distinct sentences: minutes on a CPU
        report.begin(f"encoding {len(rows)} distinct sentences of {len(tasks)} task(s), {tasks[0]} first "
                     f"({len(new[tasks[0]])}); a line as each task ends")
    chunks: list[torch.Tensor] = []
    results: dict[str, object] = {}
    subsets_out: dict[str, dict[str, float]] = {}
    pairs_out: dict[str, int] = {}
    for task in tasks:
        if new[task]:
            chunks.append(encode(new[task]).float().cpu())  # (D_task, H)
        emb = torch.cat(chunks) if len(chunks) > 1 else chunks[0]  # (D, H), row = rows[sentence]
        chunks = [emb]
        subsets = {}
        for subset, pairs in data[task].items():
            s1, s2 = texts[task, subset]
            u = emb[torch.tensor([rows[s] for s in s1])]  # (N, H)
            v = emb[torch.tensor([rows[s] for s in s2])]  # (N, H)
            cos = F.cosine_similarity(u, v, dim=-1).cpu().numpy()  # (N,)
            subsets[subset] = (cos, np.asarray(pairs["score"], dtype=np.float64))
        scores = aggregate_all(subsets)
        results[task] = scores.pop("all")
        subsets_out[task] = scores
        pairs_out[task] = sum(len(gold) for _, gold in subsets.values())
        if report is not None:
            report.done(task, f"{figure(results[task])} ({pairs_out[task]} pairs, {len(new[task])} new sentences)")
    if report is not None:
        report.close()
    results["avg"] = float(np.mean([results[t] for t in tasks]))
    results["subsets"] = subsets_out
    results["pairs"] = pairs_out
    return results


def format_table(rows: dict[str, dict[str, object]], tasks: Sequence[str] = STS_TASKS) -> str:
    """A Markdown table: one row per model, Spearman x 100 with two decimals (``harness.figures``: the docs' rule)."""
    header = "| model | " + " | ".join(t.upper().replace("SICKR", "SICK-R").replace("STSB", "STS-B") for t in tasks) + " | avg |"
    lines = [header, "|" + "---|" * (len(tasks) + 2)]
    for name, res in rows.items():
        lines.append(f"| {name} | " + " | ".join(figure(res[t]) for t in tasks) + f" | {figure(res['avg'])} |")
    return "\n".join(lines)
