"""Writes the notebooks from the cells below and executes them, so their outputs are committed.

    python notebooks/build.py                       # write + execute all (full setting)
    NOTEBOOK_SMALL=1 python notebooks/build.py --check   # what the tests do: execute a small setting, write nothing

Settings come from environment variables read inside the notebooks: ``STS_DIR`` (default: the
test fixtures), ``MODEL`` (a checkpoint or model name; default the offline all-MiniLM-L6-v2),
``RUNS`` (TensorBoard run directories for notebook 4, ``name=path`` separated by commas),
``NOTEBOOK_SMALL`` (a few seconds per notebook).
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

import nbformat
from nbclient import NotebookClient

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent

SETUP = """\
import os, sys, time
from pathlib import Path
ROOT = Path.cwd().parent if Path.cwd().name == "notebooks" else Path.cwd()
sys.path.insert(0, str(ROOT))
os.environ.setdefault("HF_HUB_OFFLINE", "1")
SMALL = os.environ.get("NOTEBOOK_SMALL") == "1"
STS_DIR = os.environ.get("STS_DIR", str(ROOT / "tests" / "fixtures" / "sts"))
MODEL = os.environ.get("MODEL", "sentence-transformers/all-MiniLM-L6-v2")
import torch
import matplotlib.pyplot as plt
from encoders import load  # a checkpoint of this codebase (its own pooling), a model directory or a hub name
"""

NOTEBOOKS = {
    "1_quickstart.ipynb": [
        ("markdown", "# Quickstart: encode, compare, search\n\nLoads a trained model (`MODEL`: a checkpoint "
                     "written by `train.py` or a model name; by default the offline all-MiniLM-L6-v2), embeds "
                     "sentences from three topics and shows their cosine similarities, then runs a semantic "
                     "search over a small corpus."),
        ("code", SETUP),
        ("code", """\
encoder = load(MODEL)
sentences = [
    "The striker scored twice in the final.", "Our team lost the match on penalties.", "She trains at the track every morning.",
    "Preheat the oven before baking the bread.", "Add a pinch of salt to the boiling pasta.", "The soup needs more garlic.",
    "The new phone has a faster processor.", "Update the laptop's operating system tonight.", "The app crashes when I upload photos.",
]
emb = encoder.encode(sentences, normalize=True)  # (9, H)
sim = emb @ emb.T
fig, ax = plt.subplots(figsize=(6, 5))
im = ax.imshow(sim, vmin=0, vmax=1, cmap="viridis")
ax.set_xticks(range(len(sentences)), [s[:18] + "..." for s in sentences], rotation=90)
ax.set_yticks(range(len(sentences)), [s[:18] + "..." for s in sentences])
fig.colorbar(im); ax.set_title("cosine similarity: sport, cooking, technology"); plt.tight_layout(); plt.show()
within = sum(sim[i:i+3, i:i+3].sum() - 3 for i in (0, 3, 6)) / 18
across = (sim.sum() - sum(sim[i:i+3, i:i+3].sum() for i in (0, 3, 6))) / 54
print(f"mean cosine within a topic {within:.3f}, across topics {across:.3f}")"""),
        ("code", """\
corpus = [
    "A man is playing a guitar on stage.", "Heavy rain is expected across the city tonight.",
    "The chef slices tomatoes in the kitchen.", "Engineers are testing a self-driving car.",
    "A dog chases a ball in the park.", "The orchestra performed a symphony last night.",
    "Snow covered the mountain roads this morning.", "The company released a new smartphone today.",
]
corpus_emb = encoder.encode(corpus, normalize=True)
for query in ["Will it rain this evening?", "a new mobile phone launch", "someone is cooking"]:
    scores = corpus_emb @ encoder.encode([query], normalize=True)[0]
    best = scores.topk(2)
    print(query, "->", [(corpus[i], round(float(s), 3)) for s, i in zip(best.values, best.indices)])"""),
    ],
    "2_why_bi_encoders.ipynb": [
        ("markdown", "# Why bi-encoders\n\nFinding the most similar pair among n sentences with a cross-encoder "
                     "takes one transformer pass per pair, n(n-1)/2 passes; a bi-encoder encodes each sentence "
                     "once and takes cosines. We measure both on this machine (the cross-encoder is the same "
                     "transformer run on the concatenated pair: its cost, not its accuracy, is the point): the "
                     "cross-encoder per pair over thousands of pairs, the bi-encoder over thousands of sentences, "
                     "each with a fitted line (slope = cost per pair or sentence, intercept = start-up), and "
                     "extrapolate to 10,000 sentences beside SBERT's example: 65 hours against 5 seconds on a V100."),
        ("code", SETUP),
        ("code", """\
import itertools, random
import numpy as np
encoder = load(MODEL)
rows = [l.split("\\t") for l in open(Path(STS_DIR) / "stsb.test.tsv", encoding="utf-8").read().splitlines()[1:]]
pool = [r[0] for r in rows] + [r[1] for r in rows]
cross_ns = [8, 12, 16] if SMALL else [20, 40, 60, 80]           # 190 .. 3,160 pairs
bi_ns = [50, 100, 200] if SMALL else [1000, 2000, 4000, 8000]   # sentences
cross, bi = [], []
for n in cross_ns:
    sents = random.Random(n).sample(pool * 4, n)
    pairs = list(itertools.combinations(sents, 2))
    start = time.perf_counter()
    with torch.inference_mode():
        for i in range(0, len(pairs), 64):
            chunk = pairs[i:i + 64]
            feats = encoder.tokenizer([a for a, _ in chunk], [b for _, b in chunk], padding=True, truncation=True, return_tensors="pt")
            encoder.transformer(**feats)
    cross.append(time.perf_counter() - start)
    print(f"cross-encoder n={n:5d}: {len(pairs):6d} pairs {cross[-1]:7.2f} s")
for n in bi_ns:
    sents = random.Random(n).choices(pool, k=n)
    start = time.perf_counter()
    emb = encoder.encode(sents, normalize=True)
    (emb @ emb.T).fill_diagonal_(-1).argmax()
    bi.append(time.perf_counter() - start)
    print(f"bi-encoder    n={n:5d}: {n:6d} sentences {bi[-1]:7.2f} s")"""),
        ("code", """\
pairs_n = np.array([n * (n - 1) / 2 for n in cross_ns])
per_pair, cross_start = np.polyfit(pairs_n, np.array(cross), 1)
per_sentence, bi_start = np.polyfit(np.array(bi_ns, dtype=float), np.array(bi), 1)
N = 10_000
print(f"cross-encoder: {per_pair * 1e3:.2f} ms a pair (+{cross_start:.2f} s); "
      f"bi-encoder: {per_sentence * 1e3:.2f} ms a sentence (+{bi_start:.2f} s)")
print(f"n={N:,}: cross-encoder {(cross_start + per_pair * N * (N - 1) / 2) / 3600:.1f} hours, "
      f"bi-encoder {bi_start + per_sentence * N:.1f} s (SBERT on a V100: 65 hours against 5 seconds)")
grid = np.logspace(1, 4, 30)
fig, ax = plt.subplots(figsize=(6, 4))
ax.loglog(grid, cross_start + per_pair * grid * (grid - 1) / 2, label="cross-encoder (fitted)")
ax.loglog(grid, bi_start + per_sentence * grid, label="bi-encoder (fitted)")
ax.scatter(cross_ns, cross, marker="o"); ax.scatter(bi_ns, bi, marker="s")
ax.set_xlabel("sentences n"); ax.set_ylabel("seconds"); ax.legend(); ax.set_title("finding the most similar pair")
plt.tight_layout(); plt.show()"""),
    ],
    "3_pooling.ipynb": [
        ("markdown", "# Pooling\n\nMean, max and CLS pooling of the same model on STS-B dev (Spearman x 100 of "
                     "cosine). all-MiniLM-L6-v2 was trained with mean pooling, so the others lose; a model trained "
                     "with CLS pooling (SimCSE) would rank them differently."),
        ("code", SETUP),
        ("code", """\
from datamodules import load_sts_pairs
from harness.sts_eval import spearman_x100
import torch.nn.functional as F
dev = load_sts_pairs(str(Path(STS_DIR) / "stsb.dev.tsv"))
n = min(64, len(dev)) if SMALL else len(dev)
s1, s2, gold = dev["sentence1"][:n], dev["sentence2"][:n], dev["score"][:n]
results = {}
for pooling in ["mean", "max", "cls_before_pooler"]:
    enc = load(MODEL, pooling=pooling)
    emb = enc.encode(s1 + s2, precision="bf16")
    results[pooling] = spearman_x100(F.cosine_similarity(emb[:n], emb[n:]).numpy(), gold)
    print(f"{pooling:18s} STS-B dev Spearman x 100 = {results[pooling]:.2f}  ({n} pairs)")
plt.bar(list(results), list(results.values())); plt.ylabel("Spearman x 100"); plt.title("pooling on STS-B dev"); plt.show()"""),
    ],
    "4_training_dynamics.ipynb": [
        ("markdown", "# Training dynamics: alignment and uniformity\n\nWang & Isola's alignment (lower: "
                     "positive pairs closer) and uniformity (lower: embeddings spread over the sphere) on the "
                     "STS-B dev set over training, read from the TensorBoard logs of runs (`RUNS=name=dir,...`). "
                     "The DCLR paper argues that its noise negatives and instance weighting improve uniformity "
                     "without hurting alignment. Without `RUNS`, a tiny SimCSE and DCLR run on the fixtures is "
                     "trained here first."),
        ("code", SETUP),
        ("code", """\
import tempfile, yaml
import train
from experiments.plots import read_curves, plot_curves

def tiny_curves():
    # Checkpoints of the two tiny runs weigh about 1 GB, so they live in a directory deleted once read.
    with tempfile.TemporaryDirectory(prefix="training-dynamics-") as tmp:
        out = Path(tmp)
        runs = {}
        for name, extra in [("SimCSE", {}), ("DCLR", {"complementary_model": MODEL, "complementary_pooling": "mean"})]:
            config = {"seed_everything": 1,
                      "trainer": {"max_steps": 6, "val_check_interval": 2, "check_val_every_n_epoch": None,
                                  "default_root_dir": str(out / name), "enable_progress_bar": False,
                                  "precision": "bf16-mixed"},
                      "model": {"class_path": f"lightning_modules.{name}", "init_args": {
                          "encoder": {"class_path": "encoders.SentenceEncoder",
                                      "init_args": {"model_name": MODEL, "max_seq_length": 32}}, "lr": 3e-5, **extra}},
                      "data": {"class_path": "datamodules.WikiDataModule", "init_args": {
                          "train_source": str(ROOT / "tests" / "fixtures" / "sentences.txt"), "sts_dir": STS_DIR,
                          "per_device_batch_size": 8}}}
            path = out / f"{name}.yaml"; path.write_text(yaml.safe_dump(config))
            train.main(["--config", str(path)])
            runs[name] = str(out / name)
        return read_curves(runs)

spec = os.environ.get("RUNS")
curves = read_curves(dict(item.split("=", 1) for item in spec.split(","))) if spec else tiny_curves()
plot_curves(curves); plt.show()
for name, tags in curves.items():
    print(name, {tag: (round(v[0][1], 3), round(v[-1][1], 3)) for tag, v in tags.items()}, "(first, last)")"""),
    ],
}


def build(name: str) -> nbformat.NotebookNode:
    nb = nbformat.v4.new_notebook()
    nb.cells = [nbformat.v4.new_markdown_cell(src) if kind == "markdown" else nbformat.v4.new_code_cell(src)
                for kind, src in NOTEBOOKS[name]]
    nb.metadata["kernelspec"] = {"name": "python3", "display_name": "Python 3", "language": "python"}
    return nb


def execute(nb: nbformat.NotebookNode, timeout: int = 900) -> nbformat.NotebookNode:
    NotebookClient(nb, timeout=timeout, kernel_name="python3", resources={"metadata": {"path": str(HERE)}}).execute()
    return nb


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true", help="execute without writing (the tests)")
    parser.add_argument("names", nargs="*", default=list(NOTEBOOKS))
    args = parser.parse_args()
    for name in args.names:
        nb = execute(build(name))
        if not args.check:
            nbformat.write(nb, HERE / name)
        print(f"{name}: executed" + ("" if args.check else ", written"))


if __name__ == "__main__":
    sys.exit(main())
