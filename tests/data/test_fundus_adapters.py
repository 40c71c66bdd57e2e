"""fairvision, aptos, messidor2, idrid: labels, splits, quirks of the official files, lesion boxes."""
import numpy as np
import pandas as pd
import pytest
from fixtures_fundus import write_aptos, write_fairvision, write_idrid, write_messidor2

from robustbench_fm.data import build_manifest
from robustbench_fm.data.images import locator_file, read_image, read_mask


def test_fairvision_glaucoma_from_the_summary_and_slo_from_the_npz(tmp_path):
    write_fairvision(tmp_path)
    m = build_manifest("fairvision", tmp_path, verify_images=False)  # registry: '#' locators (see note)
    assert all((tmp_path / locator_file(p)).is_file() for p in m["path"])
    assert len(m) == 6 and m["glaucoma"].tolist() == [1, 0, 1, 0, 1, 0]
    assert m["referable_dr"].isna().all() and set(m["acq_group"]) == {"fairvision"}
    assert m.groupby("split").size().to_dict() == {"test": 2, "train": 3, "val": 1}
    row = m.iloc[3].to_dict()
    assert row["path"] == "Glaucoma/Validation/data_06001.npz#slo_fundus" and row["race"] == "Asian"
    im = read_image(tmp_path, row)
    assert im.mode == "L" and im.size == (20, 20) and np.asarray(im).max() == 33


def test_fairvision_dr_cohort_reads_dr_subtype_and_renamed_folders(tmp_path):
    write_fairvision(tmp_path)
    (tmp_path / "Glaucoma" / "Training").rename(tmp_path / "Glaucoma" / "train")  # the README's renaming
    m = build_manifest("fairvision", tmp_path, verify_images=False, diseases=["Glaucoma", "DR"])
    assert len(m) == 10 and m["path"].iloc[0].startswith("Glaucoma/train/data_00001.npz")
    dr = m[m["sample_id"].str.startswith("dr_")]
    assert dr["referable_dr"].tolist()[:3] == [1.0, 0.0, 1.0] and np.isnan(dr["referable_dr"].iloc[3])
    assert dr["glaucoma"].isna().all()
    with pytest.raises(ValueError, match="disease 'AMD' has no CANDOR task"):
        build_manifest("fairvision", tmp_path, verify_images=False, diseases=["AMD"])


def test_aptos_referable_is_grade_two_or_more(tmp_path):
    write_aptos(tmp_path)
    m = build_manifest("aptos", tmp_path)
    assert len(m) == 6 and m["referable_dr"].tolist() == [1, 1, 0, 0, 0, 1]
    assert m["bio_label"].tolist()[:2] == ["grade_2", "grade_4"] and set(m["split"]) == {"train"}
    assert m["path"].iloc[0] == "train_images/000c1434d8d7.png"


def test_messidor2_case_insensitive_files_and_ungradable(tmp_path):
    write_messidor2(tmp_path)
    m = build_manifest("messidor2", tmp_path)
    assert len(m) == 5 and m["path"].tolist()[2] == "IMAGES/IM002385.JPG"  # CSV says .jpg
    assert m["referable_dr"].iloc[:4].tolist() == [0, 1, 1, 0] and np.isnan(m["referable_dr"].iloc[4])
    assert m["dme"].iloc[2] == 1 and read_image(tmp_path, m.iloc[4].to_dict()).mode == "RGB"


def test_messidor2_reupload_header_and_missing_columns(tmp_path):
    write_messidor2(tmp_path)
    csv = tmp_path / "messidor_data.csv"
    table = pd.read_csv(csv).rename(columns={"image_id": "id_code", "adjudicated_dr_grade": "diagnosis"})
    table.to_csv(csv, index=False)
    assert build_manifest("messidor2", tmp_path)["referable_dr"].sum() == 2
    table.drop(columns="diagnosis").to_csv(csv, index=False)
    with pytest.raises(ValueError, match="grade column"):
        build_manifest("messidor2", tmp_path)


def test_idrid_grading_two_csvs_with_trailing_columns(tmp_path):
    write_idrid(tmp_path)
    m = build_manifest("idrid", tmp_path)
    assert len(m) == 5 and m["sample_id"].is_unique  # IDRiD_001 exists in train and test
    assert m["referable_dr"].tolist() == [1, 0, 1, 1, 0]
    assert m["path"].iloc[3] == "B. Disease Grading/1. Original Images/b. Testing Set/IDRiD_001.jpg"


def test_idrid_segmentation_masks_and_union_boxes(tmp_path):
    write_idrid(tmp_path)
    m = build_manifest("idrid", tmp_path, part="segmentation").set_index("sample_id")
    assert list(m.index) == ["idrid_seg_train_IDRiD_01", "idrid_seg_train_IDRiD_02", "idrid_seg_test_IDRiD_55"]
    first = m.loc["idrid_seg_train_IDRiD_01"]
    assert (first["microaneurysms"], first["hard_exudates"], first["haemorrhages"]) == (1.0, 1.0, 0.0)
    assert np.isnan(first["mask_haemorrhages"]) and first["mask_microaneurysms"].endswith("IDRiD_01_MA.tif")
    assert read_mask(tmp_path / first["mask_microaneurysms"]).sum() == 4
    assert [first[c] for c in ("box_x0", "box_y0", "box_x1", "box_y1")] == [0.05, 0.125, 0.25, 0.75]
    assert m.loc["idrid_seg_train_IDRiD_02", ["box_x1", "box_y1"]].tolist() == [0.05, 0.0625]
    assert m.loc["idrid_seg_test_IDRiD_55", ["box_x0", "box_y1"]].isna().all()
    with pytest.raises(ValueError, match="part 'localization' unknown"):
        build_manifest("idrid", tmp_path, part="localization")


def test_an_unknown_part_is_a_user_error_naming_the_option(tmp_path):
    from robustbench_fm.core.errors import UserError
    from robustbench_fm.data.files import DatasetError, DatasetFileMissing

    write_idrid(tmp_path)
    with pytest.raises(DatasetError) as err:
        build_manifest("idrid", tmp_path, part="grade")
    assert isinstance(err.value, (UserError, ValueError))
    assert str(err.value) == "dataset 'idrid': part 'grade' unknown; use grading or segmentation"
    (tmp_path / "empty").mkdir()
    with pytest.raises(DatasetFileMissing) as err:
        build_manifest("idrid", tmp_path / "empty", part="segmentation")  # the root exists, the images do not
    assert isinstance(err.value, (UserError, FileNotFoundError))
    folder = tmp_path / "empty" / "A. Segmentation" / "1. Original Images" / "a. Training Set"
    assert str(err.value) == (f"dataset 'idrid': '{folder}' not found; unzip 'A. Segmentation' of IDRiD under "
                              "dataset.root")
