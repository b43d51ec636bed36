"""STS data: reading scored sentence pairs, the seven evaluation tasks in either layout, and the
STS-B (or SICK-R) training pairs for regression.

The evaluation tasks (``STS_TASKS``) come from a directory in one of two layouts:

- this project's TSV layout: ``sts12.<subset>.tsv`` ... ``sts16.<subset>.tsv``, ``stsb.test.tsv``,
  ``sickr.test.tsv`` (header ``sentence1, sentence2, score``, extra columns after it);
- SentEval's own data folder, as SentEval's ``get_transfer_data.bash`` and SimCSE's
  ``download_dataset.sh`` leave it: ``STS/STS12-en-test/`` ... ``STS/STS16-en-test/`` with
  ``STS.input.<subset>.txt`` and ``STS.gs.<subset>.txt``, ``STS/STSBenchmark/sts-{train,dev,test}.csv``
  and ``SICK/SICK_{train,trial,test_annotated}.txt``. The folder holding ``STS/`` and ``SICK/``
  (SentEval's ``data/downstream/``) may be given, or ``data/``, or the SentEval (or SimCSE) clone.

SentEval's folder is read by SentEval's own rules (``senteval/sts.py`` and ``senteval/sick.py``), so
both layouts give the same pairs and the same scores. With no directory at hand, ``default_sts_dir``
fetches SimCSE's ``senteval.tar`` from the hub once, checks it and unpacks it next to the cached file.
"""
from __future__ import annotations

import glob
import os
import shutil
import tarfile
import tempfile
from typing import Literal

import datasets

from .base import SentenceDataModule
from .io import DataError, fetch_hub_file
from encoders.paths import data_path
from .scored import load_sts_pairs

STS_TASKS = ("sts12", "sts13", "sts14", "sts15", "sts16", "stsb", "sickr")

# SentEval's subsets per year (senteval/sts.py); STS13 without SMT, which LDC alone distributes.
SENTEVAL_SUBSETS = {
    "sts12": ("MSRpar", "MSRvid", "SMTeuroparl", "surprise.OnWN", "surprise.SMTnews"),
    "sts13": ("FNWN", "headlines", "OnWN"),
    "sts14": ("deft-forum", "deft-news", "headlines", "images", "OnWN", "tweet-news"),
    "sts15": ("answers-forums", "answers-students", "belief", "headlines", "images"),
    "sts16": ("answer-answer", "headlines", "plagiarism", "postediting", "question-question"),
}
# STS-B and SICK-R splits in SentEval's folder, relative to data/downstream/.
SENTEVAL_SPLIT_FILES = {
    "stsb": {split: os.path.join("STS", "STSBenchmark", f"sts-{split}.csv") for split in ("train", "dev", "test")},
    "sickr": {"train": os.path.join("SICK", "SICK_train.txt"), "dev": os.path.join("SICK", "SICK_trial.txt"),
              "test": os.path.join("SICK", "SICK_test_annotated.txt")},
}
# Where data/downstream/ sits below the directory a user gives: itself, data/, the SentEval clone,
# and a SimCSE or DCLR clone (which carries SentEval as a subfolder).
SENTEVAL_LEVELS = ("", "downstream", os.path.join("data", "downstream"),
                   os.path.join("SentEval", "data", "downstream"))

# SimCSE's copy of SentEval's data on the hub, and the pairs SentEval evaluates in each task: the
# unpacked archive must hold exactly these (STS15/16 count only the pairs with a gold score).
SENTEVAL_TAR = "hf://datasets/princeton-nlp/datasets-for-simcse/senteval.tar"
SENTEVAL_PAIRS = {"sts12": 3108, "sts13": 1500, "sts14": 3750, "sts15": 3000, "sts16": 1186, "stsb": 1379, "sickr": 4927}

LOCAL_WAYS = ("give --sts_dir DIR with this project's TSV layout (sts12.<subset>.tsv ... sts16.<subset>.tsv, "
              "stsb.test.tsv, sickr.test.tsv) or with SentEval's data folder (the folder holding STS/ and SICK/ "
              "that SentEval's or SimCSE's download script leaves, or its data/ or SentEval parent)")


# -- the evaluation tasks: which layout, and its files -----------------------------------------------
def _check_task(task: str) -> None:
    if task not in STS_TASKS:
        raise DataError(f"unknown STS task {task!r}; choose from {', '.join(STS_TASKS)}")


def _has_tsv_layout(sts_dir: str) -> bool:
    return any(glob.glob(os.path.join(sts_dir, f"{task}.*.tsv")) for task in STS_TASKS)


def _is_senteval_downstream(path: str) -> bool:
    sts = os.path.join(path, "STS")
    known = [f"{t.upper()}-en-test" for t in SENTEVAL_SUBSETS] + ["STSBenchmark"]
    if os.path.isdir(sts) and any(os.path.isdir(os.path.join(sts, k)) for k in known):
        return True
    return os.path.isfile(os.path.join(path, SENTEVAL_SPLIT_FILES["sickr"]["test"]))


def sts_layout(sts_dir: str) -> tuple[Literal["tsv", "senteval"], str]:
    """The layout of an evaluation directory, and the folder to read: ``("tsv", sts_dir)``, or
    ``("senteval", <SentEval's data/downstream/>)`` when ``sts_dir`` is that folder, its parent
    ``data/``, the SentEval clone or a SimCSE clone. TSV files in ``sts_dir`` itself win."""
    sts_dir = data_path(sts_dir)
    if not os.path.isdir(sts_dir):
        raise DataError(f"{sts_dir}: STS directory not found")
    if _has_tsv_layout(sts_dir):
        return "tsv", sts_dir
    for level in SENTEVAL_LEVELS:
        candidate = os.path.join(sts_dir, level) if level else sts_dir
        if _is_senteval_downstream(candidate):
            return "senteval", os.path.normpath(candidate)
    raise DataError(f"{sts_dir}: neither this project's STS layout (sts12.<subset>.tsv ... sickr.test.tsv) nor "
                    "SentEval's data folder (STS/STS12-en-test/ ..., STS/STSBenchmark/, SICK/ in it, in its "
                    "downstream/ or in its data/downstream/)")


def sts_task_files(sts_dir: str, task: str) -> dict[str, str]:
    """Subset name -> file of one evaluation task in a directory of this project's TSV layout.

    STS12-16: every ``<task>.<subset>.tsv``; STS-B and SICK-R: the test split.
    """
    _check_task(task)
    if not os.path.isdir(sts_dir):
        raise DataError(f"{sts_dir}: STS directory not found")
    if task in ("stsb", "sickr"):
        path = os.path.join(sts_dir, f"{task}.test.tsv")
        if not os.path.isfile(path):
            raise DataError(f"{path}: data file not found")
        return {"test": path}
    files = sorted(glob.glob(os.path.join(sts_dir, f"{task}.*.tsv")))
    if not files:
        raise DataError(f"{sts_dir}: no {task}.<subset>.tsv files found")
    return {os.path.basename(f)[len(task) + 1:-len(".tsv")]: f for f in files}


def load_sts_task(sts_dir: str, task: str) -> dict[str, datasets.Dataset]:
    """Subset name -> pairs (sentence1, sentence2, score rescaled to [0, 1]) of one evaluation task,
    from a directory in either layout (``sts_layout``). Subsets come sorted by name in both layouts,
    so that a task's concatenated pairs are in the same order whichever layout they were read from."""
    _check_task(task)
    layout, folder = sts_layout(sts_dir)
    if layout == "tsv":
        return {subset: load_sts_pairs(path) for subset, path in sts_task_files(folder, task).items()}
    if task in SENTEVAL_SUBSETS:
        return {subset: read_senteval_subset(folder, task, subset) for subset in sorted(SENTEVAL_SUBSETS[task])}
    return {"test": read_senteval_split(folder, task, "test")}


# -- SentEval's folder, read by SentEval's rules ------------------------------------------------------
def _read_text(path: str) -> str:
    """The file's text with universal line ends, as SentEval's ``io.open(path, encoding='utf8')``
    reads it; a BOM is dropped. Errors name the file (and the line of a bad byte)."""
    if not os.path.isfile(path):
        raise DataError(f"{path}: data file not found")
    with open(path, "rb") as f:
        raw = f.read()
    try:
        text = raw.decode("utf-8-sig")
    except UnicodeDecodeError as err:
        line = raw.count(b"\n", 0, err.start) + 1
        raise DataError(f"{path}:{line}: not UTF-8 ({err.reason})") from None
    return text.replace("\r\n", "\n").replace("\r", "\n")


def _file_lines(path: str) -> list[str]:
    """Lines as ``for line in open(path)`` yields them (SentEval's STS-B and SICK readers), ends removed."""
    lines = _read_text(path).split("\n")
    return lines[:-1] if lines and lines[-1] == "" else lines


def _pairs(rows: list[tuple[str, str, str, int]], task: str, text_file: str, score_file: str) -> datasets.Dataset:
    """rows of (sentence1, sentence2, score text, line) -> checked pairs with rescaled scores, as the
    TSV layout checks them; errors name the file that holds the sentences or the score."""
    low, high = (1.0, 5.0) if task == "sickr" else (0.0, 5.0)
    s1, s2, scores = [], [], []
    for a, b, value, line in rows:
        for column, sentence in (("sentence1", a), ("sentence2", b)):
            if not sentence.split():
                raise DataError(f"{text_file}:{line}: empty sentence ({column})")
        try:
            score = float(value)
        except ValueError:
            raise DataError(f"{score_file}:{line}: score {value!r} is not a number") from None
        if not low <= score <= high:  # also refuses nan
            raise DataError(f"{score_file}:{line}: score {value!r} is outside the range [{low:g}, {high:g}]")
        s1.append(a), s2.append(b), scores.append((score - low) / (high - low))
    if not scores:
        raise DataError(f"{score_file}: no scored pairs")
    return datasets.Dataset.from_dict({"sentence1": s1, "sentence2": s2, "score": scores})


def read_senteval_subset(downstream: str, task: str, subset: str) -> datasets.Dataset:
    """One STS12-16 subset of SentEval's folder, as SentEval's ``STSEval.loadFile`` reads it.

    ``STS.input.<subset>.txt`` line i (two sentences separated by a tab) pairs with
    ``STS.gs.<subset>.txt`` line i; both are split with ``str.splitlines()``; pairs whose gold line is
    empty are dropped (STS15 and STS16 list unscored pairs). Extra tab-separated fields after the two
    sentences (the official STS16 input files carry source columns) are ignored.
    """
    folder = os.path.join(downstream, "STS", f"{task.upper()}-en-test")
    inputs, gold = (os.path.join(folder, f"STS.{kind}.{subset}.txt") for kind in ("input", "gs"))
    input_lines, gold_lines = _read_text(inputs).splitlines(), _read_text(gold).splitlines()
    if len(input_lines) < len(gold_lines):
        n = len(input_lines)
        raise DataError(f"{inputs}:{n + 1}: no input line for {gold}:{n + 1} (the input file has {n} lines, "
                        f"the gold file {len(gold_lines)}; line i of one pairs with line i of the other)")
    if len(gold_lines) < len(input_lines):
        n = len(gold_lines)
        raise DataError(f"{gold}:{n + 1}: no gold line for {inputs}:{n + 1} (the gold file has {n} lines, "
                        f"the input file {len(input_lines)}; an unscored pair needs an empty gold line)")
    rows = []
    for line_no, (pair, score) in enumerate(zip(input_lines, gold_lines), start=1):
        if score == "":
            continue  # SentEval: not_empty_idx = raw_scores != ''
        fields = pair.split("\t")
        if len(fields) < 2:
            raise DataError(f"{inputs}:{line_no}: expected two sentences separated by a tab, found "
                            f"{len(fields)} field")
        rows.append((fields[0], fields[1], score, line_no))
    return _pairs(rows, task, inputs, gold)


def read_senteval_split(downstream: str, task: Literal["stsb", "sickr"], split: str = "test") -> datasets.Dataset:
    """An STS-B or SICK-R split of SentEval's folder, as SentEval's readers take it: every line of
    ``sts-<split>.csv`` is tab-separated, score in column 4 and the sentences in columns 5 and 6
    (counting from 0), no header; ``SICK_*.txt`` has a header line, then the sentences in columns 1
    and 2 and the relatedness score in column 3."""
    if task not in SENTEVAL_SPLIT_FILES or split not in SENTEVAL_SPLIT_FILES[task]:
        raise DataError(f"SentEval's folder has no {task!r} split {split!r}")
    path = os.path.join(downstream, SENTEVAL_SPLIT_FILES[task][split])
    lines = _file_lines(path)
    a, b, score, start = (5, 6, 4, 1) if task == "stsb" else (1, 2, 3, 2)
    if task == "sickr":
        lines = lines[1:]  # the header line: pair_ID, sentence_A, sentence_B, relatedness_score, ...
    rows = []
    for line_no, line in enumerate(lines, start=start):
        fields = line.strip().split("\t")
        if len(fields) <= max(a, b, score):
            raise DataError(f"{path}:{line_no}: expected at least {max(a, b, score) + 1} tab-separated fields, "
                            f"found {len(fields)}")
        rows.append((fields[a], fields[b], fields[score], line_no))
    return _pairs(rows, task, path, path)


def senteval_pair_counts(downstream: str) -> dict[str, int]:
    """Pairs per evaluation task in SentEval's folder, as SentEval counts them (test splits)."""
    return {task: sum(len(pairs) for pairs in load_sts_task(downstream, task).values()) for task in STS_TASKS}


# -- no directory given: SimCSE's senteval.tar from the hub -------------------------------------------
def _unpack(archive: str, target: str) -> None:
    """Extract ``archive`` into the new folder ``target``, refusing members that would land outside it
    (absolute paths, ``..``, links pointing out) and anything but files, folders and links."""
    try:
        with tarfile.open(archive) as tar:
            members = tar.getmembers()
            root = os.path.realpath(target)
            for m in members:
                places = [m.name] + ([os.path.join(os.path.dirname(m.name), m.linkname)] if m.issym() else
                                     [m.linkname] if m.islnk() else [])
                for place in places:
                    resolved = os.path.realpath(os.path.join(root, place))
                    if os.path.isabs(place) or os.path.commonpath([root, resolved]) != root:
                        raise DataError(f"{archive}: member {m.name!r} would be written outside the folder it "
                                        "is unpacked into; refusing the archive")
                if not (m.isfile() or m.isdir() or m.issym() or m.islnk()):
                    raise DataError(f"{archive}: member {m.name!r} is not a file, folder or link; refusing the archive")
            extract = {"filter": "data"} if hasattr(tarfile, "data_filter") else {}
            tar.extractall(target, members=members, **extract)
    except (tarfile.TarError, EOFError) as err:
        raise DataError(f"{archive}: not a readable tar archive ({err})") from None


def _downstream_in(folder: str) -> str | None:
    """SentEval's data/downstream/ inside an unpacked archive: at one of ``SENTEVAL_LEVELS`` of the
    folder or of its single top-level subfolder."""
    tops = [os.path.join(folder, d) for d in os.listdir(folder) if os.path.isdir(os.path.join(folder, d))]
    for base in [folder, *(tops if len(tops) == 1 else [])]:
        for level in SENTEVAL_LEVELS:
            candidate = os.path.join(base, level) if level else base
            if _is_senteval_downstream(candidate):
                return candidate
    return None


def default_sts_dir(source: str = SENTEVAL_TAR) -> str:
    """SentEval's data folder unpacked from SimCSE's ``senteval.tar`` on the hub, for evaluation
    without ``--sts_dir``.

    The archive is downloaded once into the Hugging Face cache (``fetch_hub_file``; offline, the cached
    copy), unpacked once next to it into ``senteval.tar.unpacked/``, and reused from there. Before the
    unpacked folder takes that name, the pairs of every task are counted as SentEval counts them and
    compared with ``SENTEVAL_PAIRS``, so a folder of that name always passed the check. Without the
    hub or a cached copy, one ``DataError`` line names the local ways.
    """
    try:
        archive = fetch_hub_file(source)
    except DataError as err:
        reason = str(err).removeprefix(f"{source}: ").split(";")[0]
        raise DataError(f"{source} (the STS evaluation data): {reason}; {LOCAL_WAYS}") from None
    target = archive + ".unpacked"
    if not os.path.isdir(target):
        work = tempfile.mkdtemp(prefix=".senteval-unpacking-", dir=os.path.dirname(archive))
        try:
            _unpack(archive, work)
            downstream = _downstream_in(work)
            if downstream is None:
                raise DataError(f"{source}: the archive holds no SentEval data folder (STS/ and SICK/)")
            counts = senteval_pair_counts(downstream)
            wrong = [f"{t} {counts[t]} (SentEval: {n})" for t, n in SENTEVAL_PAIRS.items() if counts[t] != n]
            if wrong:
                raise DataError(f"{source}: unexpected pairs per task: {', '.join(wrong)}; the archive is not "
                                "SimCSE's senteval.tar")
            try:
                os.rename(work, target)  # atomic: a folder named target is complete and checked
            except OSError:
                if not os.path.isdir(target):  # else another process finished first: use its folder
                    raise
        finally:
            if os.path.isdir(work):
                shutil.rmtree(work, ignore_errors=True)
    downstream = _downstream_in(target)
    if downstream is None:
        raise DataError(f"{target}: no SentEval data folder in it; delete the folder to unpack {source} again")
    return downstream


class STSDataModule(SentenceDataModule):
    """Scored sentence pairs for regression (SBERT's STS-B fine-tuning).

    Batch keys: ``sentence1``, ``sentence2`` (tokenized), ``score`` (gold score rescaled to [0, 1]).

    Args:
        train_source: an STS file (``stsb.train.tsv``, header sentence1, sentence2, score, extra
            columns ignored) or hub split (``sentence-transformers/stsb:train``).
        score_range: the gold scale; by default 0-5, 1-5 for SICK files, 0-1 for the hub STS-B.
    """

    text_columns = ("sentence1", "sentence2")
    label_columns = ("score",)

    def __init__(self, train_source: str, score_range: tuple[float, float] | None = None, **kwargs) -> None:
        super().__init__(**kwargs)
        self.train_source = train_source
        self.score_range = score_range

    def load_train_rows(self) -> datasets.Dataset:
        return load_sts_pairs(self.train_source, self.score_range)
