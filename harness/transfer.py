"""SentEval's seven transfer tasks (MR, CR, SUBJ, MPQA, SST2, TREC, MRPC), as its code runs them.

The protocol is SentEval's (facebookresearch/SentEval, ``senteval/binary.py``, ``sst.py``, ``trec.py``,
``mrpc.py``, ``tools/validation.py``, ``tools/classifier.py``) with the classifier setting SimCSE's
``evaluation.py`` uses for its transfer table (``--mode test``): logistic regression (``nhid 0``), Adam,
batch 64, ``tenacity 5``, ``epoch_size 4``, ``kfold 10``. Figures are test accuracy x 100.

- **Data and order.** Every file is read as SentEval reads it (MR/CR/SUBJ/MPQA and TREC as latin-1,
  SST and MRPC as UTF-8), each sentence split on whitespace and joined with single spaces (its batcher's
  ``' '.join``), and the rows are sorted as SentEval sorts them, by (token count, label), because the
  folds are drawn over that order.
- **MR, CR, SUBJ, MPQA**: 10-fold stratified cross-validation (``StratifiedKFold(shuffle=True,
  random_state=1111)``). In each outer fold, each L2 value in {1e-5, 1e-4, 1e-3, 1e-2} is scored by an
  inner 10-fold cross-validation on the outer training part (each inner fit stops early on its own
  inner test fold, and that fold's best accuracy is its score); the best mean (rounded to 2 decimals,
  first on ties) wins, and a fit on the whole outer training part, stopping early on a random 5 % of it,
  is scored on the outer test fold. The task's figure is the mean over the ten outer folds.
- **SST2**: the given splits: one fit per L2 value on train, stopping early on dev; the best dev
  accuracy picks the L2 value, and that fit is scored on test (SentEval fits it a second time with the
  same seed and data, which gives the same model).
- **TREC, MRPC**: 10-fold cross-validation on train picks the L2 value (``random_state`` = the seed);
  a fit on all of train, stopping early on a random 5 % of it, is scored on test. MRPC's features are
  ``[|u - v|, u * v]`` of the two sentences' embeddings, and it reports F1 of the positive class too.
- **A fit** (``PyTorchClassifier.fit``): ``nn.Linear`` initialised under ``torch.manual_seed(seed)``,
  cross-entropy averaged over each batch, Adam (lr 1e-3) whose weight decay, on weight and bias, is the
  L2 value; each round trains ``epoch_size`` epochs over ``np.random.permutation`` orders drawn after
  ``np.random.seed(seed)``, then scores the dev rows; the best round's weights are kept, and training
  stops at the round where the dev accuracy has failed to improve ``tenacity + 1`` times in all (the
  count never resets) or when more than ``max_epoch`` epochs have run.

What differs is only the speed: all fits of a task that can run together (every outer fold x every
L2 value x every inner fold: 400 for MR) are one batched model, trained with hand-written gradients
and a batched Adam, and scored on their dev rows in one matrix product per round. Each fit keeps
SentEval's own random draws (initial weights and batch orders), so the two implementations differ only
by floating-point rounding.
"""
from __future__ import annotations

import math
import os
import time
from dataclasses import dataclass
from typing import IO, Callable, Literal, Sequence

import numpy as np
import torch

from datamodules.io import DataError
from encoders.paths import data_path

from .figures import figure
from .progress import Progress

TRANSFER_TASKS = ("mr", "cr", "subj", "mpqa", "sst2", "trec", "mrpc")

# Task -> (folder under SentEval's data/downstream, files). The first file of MR/CR/SUBJ/MPQA is
# label 1 (SUBJ: the objective sentences, as SentEval labels them).
TASK_FILES: dict[str, tuple[str, tuple[str, ...]]] = {
    "mr": ("MR", ("rt-polarity.pos", "rt-polarity.neg")),
    "cr": ("CR", ("custrev.pos", "custrev.neg")),
    "subj": ("SUBJ", ("subj.objective", "subj.subjective")),
    "mpqa": ("MPQA", ("mpqa.pos", "mpqa.neg")),
    "sst2": (os.path.join("SST", "binary"), ("sentiment-train", "sentiment-dev", "sentiment-test")),
    "trec": ("TREC", ("train_5500.label", "TREC_10.label")),
    "mrpc": ("MRPC", ("msr_paraphrase_train.txt", "msr_paraphrase_test.txt")),
}
TREC_CLASSES = {"ABBR": 0, "DESC": 1, "ENTY": 2, "HUM": 3, "LOC": 4, "NUM": 5}
L2_GRID = tuple(10.0 ** t for t in range(-5, -1))  # SentEval's grid for its PyTorch classifier
VALIDATION_SPLIT = 0.05  # the dev share of a final fit that has no dev set of its own
FOLD_SEED = 1111  # SentEval's InnerKFoldClassifier fixes both of its fold seeds to this


@dataclass(frozen=True)
class ClassifierConfig:
    """SentEval's ``params['classifier']`` for logistic regression (``nhid 0``) plus its ``kfold``."""

    optim: Literal["adam", "rmsprop"] = "adam"
    batch_size: int = 64
    tenacity: int = 5
    epoch_size: int = 4
    max_epoch: int = 200
    kfold: int = 10


# SimCSE's evaluation.py: "test" is the setting of its (and SBERT's) transfer tables, "fast" its dev mode.
PRESETS = {"test": ClassifierConfig(), "fast": ClassifierConfig("rmsprop", 128, 3, 2, 200, 5)}


# -- data ---------------------------------------------------------------------------------------------
def find_downstream(data_dir: str, tasks: Sequence[str] = TRANSFER_TASKS) -> str:
    """The folder that holds the task folders: ``data_dir`` itself (SentEval's ``data/downstream``),
    or its ``downstream/`` (``data_dir`` is SentEval's ``data``), or its ``data/downstream``."""
    data_dir = data_path(data_dir)
    candidates = [data_dir, os.path.join(data_dir, "downstream"), os.path.join(data_dir, "data", "downstream")]
    folders = [TASK_FILES[t][0] for t in tasks]
    for candidate in candidates:
        if any(os.path.isdir(os.path.join(candidate, f)) for f in folders):
            return candidate
    if not os.path.isdir(data_dir):
        raise DataError(f"{data_dir}: the SentEval data folder does not exist")
    raise DataError(f"{data_dir}: no SentEval transfer task folder ({', '.join(folders)}) here, nor under "
                    f"{os.path.join(data_dir, 'downstream')} or {os.path.join(data_dir, 'data', 'downstream')}")


def task_paths(root: str, task: str) -> list[str]:
    """The task's files under ``root``; a missing one is a ``DataError`` naming its path."""
    folder, files = TASK_FILES[task]
    paths = [os.path.join(root, folder, name) for name in files]
    for path in paths:
        if not os.path.isfile(path):
            raise DataError(f"{path}: missing (SentEval's {task.upper()} file; the layout is "
                            f"data/downstream/{folder}/{{{','.join(files)}}})")
    return paths


def _read_lines(path: str, encoding: str) -> list[str]:
    """The file's lines as SentEval reads them (``splitlines``), with decoding errors naming the line."""
    with open(path, "rb") as f:
        raw = f.read()
    try:
        return raw.decode(encoding).splitlines()
    except UnicodeDecodeError as err:
        line = raw[:err.start].count(b"\n") + 1
        raise DataError(f"{path}:{line}: not valid {encoding} ({err.reason})") from None


def _sentence(text: str) -> tuple[str, int]:
    """SentEval's ``text.split()`` then its batcher's ``' '.join``: (sentence, token count)."""
    tokens = text.split()
    return " ".join(tokens), len(tokens)


def _sorted_by_length(sentences: list[tuple[str, int]], labels: list[int]) -> tuple[list[str], np.ndarray]:
    """SentEval's stable sort by (token count, label), which fixes the order the folds are drawn over."""
    order = sorted(range(len(labels)), key=lambda i: (sentences[i][1], labels[i]))
    return [sentences[i][0] for i in order], np.asarray([labels[i] for i in order], dtype=np.int64)


def load_binary(pos_path: str, neg_path: str) -> tuple[list[str], np.ndarray]:
    """MR/CR/SUBJ/MPQA: one sentence per line, latin-1; the first file is label 1. Empty lines are
    kept as empty sentences, as SentEval keeps them."""
    pos = [_sentence(line) for line in _read_lines(pos_path, "latin-1")]
    neg = [_sentence(line) for line in _read_lines(neg_path, "latin-1")]
    for path, rows in ((pos_path, pos), (neg_path, neg)):
        if not rows:
            raise DataError(f"{path}: the file is empty")
    return _sorted_by_length(pos + neg, [1] * len(pos) + [0] * len(neg))


def load_sst(path: str) -> tuple[list[str], np.ndarray]:
    """SST binary: ``sentence<TAB>label`` with label 0 or 1, UTF-8."""
    sentences, labels = [], []
    for line_no, line in enumerate(_read_lines(path, "utf-8"), start=1):
        fields = line.strip().split("\t")
        if len(fields) != 2 or fields[1] not in ("0", "1"):
            raise DataError(f"{path}:{line_no}: expected 'sentence<TAB>label' with label 0 or 1, got {line[:80]!r}")
        sentences.append(_sentence(fields[0]))
        labels.append(int(fields[1]))
    if not labels:
        raise DataError(f"{path}: the file is empty")
    return _sorted_by_length(sentences, labels)


def load_trec(path: str) -> tuple[list[str], np.ndarray]:
    """TREC: ``COARSE:fine question``, latin-1 (the train file holds one non-UTF-8 byte)."""
    sentences, labels = [], []
    for line_no, line in enumerate(_read_lines(path, "latin-1"), start=1):
        target, sep, rest = line.strip().partition(":")
        fine_and_question = rest.split(" ", 1)
        if not sep or target not in TREC_CLASSES or len(fine_and_question) != 2:
            raise DataError(f"{path}:{line_no}: expected 'COARSE:fine question' with COARSE one of "
                            f"{', '.join(TREC_CLASSES)}, got {line[:80]!r}")
        sentences.append(_sentence(fine_and_question[1]))
        labels.append(TREC_CLASSES[target])
    if not labels:
        raise DataError(f"{path}: the file is empty")
    return _sorted_by_length(sentences, labels)


def load_mrpc(path: str) -> tuple[list[str], list[str], np.ndarray]:
    """MRPC: a header line, then ``label<TAB>id1<TAB>id2<TAB>s1<TAB>s2``; sorted as SentEval sorts it,
    by (tokens of s1, tokens of s2, label)."""
    rows = []
    for line_no, line in enumerate(_read_lines(path, "utf-8"), start=1):
        if line_no == 1:
            continue  # the header
        fields = line.strip().split("\t")
        if len(fields) < 5 or fields[0] not in ("0", "1"):
            raise DataError(f"{path}:{line_no}: expected 'label<TAB>id1<TAB>id2<TAB>sentence1<TAB>sentence2' "
                            f"with label 0 or 1, got {line[:80]!r}")
        rows.append((_sentence(fields[3]), _sentence(fields[4]), int(fields[0])))
    if not rows:
        raise DataError(f"{path}: no pairs after the header line")
    rows.sort(key=lambda r: (r[0][1], r[1][1], r[2]))
    return [r[0][0] for r in rows], [r[1][0] for r in rows], np.asarray([r[2] for r in rows], dtype=np.int64)


# -- folds --------------------------------------------------------------------------------------------
def stratified_folds(y: np.ndarray, k: int, seed: int) -> list[tuple[np.ndarray, np.ndarray]]:
    """``StratifiedKFold(n_splits=k, shuffle=True, random_state=seed).split(X, y)`` as scikit-learn
    (>= 0.22) draws it: each class's fold numbers, dealt round-robin over the sorted labels, shuffled by
    one ``RandomState(seed)``, classes taken in order of first appearance. (train, test) row indices."""
    y = np.asarray(y)
    _, first, inverse = np.unique(y, return_index=True, return_inverse=True)
    _, class_rank = np.unique(first, return_inverse=True)
    y_encoded = class_rank[inverse.reshape(-1)]
    counts = np.bincount(y_encoded)
    if k > len(y) or np.all(k > counts):
        raise ValueError(f"{k}-fold cross-validation needs at least {k} examples of some class; counts {counts.tolist()}")
    rng = np.random.RandomState(seed)
    y_order = np.sort(y_encoded)
    allocation = np.asarray([np.bincount(y_order[i::k], minlength=len(counts)) for i in range(k)])  # (k, classes)
    test_fold = np.empty(len(y), dtype=np.int64)
    for c in range(len(counts)):
        folds_of_class = np.arange(k).repeat(allocation[:, c])
        rng.shuffle(folds_of_class)
        test_fold[y_encoded == c] = folds_of_class
    rows = np.arange(len(y))
    return [(rows[test_fold != i], rows[test_fold == i]) for i in range(k)]


# -- the classifier: many SentEval fits as one batched logistic regression ------------------------------
@dataclass
class FitSpec:
    """One SentEval ``MLP.fit``: its training rows in SentEval's order, its dev rows, its L2 value and
    its ``np.random`` stream (already past the validation-split draw where there was one)."""

    train: np.ndarray
    dev: np.ndarray
    l2: float
    rng: np.random.RandomState


def with_dev(train: np.ndarray, dev: np.ndarray, l2: float, seed: int) -> FitSpec:
    """``fit(X, y, validation_data=(devX, devy))``."""
    return FitSpec(np.asarray(train), np.asarray(dev), l2, np.random.RandomState(seed))


def with_validation_split(rows: np.ndarray, l2: float, seed: int, share: float = VALIDATION_SPLIT) -> FitSpec:
    """``fit(X, y, validation_split=share)``: a random ``share`` of the rows is the dev set."""
    rng = np.random.RandomState(seed)
    permutation = rng.permutation(len(rows))
    cut = int(share * len(rows))
    return FitSpec(np.asarray(rows)[permutation[cut:]], np.asarray(rows)[permutation[:cut]], l2, rng)


@dataclass
class Fitted:
    weight: torch.Tensor  # (K, D, C): each fit's best round
    bias: torch.Tensor  # (K, C)
    dev_accuracy: list[float]  # SentEval's bestaccuracy, a fraction
    epochs: list[int]  # epochs trained before stopping

    def predict(self, features: torch.Tensor, i: int) -> torch.Tensor:
        """Fit ``i``'s classes for ``features`` (N, D)."""
        return (features @ self.weight[i] + self.bias[i]).argmax(-1)


def senteval_init(dim: int, nclasses: int, seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    """The initial weights of SentEval's ``nn.Linear(dim, nclasses)`` built after ``torch.manual_seed(seed)``,
    as (D, C) and (C,); the global torch stream is left as it was."""
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        linear = torch.nn.Linear(dim, nclasses)
    return linear.weight.detach().t().contiguous(), linear.bias.detach().clone()


class _BatchedOptimizer:
    """torch's Adam / RMSprop (defaults, weight decay added to the gradient) over K stacked models,
    each with its own step count and weight decay.

    Adam runs torch's own fused kernel (``torch._fused_adam_``) over the models as a list of views, one call per
    weight decay value: the per-model step counts and bias corrections are the kernel's, in one pass over the
    memory instead of a dozen small operations a step."""

    def __init__(self, kind: str, params: list[torch.Tensor], l2: torch.Tensor) -> None:
        self.kind, self.l2 = kind, l2  # l2: (K,)
        self.first = [torch.zeros_like(p) for p in params]  # Adam's exp_avg
        self.second = [torch.zeros_like(p) for p in params]  # Adam's exp_avg_sq, RMSprop's square_avg
        self.steps = torch.zeros(len(l2), dtype=torch.float32)  # each model's step count

    def keep(self, rows: torch.Tensor) -> None:
        """Drop the models that stopped: ``rows`` are those kept."""
        self.l2, self.steps, self._key = self.l2[rows], self.steps[rows], None
        self.first = [s[rows] for s in self.first]
        self.second = [s[rows] for s in self.second]

    def step(self, params: list[torch.Tensor], grads: list[torch.Tensor], on: torch.Tensor | None) -> None:
        """One optimiser step for the models in ``on`` (a (K,) bool; None: all)."""
        rows = None if on is None else on.nonzero().squeeze(1)
        if self.kind == "adam":
            self._adam(params, grads, rows)
        else:
            self._rmsprop(params, grads, torch.arange(len(self.l2)) if rows is None else rows)

    def _adam(self, params, grads, rows) -> None:
        # lr 1e-3, betas (0.9, 0.999), eps 1e-8. The weight decay is added to the gradient first, as torch.optim.Adam
        # adds it (grad + l2 * param), for every model at once; as Adam does, the step counts are incremented
        # before the kernel, which reads them for the bias corrections.
        key = (id(params[0]), None if rows is None else tuple(rows.tolist()))
        if getattr(self, "_key", None) != key:  # the lists of views, rebuilt when the models stepped change
            self._key = key
            every = list(range(len(self.l2))) if rows is None else rows.tolist()
            self._views = ([p[i] for p in params for i in every], [m[i] for m in self.first for i in every],
                           [v[i] for v in self.second for i in every], [self.steps[i:i + 1] for _ in params for i in every],
                           every)
        p_views, m_views, v_views, step_views, every = self._views
        if rows is None:
            self.steps += 1
        else:
            self.steps[rows] += 1
        decay = self.l2.to(torch.float32)
        g_views = []
        for p, g in zip(params, grads):
            shape = (-1,) + (1,) * (p.dim() - 1)
            if rows is None:
                g.addcmul_(p, decay.view(shape))
                g_views += [g[i] for i in every]
            else:
                g_views += [g[i].addcmul_(p[i], decay[i]) for i in every]
        torch._fused_adam_(p_views, g_views, m_views, v_views, [], step_views, amsgrad=False, lr=1e-3, beta1=0.9,
                           beta2=0.999, weight_decay=0.0, eps=1e-8, maximize=False)

    def _rmsprop(self, params, grads, rows) -> None:  # lr 1e-2, alpha 0.99, eps 1e-8
        self.steps[rows] += 1
        for p, g, v in zip(params, grads, self.second):
            shape = (-1,) + (1,) * (p.dim() - 1)
            sub, g, sq = p[rows], g[rows], v[rows]
            g = g.add(sub * self.l2[rows].view(shape).to(p.dtype))
            sq.mul_(0.99).addcmul_(g, g, value=1 - 0.99)
            sub.sub_(g * 1e-2 / sq.sqrt().add_(1e-8))
            p[rows], v[rows] = sub, sq


def _padded(rows: list[np.ndarray]) -> tuple[torch.Tensor, torch.Tensor]:
    """Ragged index lists as a (K, L) index tensor (padding 0) and its (K, L) validity mask."""
    width = max(len(r) for r in rows)
    index = np.zeros((len(rows), width), dtype=np.int64)
    mask = np.zeros((len(rows), width), dtype=bool)
    for i, r in enumerate(rows):
        index[i, :len(r)], mask[i, :len(r)] = r, True
    return torch.from_numpy(index), torch.from_numpy(mask)


def fit_logistic(features: torch.Tensor, labels: torch.Tensor, specs: Sequence[FitSpec], nclasses: int,
                 config: ClassifierConfig = ClassifierConfig(), seed: int = 1111) -> Fitted:
    """Run SentEval's ``MLP(nhid=0).fit`` for every spec at once and keep each fit's best round.

    features: (N, D) float32, every row any spec names; labels: (N,) int64.
    """
    labels = labels.long()
    k, dim = len(specs), features.shape[1]
    # The bias is a weight on a constant feature: one parameter tensor, one matmul each way. Parameters are kept
    # as (fits, classes, features): with a handful of classes, (C, D) @ (D, B) and (C, B) @ (B, D) are the
    # shapes a batched matmul runs fast; (B, D) @ (D, C) runs several times slower on a CPU.
    features = torch.cat([features.float(), torch.ones(len(features), 1)], dim=1).contiguous()  # (N, D+1)
    w0, b0 = senteval_init(dim, nclasses, seed)
    params = torch.cat([w0, b0.unsqueeze(0)]).t().expand(k, nclasses, dim + 1).contiguous()  # (A, C, D+1), A fits training
    best_params = params.clone()  # (K, C, D+1)
    optimizer = _BatchedOptimizer(config.optim, [params], torch.tensor([s.l2 for s in specs], dtype=torch.float64))
    sizes = np.array([len(s.train) for s in specs])
    if sizes.min() == 0 or min(len(s.dev) for s in specs) == 0:
        raise ValueError("every fit needs training and dev rows")

    # Dev scoring: the union of all dev rows is scored once per round by every fit still training.
    dev_rows, dev_pos = np.unique(np.concatenate([s.dev for s in specs]), return_inverse=True)
    dev_pos_split = np.split(dev_pos, np.cumsum([len(s.dev) for s in specs])[:-1])
    dev_index, dev_mask = _padded(dev_pos_split)  # (K, Ldev) positions into dev_rows
    dev_x, dev_y = features[dev_rows], labels[dev_rows]  # (U, D+1), (U,)
    dev_len = np.array([len(s.dev) for s in specs])

    best = np.full(k, -1)  # correct dev answers of the best round
    fails = np.zeros(k, dtype=np.int64)  # SentEval's early_stop_count: never reset
    epochs = np.zeros(k, dtype=np.int64)
    alive = np.arange(k)  # which spec each of the A rows is
    bsz, nepoch = config.batch_size, 0
    while alive.size and nepoch <= config.max_epoch:
        for _ in range(config.epoch_size):
            orders = [specs[i].train[specs[i].rng.permutation(sizes[i])] for i in alive]
            index, _ = _padded(orders)  # (A, L)
            steps = math.ceil(index.shape[1] / bsz)
            counts = np.stack([np.clip(sizes[alive] - s * bsz, 0, bsz) for s in range(steps)])  # (steps, A)
            # each row's share of its batch's mean loss (0 for padding): (A, 1, L)
            position = np.arange(index.shape[1])
            share = np.where(position[None, :] < sizes[alive][:, None],
                             1.0 / np.maximum(counts[position // bsz].T, 1), 0.0)
            share = torch.from_numpy(share.astype(np.float32)).unsqueeze(1)
            targets = labels[index].unsqueeze(1)  # (A, 1, L)
            minus_one = torch.full((len(alive), 1, min(bsz, index.shape[1])), -1.0)
            for s in range(steps):
                cols = slice(s * bsz, (s + 1) * bsz)
                rows = index[:, cols]
                x = features.index_select(0, rows.reshape(-1)).view(*rows.shape, dim + 1)  # (A, B, D+1)
                grad = torch.softmax(torch.bmm(params, x.transpose(1, 2)), dim=1)  # (A, C, B)
                grad.scatter_add_(1, targets[:, :, cols], minus_one[:, :, :rows.shape[1]])  # softmax - onehot
                grad *= share[:, :, cols]
                on = None if counts[s].min() > 0 else torch.from_numpy(counts[s] > 0)
                optimizer.step([params], [torch.bmm(grad, x)], on)  # (A, C, D+1)
        nepoch += config.epoch_size
        epochs[alive] = nepoch

        # (U, A*C) scores of every dev row under every fit still training
        scores = (dev_x @ params.permute(2, 0, 1).reshape(dim + 1, -1)).view(len(dev_rows), len(alive), nclasses)
        right = (scores.argmax(-1) == dev_y.unsqueeze(1)).t()  # (A, U)
        correct = (right.gather(1, dev_index[alive]) & dev_mask[alive]).sum(1).numpy()  # (A,)

        better = correct > best[alive]
        if better.any():
            best_params[torch.from_numpy(alive[better])] = params[torch.from_numpy(better)]
            best[alive[better]] = correct[better]
        worse = alive[~better]
        stop = np.zeros(len(alive), dtype=bool)
        stop[~better] = fails[worse] >= config.tenacity
        fails[worse] += 1
        if stop.any():
            keep = torch.from_numpy(~stop)
            params = params[keep]
            optimizer.keep(keep.nonzero().squeeze(1))
            alive = alive[~stop]
    return Fitted(best_params[:, :, :dim].transpose(1, 2).contiguous(), best_params[:, :, dim].contiguous(),
                  (best / dev_len).tolist(),
                  epochs.tolist())


# -- the three protocols --------------------------------------------------------------------------------
def _accuracy(pred: torch.Tensor, gold: np.ndarray) -> float:
    return float((pred.numpy() == gold).sum()) / len(gold)


def inner_kfold(features: torch.Tensor, y: np.ndarray, nclasses: int, config: ClassifierConfig,
                seed: int) -> dict[str, object]:
    """SentEval's ``InnerKFoldClassifier`` (MR, CR, SUBJ, MPQA)."""
    labels = torch.from_numpy(y)
    outer = stratified_folds(y, config.kfold, FOLD_SEED)
    specs = []
    for train, _ in outer:
        inner = stratified_folds(y[train], config.kfold, FOLD_SEED)
        specs += [with_dev(train[a], train[b], l2, seed) for l2 in L2_GRID for a, b in inner]
    search = fit_logistic(features, labels, specs, nclasses, config, seed)
    per_fold = len(L2_GRID) * config.kfold
    dev_results, chosen = [], []
    for o in range(len(outer)):
        accs = np.asarray(search.dev_accuracy[o * per_fold:(o + 1) * per_fold]).reshape(len(L2_GRID), config.kfold)
        scores = [round(100 * np.mean(a), 2) for a in accs]
        chosen.append(L2_GRID[int(np.argmax(scores))])
        dev_results.append(np.max(scores))
    final = fit_logistic(features, labels, [with_validation_split(train, l2, seed) for (train, _), l2 in zip(outer, chosen)],
                         nclasses, config, seed)
    test_results = [round(100 * _accuracy(final.predict(features[test], o), y[test]), 2)
                    for o, (_, test) in enumerate(outer)]
    return {"devacc": float(round(np.mean(dev_results), 2)), "acc": float(round(np.mean(test_results), 2)),
            "l2": chosen, "fits": len(specs) + len(outer)}


def kfold(train_x: torch.Tensor, train_y: np.ndarray, test_x: torch.Tensor, test_y: np.ndarray, nclasses: int,
          config: ClassifierConfig, seed: int) -> tuple[dict[str, object], np.ndarray]:
    """SentEval's ``KFoldClassifier`` (TREC, MRPC): the results and the test predictions."""
    labels = torch.from_numpy(train_y)
    folds = stratified_folds(train_y, config.kfold, seed)
    specs = [with_dev(a, b, l2, seed) for l2 in L2_GRID for a, b in folds]
    search = fit_logistic(train_x, labels, specs, nclasses, config, seed)
    accs = np.asarray(search.dev_accuracy).reshape(len(L2_GRID), config.kfold)
    scores = [round(100 * np.mean(a), 2) for a in accs]
    l2 = L2_GRID[int(np.argmax(scores))]
    final = fit_logistic(train_x, labels, [with_validation_split(np.arange(len(train_y)), l2, seed)], nclasses,
                         config, seed)
    pred = final.predict(test_x, 0)
    return ({"devacc": float(np.max(scores)), "acc": round(100 * _accuracy(pred, test_y), 2), "l2": l2,
             "fits": len(specs) + 1}, pred.numpy())


def split_classifier(x: dict[str, torch.Tensor], y: dict[str, np.ndarray], nclasses: int, config: ClassifierConfig,
                     seed: int) -> dict[str, object]:
    """SentEval's ``SplitClassifier`` (SST2): splits ``train``, ``valid``, ``test``."""
    n_train, n_valid = len(y["train"]), len(y["valid"])
    features = torch.cat([x["train"], x["valid"]])
    labels = torch.from_numpy(np.concatenate([y["train"], y["valid"]]))
    valid_rows = np.arange(n_train, n_train + n_valid)
    search = fit_logistic(features, labels, [with_dev(np.arange(n_train), valid_rows, l2, seed) for l2 in L2_GRID],
                          nclasses, config, seed)
    scores = [round(100 * a, 2) for a in search.dev_accuracy]
    best = int(np.argmax(scores))
    return {"devacc": float(np.max(scores)), "acc": round(100 * _accuracy(search.predict(x["test"], best), y["test"]), 2),
            "l2": L2_GRID[best], "fits": len(L2_GRID)}


def mrpc_features(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """SentEval's MRPC pair features ``[|u - v|, u * v]``: (N, 2H)."""
    return torch.cat([(a - b).abs(), a * b], dim=1)


def f1_x100(pred: np.ndarray, gold: np.ndarray) -> float:
    """F1 of the positive class x 100, two decimals (``sklearn.metrics.f1_score`` on binary labels)."""
    tp = int(((pred == 1) & (gold == 1)).sum())
    fp, fn = int(((pred == 1) & (gold == 0)).sum()), int(((pred == 0) & (gold == 1)).sum())
    return round(100 * (2 * tp / (2 * tp + fp + fn) if tp else 0.0), 2)


# -- the front door -------------------------------------------------------------------------------------
def _embed(encode: Callable[[list[str]], torch.Tensor], *groups: list[str]) -> list[torch.Tensor]:
    """Embed each group of sentences with one ``encode`` call over the distinct sentences of all groups."""
    distinct = list(dict.fromkeys(s for g in groups for s in g))
    emb = encode(distinct).detach().float().cpu()  # (U, H)
    if emb.shape[0] != len(distinct):
        raise ValueError(f"encode returned {emb.shape[0]} embeddings for {len(distinct)} sentences")
    where = {s: i for i, s in enumerate(distinct)}
    return [emb[torch.tensor([where[s] for s in g], dtype=torch.long)] for g in groups]


def run_task(task: str, root: str, encode: Callable[[list[str]], torch.Tensor], config: ClassifierConfig,
             seed: int) -> dict[str, object]:
    """One task: its SentEval result dict (``devacc``, ``acc``, ``ndev``, ``ntest``, MRPC's ``f1``...)."""
    paths = task_paths(root, task)
    if task in ("mr", "cr", "subj", "mpqa"):
        sentences, y = load_binary(*paths)
        (x,) = _embed(encode, sentences)
        return {**inner_kfold(x, y, 2, config, seed), "ndev": len(y), "ntest": len(y)}
    if task == "sst2":
        splits = dict(zip(("train", "valid", "test"), (load_sst(p) for p in paths)))
        xs = _embed(encode, *(s for s, _ in splits.values()))
        result = split_classifier(dict(zip(splits, xs)), {k: v[1] for k, v in splits.items()}, 2, config, seed)
        return {**result, "ndev": len(splits["valid"][1]), "ntest": len(splits["test"][1])}
    if task == "trec":
        (train_s, train_y), (test_s, test_y) = load_trec(paths[0]), load_trec(paths[1])
        train_x, test_x = _embed(encode, train_s, test_s)
        result, _ = kfold(train_x, train_y, test_x, test_y, len(TREC_CLASSES), config, seed)
        return {**result, "ndev": len(train_y), "ntest": len(test_y)}
    if task == "mrpc":
        (tr_a, tr_b, train_y), (te_a, te_b, test_y) = load_mrpc(paths[0]), load_mrpc(paths[1])
        ea, eb, fa, fb = _embed(encode, tr_a, tr_b, te_a, te_b)
        result, pred = kfold(mrpc_features(ea, eb), train_y, mrpc_features(fa, fb), test_y, 2, config, seed)
        return {**result, "f1": f1_x100(pred, test_y), "ndev": len(train_y), "ntest": len(test_y)}
    raise ValueError(f"unknown transfer task {task!r}; choose from {', '.join(TRANSFER_TASKS)}")


def work(root: str, task: str, config: ClassifierConfig) -> float:
    """A task's share of the time, for the time left: its rows times the fits each row goes through (the
    nested cross-validation of MR, CR, SUBJ and MPQA fits every row about a hundred times more often)."""
    rows = sum(1 for p in task_paths(root, task) for _ in open(p, "rb"))
    folds = config.kfold
    fits = folds * (len(L2_GRID) * folds + 1) if task in ("mr", "cr", "subj", "mpqa") else \
        len(L2_GRID) if task == "sst2" else len(L2_GRID) * folds + 1
    return float(rows * fits)


def evaluate_transfer(
    encode: Callable[[list[str]], torch.Tensor],
    data_dir: str,
    tasks: Sequence[str] = TRANSFER_TASKS,
    seed: int = 1111,
    progress: IO[str] | None = None,
    classifier: ClassifierConfig | str = "test",
) -> dict[str, object]:
    """Run SentEval's transfer tasks with an ``encode(sentences) -> (N, H)`` function.

    data_dir: SentEval's ``data/downstream`` folder, or ``data/``, or the folder holding ``data/``.
    classifier: ``"test"`` (SimCSE's and SBERT's tables), ``"fast"`` (SimCSE's dev mode) or a config.
    progress: a stream for a line (or, on a terminal, a bar) per task with the time left; None: quiet.

    Returns ``{task: test accuracy x 100, ..., "mrpc_f1": ..., "avg": mean of the seven (only when all
    seven ran), "transfer_details": {task: {devacc, ndev, ntest, l2, fits, seconds}}}``.
    """
    unknown = [t for t in tasks if t not in TRANSFER_TASKS]
    if unknown:
        raise ValueError(f"unknown transfer task(s) {unknown}; choose from {', '.join(TRANSFER_TASKS)}")
    config = PRESETS[classifier] if isinstance(classifier, str) else classifier
    root = find_downstream(data_dir, tasks)
    for task in tasks:  # every file is there before any work
        task_paths(root, task)
    results: dict[str, object] = {}
    details: dict[str, dict[str, object]] = {}
    report = Progress("transfer", {t: work(root, t, config) for t in tasks}, stream=progress) \
        if progress is not None else None
    for task in tasks:
        start = time.perf_counter()
        result = run_task(task, root, encode, config, seed)
        result["seconds"] = round(time.perf_counter() - start, 1)
        results[task] = result["acc"]
        if "f1" in result:
            results["mrpc_f1"] = result["f1"]
        details[task] = {k: v for k, v in result.items() if k not in ("acc", "f1")}
        if report is not None:
            report.done(task, f"test acc {result['acc']:.2f}, dev acc {result['devacc']:.2f} ({result['ntest']} test, "
                              f"L2 {result['l2']}, {result['fits']} fits, {result['seconds']} s)")
    if report is not None:
        report.close()
    if all(t in tasks for t in TRANSFER_TASKS):
        results["avg"] = round(float(np.mean([results[t] for t in TRANSFER_TASKS])), 2)
    results["transfer_details"] = details
    return results


def format_transfer_table(rows: dict[str, dict[str, object]], tasks: Sequence[str] = TRANSFER_TASKS) -> str:
    """A Markdown table: one row per model, test accuracy x 100 with two decimals (MRPC: accuracy/F1)."""
    names = {"mr": "MR", "cr": "CR", "subj": "SUBJ", "mpqa": "MPQA", "sst2": "SST2", "trec": "TREC", "mrpc": "MRPC"}
    with_avg = any("avg" in res for res in rows.values())
    header = "| model | " + " | ".join(names[t] for t in tasks) + (" | avg |" if with_avg else " |")
    lines = [header, "|" + "---|" * (len(tasks) + 1 + with_avg)]
    for name, res in rows.items():
        cells = []
        for t in tasks:
            cell = figure(res[t]) if t in res else "-"
            if t == "mrpc" and "mrpc_f1" in res:
                cell += f"/{figure(res['mrpc_f1'])}"
            cells.append(cell)
        if with_avg:
            cells.append(figure(res["avg"]) if "avg" in res else "-")
        lines.append(f"| {name} | " + " | ".join(cells) + " |")
    return "\n".join(lines)
