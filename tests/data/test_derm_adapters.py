"""fitzpatrick17k, isic2019, ddi: malignant vs benign, everything else unlabelled."""
import numpy as np
import pytest
from fixtures_derm import write_ddi, write_fitzpatrick17k, write_isic2019

from robustbench_fm.data import build_manifest
from robustbench_fm.data.files import DatasetError
from robustbench_fm.data.images import read_image


def test_fitzpatrick17k_partition_qc_and_source_site(tmp_path):
    write_fitzpatrick17k(tmp_path)
    m = build_manifest("fitzpatrick17k", tmp_path)
    assert len(m) == 5
    assert m["malignant"].iloc[:3].tolist() == [1.0, 1.0, 0.0]
    assert np.isnan(m["malignant"].iloc[3]) and np.isnan(m["malignant"].iloc[4])  # non-neoplastic; wrongly labelled
    assert m["site"].tolist() == ["www.dermaamin.com", "atlasdermatologico.com.br", "atlasdermatologico.com.br",
                                  "www.dermaamin.com", "unknown"]
    assert m["fitzpatrick_scale"].tolist() == [3, 1, 5, -1, 4] and m["bio_label"].iloc[0] == "melanoma"
    assert read_image(tmp_path, m.iloc[0].to_dict()).mode == "RGB"


def test_fitzpatrick17k_duplicate_hash_keeps_first_and_image_dir_option(tmp_path):
    write_fitzpatrick17k(tmp_path, image_dir="data/finalfitz17k", duplicate=True)
    m = build_manifest("fitzpatrick17k", tmp_path, image_dir="data/finalfitz17k")
    assert len(m) == 5 and m["path"].iloc[0].startswith("data/finalfitz17k/5e82a45b")
    with pytest.raises(FileNotFoundError, match="5 of 5 images missing"):
        build_manifest("fitzpatrick17k", tmp_path)


def test_isic2019_classes_lesion_groups_and_premalignant(tmp_path):
    write_isic2019(tmp_path)
    m = build_manifest("isic2019", tmp_path).set_index("sample_id")
    assert len(m) == 7 and m["bio_label"].tolist() == ["NV", "MEL", "MEL", "AK", "BCC", "SCC", "DF"]
    assert m["malignant"].fillna(-1).tolist() == [0, 1, 1, -1, 1, 1, 0]
    assert m.loc["isic_ISIC_0000001", "patient_id"] == m.loc["isic_ISIC_0000002", "patient_id"] == "isic_HAM_0000118"
    assert m.loc["isic_ISIC_0000003", "patient_id"] == "isic_ISIC_0000003"  # no lesion_id: the image
    assert m["path"].iloc[4] == "ISIC_2019_Training_Input/ISIC_0000004_downsampled.jpg"


def test_isic2019_without_metadata_and_bad_one_hot(tmp_path):
    write_isic2019(tmp_path, metadata=False)
    assert build_manifest("isic2019", tmp_path)["patient_id"].nunique() == 7
    gt = tmp_path / "ISIC_2019_Training_GroundTruth.csv"
    gt.write_text(gt.read_text().replace("ISIC_0000006,0.0", "ISIC_0000006,1.0"))
    with pytest.raises(ValueError, match=r"row 6 \(ISIC_0000006\) has 2 classes set") as err:
        build_manifest("isic2019", tmp_path)
    assert isinstance(err.value, DatasetError) and str(err.value).startswith(f"dataset 'isic2019': {gt}: row 6")


def test_ddi_boolean_labels_and_unnamed_index(tmp_path):
    write_ddi(tmp_path)
    m = build_manifest("ddi", tmp_path)
    assert m["malignant"].tolist() == [1.0, 0.0, 0.0, 1.0] and m["skin_tone"].tolist() == [56, 12, 34, 56]
    assert m["sample_id"].tolist()[0] == "ddi_1" and m["path"].tolist()[0] == "000001.png"
    assert "Unnamed: 0" not in m.columns and read_image(tmp_path, m.iloc[1].to_dict()).mode == "RGB"
