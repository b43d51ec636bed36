"""Reading sentence data through the ``datasets`` library, with errors that name file and line.

A *source* is either a local file (``.tsv``, ``.csv``, ``.jsonl``/``.json``, ``.txt``) or a hub
dataset written ``name[:config]:split`` (``snli:train``, ``multi_nli:validation_matched``,
``sentence-transformers/stsb:train``). Local files go through ``load_dataset("csv" | "json" |
"text")``, so both paths end in the same memory-mapped, cached Arrow table.

TSV/CSV are read with no quoting at all (the STS files contain bare ``"``), every column as a
string, blank lines kept so that row ``i`` is always line ``i + 2`` of the file and errors can
name it. A UTF-8 BOM and Windows line ends are accepted.
"""
from __future__ import annotations

import csv
import logging
import math
import os
from typing import Sequence

import datasets
import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

log = logging.getLogger(__name__)

LOCAL_SUFFIXES = {".tsv": "csv", ".csv": "csv", ".jsonl": "json", ".json": "json", ".txt": "text"}


class DataError(ValueError):
    """Bad input data; the message names the file and line, or the column."""


def is_local(source: str) -> bool:
    return os.path.exists(source) or os.path.splitext(source)[1].lower() in LOCAL_SUFFIXES


def _first_line_of(path: str) -> int:
    """Line number of row 0: 2 for files with a header line, 1 for JSON lines and text."""
    return 2 if LOCAL_SUFFIXES.get(os.path.splitext(path)[1].lower()) == "csv" else 1


def describe_row(source: str, row: int) -> str:
    """``file:line`` for a local file, ``source row N`` for a hub dataset."""
    if is_local(source):
        return f"{source}:{row + _first_line_of(source)}"
    return f"{source} row {row}"


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
    """Load one source as a ``datasets.Dataset`` (no validation beyond the file's own syntax)."""
    if is_local(source):
        if not os.path.isfile(source):
            raise DataError(f"{source}: data file not found")
        if os.path.getsize(source) == 0:
            raise DataError(f"{source}: the data file is empty")
        kind = LOCAL_SUFFIXES.get(os.path.splitext(source)[1].lower())
        if kind is None:
            raise DataError(f"{source}: unknown file type; use one of {', '.join(sorted(LOCAL_SUFFIXES))}")
        try:
            if kind == "csv":
                delimiter = "," if source.lower().endswith(".csv") else "\t"
                header = _read_header(source, delimiter)
                _check_field_counts(source, delimiter, len(header))
                features = datasets.Features({name: datasets.Value("string") for name in header})
                return datasets.load_dataset(
                    "csv", data_files=source, split="train", delimiter=delimiter, quoting=csv.QUOTE_NONE,
                    keep_default_na=False, na_filter=False, skip_blank_lines=False, features=features,
                    encoding="utf-8-sig",
                )
            if kind == "text":
                ds = datasets.load_dataset("text", data_files=source, split="train", encoding="utf-8-sig")
                return ds.rename_column("text", text_column) if text_column != "text" else ds
            return datasets.load_dataset("json", data_files=source, split="train")
        except DataError:
            raise
        except Exception as err:  # pandas/pyarrow parser errors name the line but not the file
            raise DataError(f"{source}: cannot parse: {_first_line_of_message(err)}") from err
    parts = source.split(":")
    if len(parts) not in (2, 3):
        raise DataError(f"{source!r}: not a local file and not a hub dataset written name[:config]:split")
    name, config, split = (parts[0], None, parts[1]) if len(parts) == 2 else parts
    return datasets.load_dataset(name, config, split=split)


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
