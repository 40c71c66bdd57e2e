"""nct_crc and pcam build the canonical manifest from miniature official layouts."""
import numpy as np
import pytest
from fixtures_pathology import pcam_patch, write_nct_crc, write_pcam

from robustbench_fm.data import build_manifest
from robustbench_fm.data.images import read_image


def test_nct_crc_tiles_classes_splits_and_tumour(tmp_path):
    write_nct_crc(tmp_path)
    m = build_manifest("nct_crc", tmp_path)
    assert len(m) == 11
    assert m.groupby("split").size().to_dict() == {"test": 5, "train": 6}
    assert int(m["tumour"].sum()) == 5 and set(m.loc[m["tumour"] == 1, "bio_label"]) == {"TUM"}
    assert set(m["acq_group"]) == {"nct_crc"} and m["patient_id"].is_unique
    row = m[m["bio_label"] == "TUM"].iloc[0].to_dict()
    assert row["path"].endswith(".tif") and row["path"].split("/")[1] == "TUM"
    assert read_image(tmp_path, row).mode == "RGB"


def test_nct_crc_subset_option_and_errors(tmp_path):
    write_nct_crc(tmp_path)
    m = build_manifest("nct_crc", tmp_path, subsets=["CRC-VAL-HE-7K"])
    assert len(m) == 5 and set(m["site"]) == {"CRC-VAL-HE-7K"}
    with pytest.raises(FileNotFoundError, match="NCT-CRC-HE-100K-NONORM"):
        build_manifest("nct_crc", tmp_path, subsets=["NCT-CRC-HE-100K-NONORM"])
    (tmp_path / "CRC-VAL-HE-7K" / "tumor").mkdir()
    with pytest.raises(ValueError, match="tumor' is not one of the 9 classes"):
        build_manifest("nct_crc", tmp_path)


def test_pcam_labels_slides_and_lazy_rows(tmp_path):
    write_pcam(tmp_path)
    m = build_manifest("pcam", tmp_path, verify_images=False)
    assert len(m) == 13 and m.groupby("split").size().to_dict() == {"test": 4, "train": 6, "val": 3}
    assert m.groupby("split")["tumour"].sum().to_dict() == {"test": 1.0, "train": 3.0, "val": 2.0}
    assert m["slide_id"].iloc[0] == "camelyon16_train_tumor_000"
    assert m["patient_id"].nunique() == 6  # two slides per split
    row = m[(m["split"] == "val")].iloc[2].to_dict()
    assert row["path"] == "camelyonpatch_level_2_split_valid_x.h5#2"
    assert np.array_equal(np.asarray(read_image(tmp_path, row)), pcam_patch("valid", 2))


def test_pcam_without_meta_and_gzipped_files(tmp_path):
    write_pcam(tmp_path, meta=False)
    m = build_manifest("pcam", tmp_path, verify_images=False, splits=["test"])
    assert len(m) == 4 and "slide_id" not in m.columns and m["patient_id"].is_unique
    (tmp_path / "camelyonpatch_level_2_split_train_y.h5").rename(tmp_path / "camelyonpatch_level_2_split_train_y.h5.gz")
    with pytest.raises(FileNotFoundError, match="gunzip"):
        build_manifest("pcam", tmp_path, verify_images=False)


def test_bad_options_and_gzipped_files_are_user_errors_naming_the_fix(tmp_path):
    from robustbench_fm.core.errors import UserError
    from robustbench_fm.data.files import DatasetError, DatasetFileMissing

    write_nct_crc(tmp_path / "nct")
    with pytest.raises(DatasetError) as err:
        build_manifest("nct_crc", tmp_path / "nct", subsets=["CRC-VAL"])
    assert isinstance(err.value, (UserError, ValueError))
    assert str(err.value) == ("dataset 'nct_crc': unknown subset 'CRC-VAL'; use NCT-CRC-HE-100K, "
                              "NCT-CRC-HE-100K-NONORM, CRC-VAL-HE-7K")
    write_pcam(tmp_path / "pcam")
    y = tmp_path / "pcam" / "camelyonpatch_level_2_split_test_y.h5"
    y.rename(y.with_name(y.name + ".gz"))
    with pytest.raises(DatasetFileMissing) as err:
        build_manifest("pcam", tmp_path / "pcam", verify_images=False, splits=["test"])
    assert isinstance(err.value, (UserError, FileNotFoundError))
    assert str(err.value) == f"dataset 'pcam': '{y}' is still gzipped; run gunzip on the .h5.gz files"
