"""SentEval's transfer protocol (harness/transfer.py) on a small fixture in SentEval's own layout.

The batched classifier is checked against a naive reference written here the way SentEval's
``PyTorchClassifier.fit`` reads (one ``nn.Linear``, ``torch.optim.Adam``, a Python loop per batch),
the folds against scikit-learn's ``StratifiedKFold``, and the search against that reference run fold
by fold.
"""
from __future__ import annotations

import copy
import zlib
from pathlib import Path

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from datamodules.io import DataError
from harness import transfer as tr

pytestmark = pytest.mark.usefixtures("one_torch_thread")

DIM = 32
POS_WORDS = ["good", "great"]
NEG_WORDS = ["bad", "awful"]
FILLER = ["the", "film", "plot", "cast", "story", "movie", "scene", "it", "was", "a"]


def bow_encode(sentences: list[str]) -> torch.Tensor:
    """A cheap deterministic encoder: the sum of a fixed random vector per word (seeded by its crc32)."""
    out = torch.zeros(len(sentences), DIM)
    for i, s in enumerate(sentences):
        for word in s.split():
            g = torch.Generator().manual_seed(zlib.crc32(word.encode("utf-8")))
            out[i] += torch.randn(DIM, generator=g)
    return out


def _lines(rng: np.random.RandomState, words: list[str], n: int, noise: float = 0.1) -> list[str]:
    """n sentences of 2-7 filler words and one class word (sometimes the other class's, for noise)."""
    other = NEG_WORDS if words is POS_WORDS else POS_WORDS
    out = []
    for _ in range(n):
        k = rng.randint(2, 8)
        tokens = list(rng.choice(FILLER, k))
        tokens.insert(rng.randint(0, k + 1), rng.choice(other if rng.rand() < noise else words))
        out.append(" ".join(tokens))
    return out


@pytest.fixture(scope="module")
def senteval_data(tmp_path_factory) -> Path:
    """SentEval's ``data/downstream`` layout with a few dozen lines per task; returns the ``data`` folder."""
    return write_transfer_tasks(tmp_path_factory.mktemp("senteval") / "data" / "downstream").parent


def write_transfer_tasks(root: Path) -> Path:
    """The seven transfer tasks, a few dozen lines each, in SentEval's layout under ``root`` (a
    ``downstream`` folder, which may already hold STS/ and SICK/); returns ``root``."""
    rng = np.random.RandomState(7)
    for folder, (pos, neg), (n_pos, n_neg) in [
        ("MR", ("rt-polarity.pos", "rt-polarity.neg"), (30, 28)),
        ("CR", ("custrev.pos", "custrev.neg"), (32, 20)),
        ("SUBJ", ("subj.objective", "subj.subjective"), (25, 25)),
        ("MPQA", ("mpqa.pos", "mpqa.neg"), (20, 34)),
    ]:
        (root / folder).mkdir(parents=True)
        pos_lines, neg_lines = _lines(rng, POS_WORDS, n_pos), _lines(rng, NEG_WORDS, n_neg)
        if folder == "CR":
            pos_lines[3] = ""  # an empty line, kept as an empty sentence as SentEval keeps it
        (root / folder / pos).write_text("\n".join(pos_lines) + "\n", encoding="latin-1")
        (root / folder / neg).write_text("\n".join(neg_lines) + "\n", encoding="latin-1")
    sst = root / "SST" / "binary"
    sst.mkdir(parents=True)
    for split, n in (("train", 60), ("dev", 20), ("test", 24)):
        rows = [f"{s} \t1" for s in _lines(rng, POS_WORDS, n // 2)] + [f"{s} \t0" for s in _lines(rng, NEG_WORDS, n // 2)]
        rng.shuffle(rows)
        (sst / f"sentiment-{split}").write_text("\n".join(rows) + "\n", encoding="utf-8")
    (root / "TREC").mkdir()
    classes = list(tr.TREC_CLASSES)
    for name, n in (("train_5500.label", 72), ("TREC_10.label", 30)):
        lines = []
        for i in range(n):
            c = classes[i % 6]
            lines.append(f"{c}:other what {c.lower()} {c.lower()}x is {' '.join(rng.choice(FILLER, 3))} ?")
        if name == "train_5500.label":
            lines[5] = "LOC:city What is the sister\xf0city of Aspen ?"  # a latin-1 byte, as in the real file
        (root / "TREC" / name).write_bytes(("\n".join(lines) + "\n").encode("latin-1"))
    (root / "MRPC").mkdir()
    for name, n in (("msr_paraphrase_train.txt", 50), ("msr_paraphrase_test.txt", 24)):
        lines = ["\ufeffQuality\t#1 ID\t#2 ID\t#1 String\t#2 String"]
        for i in range(n):
            a = _lines(rng, POS_WORDS, 1, noise=0)[0]
            same = i % 3 != 0
            b = a + " indeed" if same else _lines(rng, NEG_WORDS, 1, noise=0)[0]
            lines.append(f"{int(same)}\t{i}\t{1000 + i}\t{a}\t{b}")
        (root / "MRPC" / name).write_text("\n".join(lines) + "\n", encoding="utf-8")
    return root


# -- a naive reference, one fit at a time, written as SentEval's fit reads --------------------------------
def naive_fit(x, y, spec_rows, dev_rows, l2, seed, nclasses, config, validation_split=False):
    """(best dev accuracy, epochs, best weight (D, C)) of one SentEval fit."""
    rng = np.random.RandomState(seed)
    if validation_split:
        perm = rng.permutation(len(spec_rows))
        cut = int(0.05 * len(spec_rows))
        spec_rows, dev_rows = spec_rows[perm[cut:]], spec_rows[perm[:cut]]
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        model = torch.nn.Linear(x.shape[1], nclasses)
    optim = torch.optim.Adam if config.optim == "adam" else torch.optim.RMSprop
    opt = optim(model.parameters(), weight_decay=l2)
    best, fails, nepoch, best_model = -1.0, 0, 0, None
    while nepoch <= config.max_epoch:
        for _ in range(config.epoch_size):
            perm = rng.permutation(len(spec_rows))
            for i in range(0, len(spec_rows), config.batch_size):
                rows = spec_rows[perm[i:i + config.batch_size]]
                loss = F.cross_entropy(model(x[rows]), y[rows])
                opt.zero_grad()
                loss.backward()
                opt.step()
        nepoch += config.epoch_size
        with torch.no_grad():
            acc = int((model(x[dev_rows]).argmax(1) == y[dev_rows]).sum()) / len(dev_rows)
        if acc > best:
            best, best_model = acc, copy.deepcopy(model)
        else:
            if fails >= config.tenacity:
                break
            fails += 1
    return best, nepoch, best_model.weight.detach().t(), best_model


def _toy(n=90, dim=6, nclasses=3, seed=0):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(n, dim, generator=g)
    y = (x @ torch.randn(dim, nclasses, generator=g) + 0.8 * torch.randn(n, nclasses, generator=g)).argmax(1)
    return x, y


@pytest.mark.parametrize("optim", ["adam", "rmsprop"])
def test_batched_fits_match_one_at_a_time(optim):
    """Every fit of a batch (different sizes, dev sets, L2 values, a validation split) ends where the
    naive loop ends: the same best dev accuracy, the same stopping epoch, the same weights."""
    x, y = _toy()
    config = tr.ClassifierConfig(optim=optim, batch_size=16, tenacity=2, epoch_size=2, max_epoch=30)
    rows = np.arange(90)
    cases = [(rows[:60], rows[60:], 1e-5, False), (rows[10:80], rows[:10], 1e-2, False),
             (rows[5:70], None, 1e-3, True), (rows[::2], rows[1::2], 0.3, False)]
    specs = [tr.with_validation_split(a, l2, 1111) if vs else tr.with_dev(a, b, l2, 1111) for a, b, l2, vs in cases]
    fitted = tr.fit_logistic(x, y, specs, 3, config, seed=1111)
    for i, (a, b, l2, vs) in enumerate(cases):
        acc, epochs, weight, _ = naive_fit(x, y, a, b, l2, 1111, 3, config, validation_split=vs)
        assert fitted.dev_accuracy[i] == acc
        assert fitted.epochs[i] == epochs
        torch.testing.assert_close(fitted.weight[i], weight, atol=2e-5, rtol=1e-4)
    assert len(set(fitted.epochs)) > 1, "the fits should stop at different epochs for this test to mean much"


def test_stratified_folds_match_scikit_learn():
    from sklearn.model_selection import StratifiedKFold

    rng = np.random.RandomState(3)
    for y, k, seed in [(np.array([1] * 37 + [0] * 21), 10, 1111),
                       (rng.randint(0, 6, 150), 10, 5), (np.array([2, 0, 1] * 11 + [0] * 4), 3, 1111)]:
        ours = tr.stratified_folds(y, k, seed)
        theirs = list(StratifiedKFold(n_splits=k, shuffle=True, random_state=seed).split(np.zeros(len(y)), y))
        assert len(ours) == len(theirs)
        for (a, b), (c, d) in zip(ours, theirs):
            np.testing.assert_array_equal(a, c)
            np.testing.assert_array_equal(b, d)


def test_inner_search_picks_what_the_naive_search_picks():
    """InnerKFold: the L2 value per outer fold, the dev and the test figures equal a fold-by-fold run
    of the naive reference (SentEval's loops, written out)."""
    x, y_t = _toy(n=60, dim=5, nclasses=2, seed=4)
    y = y_t.numpy()
    config = tr.ClassifierConfig(batch_size=16, tenacity=1, epoch_size=1, max_epoch=12, kfold=3)
    ours = tr.inner_kfold(x, y, 2, config, seed=1111)

    dev_results, test_results, chosen = [], [], []
    for train, test in tr.stratified_folds(y, 3, 1111):
        scores = []
        for l2 in tr.L2_GRID:
            accs = [naive_fit(x, y_t, train[a], train[b], l2, 1111, 2, config)[0]
                    for a, b in tr.stratified_folds(y[train], 3, 1111)]
            scores.append(round(100 * np.mean(accs), 2))
        chosen.append(tr.L2_GRID[int(np.argmax(scores))])
        dev_results.append(max(scores))
        model = naive_fit(x, y_t, train, None, chosen[-1], 1111, 2, config, validation_split=True)[3]
        with torch.no_grad():
            test_results.append(round(100 * int((model(x[test]).argmax(1) == y_t[test]).sum()) / len(test), 2))
    assert ours["l2"] == chosen
    assert ours["devacc"] == round(np.mean(dev_results), 2)
    assert ours["acc"] == round(np.mean(test_results), 2)


def test_mrpc_features_and_f1():
    u, v = torch.tensor([[1.0, -2.0], [0.5, 0.0]]), torch.tensor([[3.0, 1.0], [0.5, 4.0]])
    assert tr.mrpc_features(u, v).tolist() == [[2.0, 3.0, 3.0, -2.0], [0.0, 4.0, 0.25, 0.0]]
    # tp 2, fp 1, fn 1: F1 = 4 / 6
    assert tr.f1_x100(np.array([1, 1, 1, 0, 0]), np.array([1, 1, 0, 1, 0])) == 66.67


def test_loaders_read_as_senteval_does(senteval_data):
    root = tr.find_downstream(str(senteval_data))
    sentences, labels = tr.load_binary(*tr.task_paths(root, "cr"))
    assert len(sentences) == 52 and labels.sum() == 32
    assert sentences[0] == ""  # the empty line, first after sorting by (token count, label)
    lengths = [len(s.split()) for s in sentences]
    assert [(n, int(lab)) for n, lab in zip(lengths, labels)] == sorted(zip(lengths, labels.tolist()))
    trec, trec_y = tr.load_trec(tr.task_paths(root, "trec")[0])
    assert len(trec) == 72 and np.bincount(trec_y).tolist() == [12, 12, 12, 12, 13, 11]  # line 6 made LOC
    assert "What is the sister\u00f0city of Aspen ?" in trec  # the latin-1 byte decoded as SentEval decodes it
    a, b, y = tr.load_mrpc(tr.task_paths(root, "mrpc")[0])
    assert len(a) == len(b) == len(y) == 50 and y.sum() == 33
    x, sst_y = tr.load_sst(tr.task_paths(root, "sst2")[1])
    assert len(x) == 20 and sst_y.sum() == 10


def test_data_dir_forms_and_missing_files(senteval_data, tmp_path):
    downstream = str(senteval_data / "downstream")
    for form in (downstream, str(senteval_data), str(senteval_data.parent)):
        assert Path(tr.find_downstream(form)) == Path(downstream)
    with pytest.raises(DataError, match="no SentEval transfer task folder"):
        tr.find_downstream(str(tmp_path))
    (tmp_path / "MR").mkdir()
    (tmp_path / "MR" / "rt-polarity.pos").write_text("good\n")
    with pytest.raises(DataError, match=r"MR/rt-polarity\.neg: missing"):
        tr.evaluate_transfer(bow_encode, str(tmp_path), tasks=["mr"], progress=None)


@pytest.mark.parametrize("task, name, text, where", [
    ("trec", "train_5500.label", "HUM:desc Who was Galileo ?\nWho is this ?\n", ":2:"),
    ("trec", "TREC_10.label", "COLOR:x What colour ?\n", ":1:"),
    ("sst2", "sentiment-dev", "fine film \t1\nno label here\n", ":2:"),
    ("mrpc", "msr_paraphrase_test.txt", "Quality\t#1 ID\t#2 ID\t#1 String\t#2 String\n1\t2\tonly three\n", ":2:"),
])
def test_malformed_lines_name_file_and_line(senteval_data, tmp_path, task, name, text, where):
    import shutil

    data = tmp_path / "downstream"
    shutil.copytree(senteval_data / "downstream", data)
    folder = data / tr.TASK_FILES[task][0]
    (folder / name).write_text(text, encoding="utf-8")
    with pytest.raises(DataError, match=f"{name}{where}"):
        tr.evaluate_transfer(bow_encode, str(data), tasks=[task], progress=None)


def test_evaluate_transfer_on_the_fixture(senteval_data):
    import io

    stream = io.StringIO()
    # SentEval's setting but batches of 4: with batches of 64 a task of a few dozen lines gets one step an
    # epoch, too few for Adam at lr 1e-3 to move the random initial weights (real tasks get 50 to 1,000)
    small_batches = tr.ClassifierConfig(batch_size=4)
    res = tr.evaluate_transfer(bow_encode, str(senteval_data), progress=stream, classifier=small_batches)
    lines = stream.getvalue().splitlines()  # a line per task in a log, with the time left
    assert len(lines) == 7 and lines[0].startswith("transfer 1/7 mr: test acc") and "about" in lines[0]
    assert lines[-1].startswith("transfer 7/7 mrpc: test acc") and lines[-1].endswith("about 0 s left")
    for task in tr.TRANSFER_TASKS:
        assert 0 <= res[task] <= 100
    # the class words carry the label (10 % of them flipped in the binary tasks): well above chance
    assert min(res[t] for t in ("mr", "cr", "subj", "mpqa", "sst2")) > 60
    assert res["trec"] > 50 and res["mrpc"] > 60  # TREC: six classes, chance is 17 and 0 < res["mrpc_f1"] <= 100
    assert res["avg"] == round(np.mean([res[t] for t in tr.TRANSFER_TASKS]), 2)
    details = res["transfer_details"]
    assert details["mr"]["ndev"] == 58 and details["sst2"]["ndev"] == 20 and details["sst2"]["ntest"] == 24
    assert details["trec"]["ntest"] == 30 and details["mrpc"]["ndev"] == 50
    assert details["mr"]["fits"] == 10 * 4 * 10 + 10
    table = tr.format_transfer_table({"bow": res})
    assert table.splitlines()[0] == "| model | MR | CR | SUBJ | MPQA | SST2 | TREC | MRPC | avg |"
    assert f"| {res['avg']:.2f} |" in table.splitlines()[2]


def test_subset_of_tasks_has_no_average(senteval_data):
    res = tr.evaluate_transfer(bow_encode, str(senteval_data / "downstream"), tasks=["sst2"], progress=None)
    assert "avg" not in res and set(res) == {"sst2", "transfer_details"}
    with pytest.raises(ValueError, match="unknown transfer task"):
        tr.evaluate_transfer(bow_encode, str(senteval_data), tasks=["sst5"], progress=None)
