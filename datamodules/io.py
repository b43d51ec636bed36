"""Reading sentence data through the ``datasets`` library, with errors that name file and line.

A *source* is one of:

- a local file (``.tsv``, ``.csv``, ``.jsonl``/``.json``, ``.txt``, ``.parquet``);
- one file of a hub dataset repository, ``hf://datasets/<owner>/<name>[@<revision>]/<path>``
  (SimCSE's ``hf://datasets/princeton-nlp/datasets-for-simcse/wiki1m_for_simcse.txt``): downloaded
  once into the Hugging Face cache (``fetch_hub_file``, from a DataModule's ``prepare_data``), then
  read as the local file it has become;
- a hub dataset written ``name[:config]:split`` (``snli:train``, ``multi_nli:validation_matched``,
  ``sentence-transformers/stsb:train``), which ``datasets`` must load without a loading script
  (``datasets>=4`` refuses those).

Local files go through ``load_dataset("csv" | "json" | "text" | "parquet")``, so every path ends in
the same memory-mapped, cached Arrow table. A hub that cannot be reached is one ``DataError`` naming
the source and the offline way out, found before ``huggingface_hub``'s retries (half a minute or more).

TSV/CSV are read with no quoting at all (the STS files contain bare ``"``), every column as a
string, blank lines kept so that row ``i`` is always line ``i + 2`` of the file and errors can
name it. A UTF-8 BOM and Windows line ends are accepted.
"""
from __future__ import annotations

import contextlib
import csv
import logging
import math
import os
from typing import Callable, Sequence, TypeVar
from urllib.parse import unquote

import datasets
import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
from huggingface_hub import constants as hub_constants
from huggingface_hub import hf_hub_download

from encoders.hub import hub_offline as _hub_offline
from encoders.hub import hub_unreachable_reason as _hub_unreachable_reason
from encoders.hub import is_unreachable_error as _unreachable

from encoders.paths import data_path

log = logging.getLogger(__name__)
T = TypeVar("T")

LOCAL_SUFFIXES = {".tsv": "csv", ".csv": "csv", ".jsonl": "json", ".json": "json", ".txt": "text",
                  ".parquet": "parquet"}
HUB_FILE_PREFIX = "hf://datasets/"


class DataError(ValueError):
    """Bad input data; the message names the file and line, or the column."""


@contextlib.contextmanager
def quiet_progress():
    """No ``datasets`` progress bars inside: reading a local file ("Generating train split") or our
    own ``map``/``filter`` takes a second and would print a bar per file; hub downloads keep theirs."""
    was_disabled = datasets.utils.are_progress_bars_disabled()
    datasets.utils.disable_progress_bars()
    try:
        yield
    finally:
        if not was_disabled:
            datasets.utils.enable_progress_bars()


def is_hub_file(source: str) -> bool:
    return source.startswith(HUB_FILE_PREFIX)


def is_local(source: str) -> bool:
    return not is_hub_file(source) and (os.path.exists(source) or _kind(source) is not None)


def _kind(path: str) -> str | None:
    return LOCAL_SUFFIXES.get(os.path.splitext(path)[1].lower())


def _first_line_of(path: str) -> int:
    """Line number of row 0: 2 for files with a header line, 1 for JSON lines and text."""
    return 2 if _kind(path) == "csv" else 1


def describe_row(source: str, row: int) -> str:
    """``file:line`` for a (local or hub) text file, ``source row N`` for a hub dataset or parquet."""
    if (is_local(source) or is_hub_file(source)) and _kind(source) not in (None, "parquet"):
        return f"{source}:{row + _first_line_of(source)}"
    return f"{source} row {row}"


# -- the hub: one file of a repository, or a split through `datasets` ---------------------------------
def parse_hub_file(source: str) -> tuple[str, str | None, str]:
    """``hf://datasets/<owner>/<name>[@<revision>]/<path>`` as ``(repo_id, revision, path)``.

    A revision is a branch, tag or commit; ``refs/convert/parquet`` and ``refs/pr/N`` may be written
    as they are or URL-encoded (``refs%2Fconvert%2Fparquet``), as ``huggingface_hub``'s ``hf://`` paths allow.
    """
    parts = source[len(HUB_FILE_PREFIX):].split("/")
    if len(parts) < 3 or not all(parts[:2]) or not parts[-1]:
        raise DataError(f"{source}: a hub file is written hf://datasets/<owner>/<name>[@<revision>]/<path>")
    owner, name, rest = parts[0], parts[1], parts[2:]
    revision = None
    if "@" in name:
        name, revision = name.split("@", 1)
        if revision == "refs" and rest[:1] in (["convert"], ["pr"]) and len(rest) > 2:
            revision, rest = "/".join([revision, *rest[:2]]), rest[2:]  # refs/convert/parquet, refs/pr/3
        revision = unquote(revision)
    if not rest or not name or revision == "":
        raise DataError(f"{source}: a hub file is written hf://datasets/<owner>/<name>[@<revision>]/<path>")
    return f"{owner}/{name}", revision, "/".join(rest)


def _from_hub(source: str, call: Callable[[], T]) -> T:
    """Run one hub call (a download, a ``load_dataset``) with errors a user can act on: one line that
    names the source and how to work offline, instead of a retry loop and a traceback."""
    offline = _hub_offline()
    way_out = ("to work offline, set HF_HUB_OFFLINE=1 (a copy already in the Hugging Face cache is then used as "
               "it is), add a configs/overlays/offline_*.yaml overlay, or give a local file in its place")
    if not offline:
        reason = _hub_unreachable_reason(hub_constants.ENDPOINT)
        if reason is not None:
            raise DataError(f"{source}: the Hugging Face hub cannot be reached ({reason}); {way_out}")
    try:
        return call()
    except Exception as err:
        if _unreachable(err) and offline:
            raise DataError(f"{source}: not in the Hugging Face cache, and HF_HUB_OFFLINE=1 forbids downloading it; "
                            "give a local file in its place, or download it once without HF_HUB_OFFLINE") from None
        if _unreachable(err):
            raise DataError(f"{source}: the Hugging Face hub cannot be reached ({type(err).__name__}); "
                            f"{way_out}") from None
        if "scripts are no longer supported" in str(err):
            raise DataError(f"{source}: a dataset with a loading script, which datasets 4 and later no longer run; "
                            "use a parquet copy of it on the hub (hf://datasets/...) or a local file") from None
        if type(err).__name__ in ("DatasetNotFoundError", "RepositoryNotFoundError", "RemoteEntryNotFoundError",
                                  "EntryNotFoundError", "RevisionNotFoundError"):
            raise DataError(f"{source}: not found on the Hugging Face hub ({str(err).splitlines()[0]})") from None
        raise


def fetch_hub_file(source: str) -> str:
    """The local path of a ``hf://datasets/...`` file: from the Hugging Face cache when it is there
    (no network), else downloaded into it once."""
    repo_id, revision, filename = parse_hub_file(source)
    kwargs = dict(repo_id=repo_id, filename=filename, repo_type="dataset", revision=revision)
    try:
        return hf_hub_download(**kwargs, local_files_only=True)
    except Exception as err:
        if not _unreachable(err):  # LocalEntryNotFoundError: not cached yet
            raise
    return _from_hub(source, lambda: hf_hub_download(**kwargs))


def _read_header(path: str, delimiter: str) -> list[str]:
    with open(path, encoding="utf-8-sig", newline="") as f:
        first = f.readline()
    if not first.strip():
        raise DataError(f"{path}:1: the file is empty or has no header line")
    return first.rstrip("\r\n").split(delimiter)


def _check_field_counts(path: str, delimiter: str, expected: int) -> None:
    """Without quoting a row's field count is its delimiter count + 1; pandas would otherwise
    shift a row with an extra field into an index column instead of failing."""
    with open(path, encoding="utf-8-sig", newline="") as f:
        for line_no, line in enumerate(f, start=1):
            found = line.count(delimiter) + 1
            if found != expected and line.strip("\r\n"):
                raise DataError(
                    f"{path}:{line_no}: expected {expected} fields separated by {delimiter!r}, found {found}"
                )


def load_source(source: str, text_column: str = "text") -> datasets.Dataset:
    """Load one source as a ``datasets.Dataset`` (no validation beyond the file's own syntax); ``${SENTEMB_DATA}``
    in it is the data root (``data_path``)."""
    source = data_path(source)
    if is_hub_file(source):
        if _kind(source) is None:
            raise DataError(f"{source}: unknown file type; use one of {', '.join(sorted(LOCAL_SUFFIXES))}")
        return _load_file(fetch_hub_file(source), source, text_column)
    if is_local(source):
        if not os.path.isfile(source):
            raise DataError(f"{source}: data file not found")
        return _load_file(source, source, text_column)
    parts = source.split(":")
    if len(parts) not in (2, 3):
        raise DataError(f"{source!r}: not a local file, not hf://datasets/<repo>/<file> and not a hub dataset "
                        "written name[:config]:split")
    name, config, split = (parts[0], None, parts[1]) if len(parts) == 2 else parts
    return _from_hub(source, lambda: datasets.load_dataset(name, config, split=split))


def _load_file(path: str, source: str, text_column: str) -> datasets.Dataset:
    """Read the file at ``path``; errors name ``source`` (the path, or the hub address it came from)."""
    if os.path.getsize(path) == 0:
        raise DataError(f"{source}: the data file is empty")
    kind = _kind(path)
    if kind is None:
        raise DataError(f"{source}: unknown file type; use one of {', '.join(sorted(LOCAL_SUFFIXES))}")
    with quiet_progress():
        return _read_file(path, source, text_column, kind)


def _read_file(path: str, source: str, text_column: str, kind: str) -> datasets.Dataset:
    try:
        if kind == "csv":
            delimiter = "," if path.lower().endswith(".csv") else "\t"
            header = _read_header(path, delimiter)
            _check_field_counts(path, delimiter, len(header))
            features = datasets.Features({name: datasets.Value("string") for name in header})
            return datasets.load_dataset(
                "csv", data_files=path, split="train", delimiter=delimiter, quoting=csv.QUOTE_NONE,
                keep_default_na=False, na_filter=False, skip_blank_lines=False, features=features,
                encoding="utf-8-sig",
            )
        if kind == "text":
            ds = datasets.load_dataset("text", data_files=path, split="train", encoding="utf-8-sig")
            return ds.rename_column("text", text_column) if text_column != "text" else ds
        return datasets.load_dataset(kind, data_files=path, split="train")
    except DataError:
        raise
    except Exception as err:  # pandas/pyarrow parser errors name the line but not the file
        raise DataError(f"{source}: cannot parse: {_first_line_of_message(err)}") from err


def _first_line_of_message(err: BaseException) -> str:
    while err.__cause__ is not None and not str(err).strip():
        err = err.__cause__
    text = str(err).strip() or type(err).__name__
    return text.splitlines()[-1] if "Error tokenizing" in text else text.splitlines()[0]


def require_columns(ds: datasets.Dataset, columns: Sequence[str], source: str) -> None:
    missing = [c for c in columns if c not in ds.column_names]
    if missing:
        raise DataError(
            f"{describe_row(source, -1) if is_local(source) and _first_line_of(source) == 2 else source}: "
            f"missing column(s) {missing}; the header has {ds.column_names}"
        )


def _first_index(mask: pa.ChunkedArray) -> int | None:
    idx = pc.index(mask, True).as_py()
    return None if idx is None or idx < 0 else idx


def check_text_columns(ds: datasets.Dataset, columns: Sequence[str], source: str) -> None:
    """Every sentence must be present and non-empty: an error names the first bad line."""
    arrow = ds.with_format("arrow")  # respects a selection's index mapping
    for column in columns:
        values = arrow[column]
        if not pa.types.is_string(values.type) and not pa.types.is_large_string(values.type):
            values = pc.cast(values, pa.string())
        bad = pc.or_kleene(pc.is_null(values), pc.equal(pc.utf8_length(pc.utf8_trim_whitespace(values)), 0))
        row = _first_index(pc.fill_null(bad, True))
        if row is not None:
            raise DataError(f"{describe_row(source, row)}: empty or missing sentence in column {column!r}")


def parse_scores(ds: datasets.Dataset, column: str, source: str, low: float, high: float) -> list[float]:
    """Scores as floats within [low, high]; an error names the first bad line."""
    scores = []
    for row, value in enumerate(ds[column]):
        try:
            score = float(value)
        except (TypeError, ValueError):
            raise DataError(f"{describe_row(source, row)}: score {value!r} in column {column!r} is not a number") from None
        if not math.isfinite(score) or not low <= score <= high:
            raise DataError(f"{describe_row(source, row)}: score {value!r} is outside the range [{low:g}, {high:g}]")
        scores.append(score)
    return scores


def sentence_ids(ds: datasets.Dataset, columns: Sequence[str], piece: int = 1 << 16) -> np.ndarray:
    """(N, len(columns)) int64 ids, equal for equal text in any of the columns (duplicate detection).

    Read in pieces from Arrow and kept as 64-bit hashes of the text, never as a Python string or
    tuple per row (1M rows: ~2 s and 16 MB, where a list of tuples took ~8 s and 250 MB). Two
    different sentences share an id with probability about N^2 / 2^64; they are then merely
    kept out of the same batch.
    """
    arrow = ds.with_format("arrow")  # respects a selection's index mapping
    hashes = []
    for column in columns:
        values = arrow[column]
        for chunk in values.chunks if isinstance(values, pa.ChunkedArray) else [values]:
            for start in range(0, len(chunk), piece):
                text = chunk.slice(start, piece).to_pylist()
                hashes.append(np.fromiter(map(hash, text), dtype=np.int64, count=len(text)))
    flat = np.concatenate(hashes) if hashes else np.zeros(0, dtype=np.int64)
    ids = np.unique(flat, return_inverse=True)[1].astype(np.int64)  # dense ids: the sampler counts them
    return ids.reshape(len(columns), len(ds)).T


def token_counts(ds: datasets.Dataset, column: str) -> list[int]:
    """Length of each token-id list in ``column``, read from Arrow (no lists of ids built)."""
    return pc.list_value_length(ds.with_format("arrow")[column]).to_numpy(zero_copy_only=False).tolist()


def drop_rows(ds: datasets.Dataset, keep: Sequence[bool], source: str, why: str) -> datasets.Dataset:
    """Drop rows on request, and say how many in the log (nothing is dropped silently)."""
    dropped = len(keep) - sum(keep)
    if dropped:
        log.warning("%s: dropped %d of %d rows (%s)", source, dropped, len(keep), why)
        ds = ds.select([i for i, k in enumerate(keep) if k])
    return ds
