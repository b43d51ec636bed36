"""TF-IDF sentence features, FILM's sparse input."""
from __future__ import annotations

from typing import Any, Sequence

import numpy as np
import scipy.sparse as sp


def tfidf_features(sentences: Sequence[str], **vectorizer_kwargs: Any) -> tuple[sp.csc_matrix, Any]:
    """TF-IDF features of ``sentences`` as a ``(D, n)`` scipy CSC matrix (one column per sentence,
    L2-normalised by scikit-learn's default ``norm="l2"``), and the fitted ``TfidfVectorizer``.

    Raises ValueError for fewer than two sentences or an empty vocabulary (e.g. only stop words).
    """
    from sklearn.feature_extraction.text import TfidfVectorizer

    sentences = list(sentences)
    if len(sentences) < 2:
        raise ValueError(
            f"TF-IDF needs at least two sentences, got {len(sentences)}: a single-sentence "
            "vocabulary gives every term the same idf and no metric can be learned"
        )
    vectorizer = TfidfVectorizer(**vectorizer_kwargs)
    try:
        features = vectorizer.fit_transform(sentences)  # (n, D)
    except ValueError as err:
        if "empty vocabulary" in str(err):
            raise ValueError(
                "empty vocabulary: the sentences contain no token the vectorizer keeps "
                f"(only stop words, or too strict min_df/max_df?): {err}"
            ) from err
        raise
    return sp.csc_matrix(features.T, dtype=np.float64), vectorizer  # (D, n)
