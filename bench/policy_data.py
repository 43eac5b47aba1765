"""The policy benchmark's data sets (bench/policy_benchmark.py): real data, no download.

Every data set comes as a Split: a training set, a holdout split drawn from the same
distribution (class counts and label noise; used only to train the irreducible-loss model of
the reducible-loss arms, as RHO-LOSS does), and a class-balanced test set with clean labels.
The seed picks the split and the noise; every arm of a seed sees the same Split.

  digits, digits_lt, digits_noisy   scikit-learn's load_digits (1,797 images, 8x8): 100 training
                                    images per class (long-tailed: imbalance factor 50, counts
                                    100, 64, 41, 27, 17, 11, 7, 4, 3, 2), a holdout of 30% of
                                    those counts, 44 test images per class (440)
  cancer_lt                         load_breast_cancer: 250 benign, 5 malignant (1:50), a
                                    holdout of 10% of those (25 + 1), 80 test rows per class
  fmnist, fmnist_lt, fmnist_noisy   Fashion-MNIST from Debian's dataset-fashion-mnist (60,000 +
                                    10,000 28x28 images, averaged to 14x14 so that an MLP trains
                                    on a shared 2-core machine): per class 5,000 training and
                                    1,000 holdout images of the official training set
                                    (long-tailed: imbalance factor 50, 5,000 down to 100), 200
                                    test images per class of the official test set (2,000)

`_noisy`: 20% of the training and holdout labels replaced by a random other class (the test
labels stay clean).
"""

import gzip
import math
import os
from typing import List, NamedTuple

import numpy as np
import torch

SKLEARN_SETS = ("digits_lt", "digits", "digits_noisy", "cancer_lt")
FMNIST_SETS = ("fmnist", "fmnist_lt", "fmnist_noisy")
DATASETS = SKLEARN_SETS + FMNIST_SETS
IMBALANCE = 50        # Head class count / tail class count of the `_lt` sets.
NOISE = 0.2           # Share of wrong labels in the `_noisy` sets.
# scikit-learn sets: holdout counts per class / training counts (breast cancer has 357 benign
# rows: 80 test, 250 training, 25 holdout).
HOLDOUT_SHARE = {"digits": 0.3, "cancer": 0.1}
# Debian's dataset-fashion-mnist installs the four IDX files here (dpkg -L dataset-fashion-mnist).
FMNIST_DIR = os.environ.get("SAMPLERD_FASHION_MNIST", "/usr/share/datasets/fashion-mnist")


class Split(NamedTuple):
    x: torch.Tensor          # float32 [n, features]
    y: torch.Tensor          # int64 [n], with the noise of `_noisy` sets
    x_hold: torch.Tensor     # the holdout split (irreducible-loss model only)
    y_hold: torch.Tensor
    x_test: torch.Tensor     # class-balanced, clean labels
    y_test: torch.Tensor
    classes: int
    tail: List[int]          # the 3 rarest training classes (7, 8, 9 on balanced sets)
    noisy: torch.Tensor      # bool [n]: the training labels that were replaced


def long_tail_counts(n_max, classes, imbalance):
    return [int(n_max * imbalance ** (-c / (classes - 1))) for c in range(classes)]


def available(name):
    """None if `name` can be loaded here, else why not (a line naming the fix)."""
    if name not in DATASETS:
        return f"unknown data set {name!r}; known: {', '.join(DATASETS)}"
    if name in FMNIST_SETS:
        missing = [f for f in _FMNIST_FILES.values() if not os.path.exists(
            os.path.join(FMNIST_DIR, f))]
        if missing:
            return (f"Fashion-MNIST not found in {FMNIST_DIR} (missing {missing[0]}): "
                    "apt-get install dataset-fashion-mnist (tools/install_deps.sh) or set "
                    "SAMPLERD_FASHION_MNIST")
        return None
    try:
        import sklearn  # noqa: F401
    except ImportError:
        return "scikit-learn is not installed: apt-get install python3-sklearn"
    return None


_FMNIST_FILES = {"x_train": "train-images-idx3-ubyte.gz", "y_train": "train-labels-idx1-ubyte.gz",
                 "x_test": "t10k-images-idx3-ubyte.gz", "y_test": "t10k-labels-idx1-ubyte.gz"}


def _read_idx(path):
    """An IDX file (the MNIST format): magic 0x0000 08 D, D big-endian u32 sizes, u8 data."""
    with gzip.open(path, "rb") as f:
        data = f.read()
    if data[:2] != b"\0\0" or data[2] != 8:
        raise ValueError(f"{path}: not an IDX file of unsigned bytes (magic {data[:4].hex()})")
    dims = data[3]
    shape = [int.from_bytes(data[4 + 4 * i:8 + 4 * i], "big") for i in range(dims)]
    return np.frombuffer(data, dtype=np.uint8, offset=4 + 4 * dims).reshape(shape)


_fmnist_cache = {}


def load_fmnist():
    """(x_train [60000, 196] float32: the images averaged over 2x2 pixels, standardised;
    y_train, x_test [10000, 196], y_test)."""
    if not _fmnist_cache:
        raw = {k: _read_idx(os.path.join(FMNIST_DIR, f)) for k, f in _FMNIST_FILES.items()}
        small = {k: raw[k].reshape(-1, 14, 2, 14, 2).mean(axis=(2, 4)).reshape(-1, 196) / 255.0
                 for k in ("x_train", "x_test")}
        mean, std = small["x_train"].mean(), small["x_train"].std()
        for k in ("x_train", "x_test"):
            _fmnist_cache[k] = ((small[k] - mean) / std).astype(np.float32)
        for k in ("y_train", "y_test"):
            _fmnist_cache[k] = raw[k].astype(np.int64)
    c = _fmnist_cache
    return c["x_train"], c["y_train"], c["x_test"], c["y_test"]


def _flip(y, classes, g):
    """Replaces NOISE of the labels by a random other class; returns (labels, flipped mask)."""
    y = y.copy()
    flip = g.random(len(y)) < NOISE
    y[flip] = (y[flip] + g.integers(1, classes, flip.sum())) % classes
    return y, flip


def make_dataset(name, seed):
    """The Split of data set `name` for `seed` (see the module doc)."""
    reason = available(name)
    if reason:
        raise ValueError(reason)
    g = np.random.default_rng(seed)
    if name.startswith("fmnist"):
        x_pool, y_pool, x_test, y_test = load_fmnist()
        classes, n_max, hold_max = 10, 5000, 1000
        train_counts = (long_tail_counts(n_max, classes, IMBALANCE) if name == "fmnist_lt"
                        else [n_max] * classes)
        hold_counts = (long_tail_counts(hold_max, classes, IMBALANCE) if name == "fmnist_lt"
                       else [hold_max] * classes)
        per_test = 200
    else:
        from sklearn.datasets import load_breast_cancer, load_digits
        x_test = y_test = None  # Drawn from the pool.
        if name.startswith("digits"):
            data = load_digits()
            x_pool, y_pool = (data.data / 16.0).astype(np.float32), data.target
            classes, per_test = 10, 44
            train_counts = (long_tail_counts(100, 10, IMBALANCE) if name == "digits_lt"
                            else [100] * 10)
        else:
            data = load_breast_cancer()
            x_pool = ((data.data - data.data.mean(0)) / data.data.std(0)).astype(np.float32)
            # Class 0 is malignant (212), 1 benign (357): the benign majority first.
            y_pool = 1 - data.target
            classes, per_test = 2, 80
            train_counts = [250, 5]
        share = HOLDOUT_SHARE[name.split("_")[0]]
        hold_counts = [max(1, math.ceil(share * n)) for n in train_counts]
    train, hold, test = [], [], []
    for c in range(classes):
        if y_test is not None:  # A test set of its own: per_test of each class.
            test.extend(g.permutation(np.flatnonzero(y_test == c))[:per_test])
        idx = g.permutation(np.flatnonzero(y_pool == c))
        if y_test is None:
            test.extend(idx[:per_test])
            idx = idx[per_test:]
        if len(idx) < train_counts[c] + hold_counts[c]:
            raise ValueError(f"{name}: class {c} has {len(idx)} samples, fewer than "
                             f"{train_counts[c]} + {hold_counts[c]}")
        train.extend(idx[:train_counts[c]])
        hold.extend(idx[train_counts[c]:train_counts[c] + hold_counts[c]])
    train, hold = g.permutation(np.array(train)), g.permutation(np.array(hold))
    y_train, y_hold = y_pool[train], y_pool[hold]
    flipped = np.zeros(len(train), dtype=bool)
    if name.endswith("_noisy"):
        y_train, flipped = _flip(y_train, classes, g)
        y_hold, _ = _flip(y_hold, classes, g)
    test = np.array(test)
    x_test, y_test = ((x_pool[test], y_pool[test]) if y_test is None
                      else (x_test[test], y_test[test]))
    tail = ([7, 8, 9] if len(set(train_counts)) == 1 else
            sorted(int(c) for c in np.argsort(train_counts, kind="stable")[:3]) if classes > 3
            else [int(np.argmin(train_counts))])
    t = torch.from_numpy
    return Split(t(np.ascontiguousarray(x_pool[train])), t(y_train.astype(np.int64)),
                 t(np.ascontiguousarray(x_pool[hold])), t(y_hold.astype(np.int64)),
                 t(np.ascontiguousarray(x_test)), t(np.asarray(y_test, dtype=np.int64)),
                 classes, tail, t(flipped))
