"""Hard-negative mining: (anchor, positive) rows in, (anchor, positive, negative_1 ... negative_n) rows out.

``mine_hard_negatives`` is the one function behind ``python mine.py`` / ``sentemb-mine``. It embeds every
anchor and every distinct positive with an encoder (any ``encoders.load`` source), finds each anchor's
nearest positives of other rows by exact cosine search (``chunked_topk``: memory bounded by the chunk
size, whatever the corpus), filters the candidates, and writes a TSV that
``NLIDataModule(view="triplets", num_negatives=n)`` reads.

What a candidate must pass, in this order (the summary counts what each step removes):

1. it is not a positive of the anchor, nor the exact text of the anchor or of the positive;
2. its rank among the remaining candidates lies in ``[range_min, range_max)``;
3. its score is at most ``max_score``;
4. its score is at most the positive's score minus ``absolute_margin``;
5. its score is at most ``(1 - relative_margin)`` times the positive's score: the positive-aware filter of
   NV-Retriever (Moreira et al. 2024, arXiv 2407.15831, "TopK-PercPos" at 95 %, ``relative_margin=0.05``),
   which drops the near-copies of the positive that a naive top-k keeps as (false) negatives.

Of the candidates left, ``sampling="top"`` keeps the ``num_negatives`` best ranked, ``"random"`` draws them
uniformly (seeded); a row with fewer candidates left is not written. The option names follow
sentence-transformers' ``mine_hard_negatives``; scores are cosines.

It lives with the data modules because it makes training rows from data files, with their readers and
their errors (file and line), as ``neighbours.py`` groups rows by a model's embeddings.

Exact search only: ``faiss`` is not a dependency of this project, so there is no approximate path.
"""
from __future__ import annotations

import math
import os
import time
from dataclasses import dataclass, field
from typing import IO, Literal, Sequence

import numpy as np
import torch
from torch import Tensor

from .io import DataError, check_text_columns, describe_row, load_source, require_columns

Sampling = Literal["top", "random"]
FILTERS = ("positive or duplicate", "rank window", "max_score", "absolute_margin", "relative_margin")
QUANTILES = (0.0, 0.05, 0.25, 0.5, 0.75, 0.95, 1.0)


def chunked_topk(queries: Tensor, corpus: Tensor, k: int, chunk_size: int = 4096) -> tuple[Tensor, Tensor]:
    """The exact top-k of ``queries @ corpus.T`` per query, best first, never holding more than a
    (chunk_size, k + chunk_size) block of scores: queries and corpus are both read chunk by chunk, and each
    corpus chunk's scores are merged into the running top-k.

    queries: (Q, H); corpus: (C, H) -> scores (Q, min(k, C)), corpus ids (Q, min(k, C)) long
    """
    if chunk_size < 1:
        raise ValueError(f"chunk_size must be positive, got {chunk_size}")
    k = min(k, corpus.shape[0])
    scores, ids = [], []
    for q_start in range(0, queries.shape[0], chunk_size):
        q = queries[q_start:q_start + chunk_size]  # (q, H)
        best_s = q.new_empty(q.shape[0], 0)  # (q, <=k)
        best_i = torch.empty(q.shape[0], 0, dtype=torch.long, device=q.device)
        for c_start in range(0, corpus.shape[0], chunk_size):
            block = q @ corpus[c_start:c_start + chunk_size].T  # (q, c)
            block_ids = torch.arange(c_start, c_start + block.shape[1], device=q.device).expand(q.shape[0], -1)
            cand_s, cand_i = torch.cat([best_s, block], 1), torch.cat([best_i, block_ids], 1)  # (q, <=k + c)
            top = cand_s.topk(min(k, cand_s.shape[1]), dim=1)
            best_s, best_i = top.values, cand_i.gather(1, top.indices)
        scores.append(best_s)
        ids.append(best_i)
    return torch.cat(scores), torch.cat(ids)


def quantile_key(name: str, q: float) -> str:
    """The figure's name of one quantile of a mining summary: ``"negative q95"``."""
    return f"{name} q{round(q * 100)}"


@dataclass
class MiningSummary:
    """What mining saw and kept: the counts of each filter and the kept scores (cosines)."""

    rows: int = 0
    anchors: int = 0
    corpus: int = 0
    candidates: int = 0  # retrieved candidates up to the range_max-th that is not a positive or duplicate
    removed: dict[str, int] = field(default_factory=lambda: dict.fromkeys(FILTERS, 0))
    not_sampled: int = 0  # passed every filter, beyond the num_negatives chosen
    rows_written: int = 0
    rows_short: int = 0  # fewer than num_negatives candidates passed: not written
    positive_scores: list[float] = field(default_factory=list)  # of the rows written
    negative_scores: list[float] = field(default_factory=list)  # of the negatives written
    relative_scores: list[float] = field(default_factory=list)  # negative score / its row's positive score

    def quantiles(self) -> dict[str, list[float]]:
        """The QUANTILES of the written positives' and negatives' scores and of their ratio (empty: none written)."""
        if not self.negative_scores:
            return {}
        return {name: np.nanquantile(np.asarray(values, dtype=np.float64), QUANTILES).tolist()  # torch's stops at 2^24
                for name, values in (("positive", self.positive_scores), ("negative", self.negative_scores),
                                     ("negative / positive", self.relative_scores))}

    def figures(self) -> dict[str, float]:
        """Every count and quantile as one flat mapping (a record's figures)."""
        out = {"rows": self.rows, "anchors": self.anchors, "corpus": self.corpus, "candidates": self.candidates,
               **{f"removed {name}": count for name, count in self.removed.items()},
               "not_sampled": self.not_sampled, "rows_written": self.rows_written, "rows_short": self.rows_short}
        for name, qs in self.quantiles().items():
            out.update({quantile_key(name, q): round(v, 4) for q, v in zip(QUANTILES, qs)})
        return out

    def format(self) -> str:
        lines = [f"rows read: {self.rows} ({self.anchors} distinct anchors); corpus: {self.corpus} distinct positives",
                 f"candidates seen: {self.candidates}"]
        lines += [f"  removed by {name}: {count}" for name, count in self.removed.items()]
        lines += [f"  passed, not sampled: {self.not_sampled}",
                  f"rows written: {self.rows_written}; rows with too few candidates left (not written): "
                  f"{self.rows_short}"]
        if self.negative_scores:
            head = "quantile".ljust(24) + "".join(f"{q:>8.0%}" for q in QUANTILES)
            lines += ["score distribution of what was written (cosine):", head]
            lines += [name.ljust(24) + "".join(f"{v:8.3f}" for v in qs) for name, qs in self.quantiles().items()]
        return "\n".join(lines)


def read_pairs(source: str) -> tuple[list[str], list[str]]:
    """(anchors, positives) of a pair file (``anchor``, ``positive`` columns; any others ignored) or the
    entailment pairs of an NLI file (``premise``, ``hypothesis``, ``label``). Errors name the file and line."""
    from .nli import load_nli

    ds = load_source(source)
    if "anchor" in ds.column_names:
        require_columns(ds, ["anchor", "positive"], source)
        check_text_columns(ds, ["anchor", "positive"], source)
        _check_tsv_safe(ds, ["anchor", "positive"], source)
        return list(ds["anchor"]), list(ds["positive"])
    if "premise" not in ds.column_names:
        raise DataError(f"{describe_row(source, -1)}: needs columns anchor, positive (pairs) or premise, hypothesis, "
                        f"label (NLI); the header has {ds.column_names}")
    nli = load_nli(source)
    _check_tsv_safe(nli, ["premise", "hypothesis"], source)
    rows = [(p, h) for p, h, y in zip(nli["premise"], nli["hypothesis"], nli["label"]) if y == 0]  # entailment
    if not rows:
        raise DataError(f"{source}: no entailment pairs")
    return [p for p, _ in rows], [h for _, h in rows]


def _check_tsv_safe(ds, columns: Sequence[str], source: str) -> None:
    """The output is a TSV read without quoting: a tab or line break inside a sentence cannot be written."""
    for column in columns:
        for row, text in enumerate(ds[column]):
            if "\t" in text or "\n" in text or "\r" in text:
                raise DataError(f"{describe_row(source, row)}: the sentence in column {column!r} holds a tab or "
                                "line break, which the mined TSV cannot hold")


def _check_options(num_negatives: int, range_min: int, range_max: int, sampling: str,
                   absolute_margin: float | None, relative_margin: float | None, max_score: float | None,
                   chunk_size: int) -> None:
    if num_negatives < 1:
        raise ValueError(f"--num_negatives must be at least 1, got {num_negatives}")
    if range_min < 0:
        raise ValueError(f"--range_min must be >= 0, got {range_min}")
    if range_max < range_min + num_negatives:
        raise ValueError(f"--range_max ({range_max}) leaves fewer than num_negatives ({num_negatives}) ranks after "
                         f"range_min ({range_min}); the smallest valid range_max is {range_min + num_negatives}")
    if sampling not in ("top", "random"):
        raise ValueError(f"--sampling must be 'top' or 'random', got {sampling!r}")
    if relative_margin is not None and not 0 <= relative_margin < 1:
        raise ValueError(f"--relative_margin must be in [0, 1), got {relative_margin}")
    if absolute_margin is not None and not absolute_margin >= 0:
        raise ValueError(f"--absolute_margin must be >= 0, got {absolute_margin}")
    if max_score is not None and not -1 <= max_score <= 1:
        raise ValueError(f"--max_score is a cosine in [-1, 1], got {max_score}")
    if chunk_size < 1:
        raise ValueError(f"--chunk_size must be positive, got {chunk_size}")


class _Log:
    """Progress lines for long mining (stderr by default), with the time spent so far."""

    def __init__(self, stream: IO[str] | None) -> None:
        self.stream, self.start = stream, time.perf_counter()

    def __call__(self, what: str, done: int, total: int) -> None:
        if self.stream is not None:
            print(f"mining: {what} {done}/{total} ({time.perf_counter() - self.start:.0f} s)", file=self.stream,
                  flush=True)


def _embed(encoder, sentences: list[str], batch_size: int, precision: str, block: int, what: str, log: _Log) -> Tensor:
    parts = []
    for start in range(0, len(sentences), block):
        parts.append(encoder.encode(sentences[start:start + block], batch_size=batch_size, normalize=True,
                                    precision=precision).float())
        log(f"embedding {what}", min(start + block, len(sentences)), len(sentences))
    return torch.cat(parts)  # (N, H) unit vectors


def select_negatives(
    scores: Tensor, ids: Tensor, excluded: Tensor, positive_scores: Tensor, num_negatives: int, range_min: int,
    range_max: int, sampling: Sampling = "top", absolute_margin: float | None = None,
    relative_margin: float | None = None, max_score: float | None = None, generator: torch.Generator | None = None,
    summary: MiningSummary | None = None,
) -> tuple[Tensor, Tensor, Tensor]:
    """The filters of the module docstring on retrieved candidates, for R rows at once.

    scores, ids: (R, K) a row's retrieved candidates, best first; excluded: (R, K) bool, a positive or a
    duplicate of the row's anchor or positive; positive_scores: (R,).
    Returns the chosen corpus ids (R, n) and their scores (R, n) in rank order, and which rows have n (R,).
    """
    usable = ~excluded  # (R, K)
    rank = usable.long().cumsum(1) - 1  # (R, K) rank among the non-excluded candidates
    seen = rank < range_max  # up to the range_max-th usable candidate, excluded ones before it included
    window = usable & seen & (rank >= range_min)
    steps = [("positive or duplicate", excluded & seen), ("rank window", usable & seen & ~window)]
    keep = window
    pos = positive_scores[:, None]  # (R, 1)
    for name, active, over in (("max_score", max_score is not None, lambda: scores > max_score),
                               ("absolute_margin", absolute_margin is not None, lambda: scores > pos - absolute_margin),
                               ("relative_margin", relative_margin is not None,
                                lambda: scores > (1 - relative_margin) * pos)):
        if active:
            removed = keep & over()
            steps.append((name, removed))
            keep = keep & ~removed
    if sampling == "random":  # a uniform draw among the kept: random keys, the kept first
        keys = torch.rand(keep.shape, generator=generator).to(scores.device)
        order = torch.where(keep, keys, keys - 2).argsort(1, descending=True)  # (R, K)
        order = order[:, :num_negatives].sort(1).values  # rank order of the chosen
    else:
        order = (keep.long() * (keep.shape[1] - torch.arange(keep.shape[1], device=keep.device))).argsort(
            1, descending=True)[:, :num_negatives].sort(1).values  # the first n kept, in rank order
    chosen_ok = keep.gather(1, order)  # (R, n)
    full = chosen_ok.all(1)  # (R,)
    if summary is not None:
        summary.candidates += int(seen.sum())
        for name, mask in steps:
            summary.removed[name] += int(mask.sum())
        summary.not_sampled += int(keep.sum()) - int(chosen_ok.sum())
    return ids.gather(1, order), scores.gather(1, order), full


def mine_hard_negatives(
    inputs: str | list[str],
    model: str,
    output: str,
    num_negatives: int = 3,
    range_min: int = 0,
    range_max: int = 10,
    sampling: Sampling = "top",
    absolute_margin: float | None = None,
    relative_margin: float | None = None,
    max_score: float | None = None,
    pooling: str | None = None,
    batch_size: int = 64,
    chunk_size: int = 4096,
    precision: Literal["32", "bf16", "16"] = "32",
    device: str | None = None,
    seed: int = 0,
    progress: IO[str] | None = None,
) -> MiningSummary:
    """Mine hard negatives for every (anchor, positive) row: exact cosine search over the distinct positives,
    then the filters (positives and exact duplicates never; the rank window; max_score; the absolute and the
    relative margin), then ``num_negatives`` per row. Writes the rows (anchor, positive, negative_1 ... negative_n)
    and counts what each filter removed and the scores kept: the summary the command prints.

    Args:
        inputs: pair files (anchor, positive columns) or NLI files (premise, hypothesis, label: the entailment
            pairs); one file or a list ``[a.tsv,b.tsv]``, concatenated.
        model: the encoder that scores: a ``*.ckpt`` of this project, a model directory or a hub name.
        output: the TSV to write (anchor, positive, negative_1 ... negative_n); never overwritten.
        num_negatives: negatives per row; a row with fewer candidates left is not written.
        range_min: skip the best range_min candidates (positives and duplicates set aside first).
        range_max: consider candidates up to this rank (exclusive).
        sampling: top (the best ranked left) or random (a uniform draw among those left).
        absolute_margin: drop a candidate scoring above the positive's score minus this.
        relative_margin: drop a candidate scoring above (1 - this) x the positive's score (NV-Retriever's
            positive-aware filter: 0.05 keeps what scores at most 95 % of the positive).
        max_score: drop a candidate whose cosine with the anchor is above this.
        pooling: pooling for a model without its own (default mean).
        batch_size: sentences per encoding batch.
        chunk_size: rows and corpus sentences per block of the exact search (memory ~ chunk_size^2 scores).
        precision: 32, or bf16/16 autocast for the encoder.
        device: cpu, cuda, ... (default: cuda when available).
        seed: the draw of sampling random.
        progress: where progress lines go (None: nowhere; the command line: standard error).
    """
    import encoders

    _check_options(num_negatives, range_min, range_max, sampling, absolute_margin, relative_margin, max_score,
                   chunk_size)
    if os.path.exists(output):
        raise FileExistsError(f"{output}: already exists; choose another output (mined files are never overwritten)")
    sources = [inputs] if isinstance(inputs, str) else list(inputs)
    if not sources:
        raise ValueError("give at least one input file")
    anchors_all: list[str] = []
    positives_all: list[str] = []
    for source in sources:  # every file is read and checked before the model is loaded
        a, p = read_pairs(source)
        anchors_all += a
        positives_all += p
    log = _Log(progress)
    corpus = list(dict.fromkeys(positives_all))  # distinct positives, in order of first appearance
    corpus_id = {s: i for i, s in enumerate(corpus)}
    anchors = list(dict.fromkeys(anchors_all))
    anchor_id = {s: i for i, s in enumerate(anchors)}
    # every corpus id that is never a negative of an anchor: its positives, and its own text
    banned: list[set[int]] = [set() for _ in anchors]
    for a, p in zip(anchors_all, positives_all):
        banned[anchor_id[a]].add(corpus_id[p])
    for a, i in anchor_id.items():
        if a in corpus_id:
            banned[i].add(corpus_id[a])
    width = max(len(b) for b in banned)
    banned_ids = torch.full((len(anchors), width), -1, dtype=torch.long)  # (A, width), -1 = none
    for i, b in enumerate(banned):
        banned_ids[i, :len(b)] = torch.tensor(sorted(b))

    device = device or ("cuda" if torch.cuda.is_available() else "cpu")
    encoder = encoders.load(model, pooling).to(device)
    block = max(chunk_size, batch_size)
    corpus_emb = _embed(encoder, corpus, batch_size, precision, block, "positives", log)  # (C, H)
    anchor_emb = _embed(encoder, anchors, batch_size, precision, block, "anchors", log)  # (A, H)

    summary = MiningSummary(rows=len(anchors_all), anchors=len(anchors), corpus=len(corpus))
    generator = torch.Generator().manual_seed(seed)
    k = range_max + width  # enough for range_max usable candidates after the banned ones
    row_anchor = torch.tensor([anchor_id[a] for a in anchors_all])  # (R,)
    row_positive = torch.tensor([corpus_id[p] for p in positives_all])  # (R,)
    tmp = output + ".partial"
    os.makedirs(os.path.dirname(os.path.abspath(output)), exist_ok=True)
    with open(tmp, "w", encoding="utf-8", newline="\n") as out:
        out.write("\t".join(["anchor", "positive", *(f"negative_{i}" for i in range(1, num_negatives + 1))]) + "\n")
        for start in range(0, len(anchors_all), chunk_size):
            rows = torch.arange(start, min(start + chunk_size, len(anchors_all)))  # (r,)
            a_ids, p_ids = row_anchor[rows], row_positive[rows]
            scores, ids = chunked_topk(anchor_emb[a_ids], corpus_emb, k, chunk_size)  # (r, K) each
            scores, ids = scores.cpu(), ids.cpu()
            excluded = (ids[:, :, None] == banned_ids[a_ids][:, None, :]).any(-1)  # (r, K)
            positive_scores = (anchor_emb[a_ids] * corpus_emb[p_ids]).sum(-1).cpu()  # (r,)
            chosen, chosen_scores, full = select_negatives(
                scores, ids, excluded, positive_scores, num_negatives, range_min, range_max, sampling,
                absolute_margin, relative_margin, max_score, generator, summary)
            for r in torch.nonzero(full).flatten().tolist():
                row = int(rows[r])
                out.write("\t".join([anchors_all[row], positives_all[row], *(corpus[j] for j in chosen[r].tolist())])
                          + "\n")
                summary.positive_scores.append(float(positive_scores[r]))
                summary.negative_scores += chosen_scores[r].tolist()
                pos = float(positive_scores[r])
                summary.relative_scores += [s / pos if pos != 0 else math.nan for s in chosen_scores[r].tolist()]
            summary.rows_written += int(full.sum())
            summary.rows_short += int((~full).sum())
            log("searched rows", int(rows[-1]) + 1, len(anchors_all))
    os.replace(tmp, output)  # a run that stops half-way leaves no file that looks finished
    return summary
