"""Chest adapters on miniature official layouts (chest_fixtures.py): exact rows, views, labels, boxes."""
from __future__ import annotations

import shutil

import numpy as np
import pandas as pd
import pytest
from chest_fixtures import (
    MIMIC_IMAGES,
    write_chexpert,
    write_mimic_cxr,
    write_ms_cxr,
    write_nih_cxr14,
    write_openi,
    write_padchest,
    write_rsna_pneumonia,
    write_vindr_cxr,
    write_vindr_pcxr,
)

from robustbench_fm.data import build_manifest, get
from robustbench_fm.data.chest.common import ChestDataError
from robustbench_fm.data.images import read_image
from robustbench_fm.data.manifest import CHEST_FINDINGS

NAN = np.nan
CHEST = ["mimic_cxr", "chexpert", "padchest", "vindr_cxr", "vindr_pcxr", "openi", "rsna_pneumonia",
         "ms_cxr", "nih_cxr14"]


def _row(df: pd.DataFrame, sample_id: str) -> pd.Series:
    return df.set_index("sample_id").loc[sample_id]


def _labels(row: pd.Series, **expected) -> None:
    """``expected`` findings equal; every other finding NaN."""
    got = {f: row[f] for f in CHEST_FINDINGS}
    want = {f: float(expected.get(f, NAN)) for f in CHEST_FINDINGS}
    assert pd.Series(got).equals(pd.Series(want)), f"{got} != {want}"


def test_all_chest_adapters_registered_with_access_notes():
    for name in CHEST:
        adapter = get(name)
        assert adapter.access and adapter.licence and adapter.citation and adapter.findings


@pytest.fixture(scope="module")
def mimic_root(tmp_path_factory):
    return write_ms_cxr(write_mimic_cxr(tmp_path_factory.mktemp("mimic-cxr-jpg") / "2.1.0"))


def test_mimic_cxr(mimic_root):
    df = build_manifest("mimic_cxr", mimic_root)
    assert len(df) == 7 and df["patient_id"].nunique() == 4
    assert df["view"].tolist() == ["PA", "LATERAL", "AP", "AP", "LATERAL", "UNKNOWN", "SWIMMERS"]
    assert df["split"].tolist() == ["train", "train", "train", "val", "val", "test", "train"]
    assert df["acq_group"].iloc[0] == "mimic_cxr_PA" and (df["site"] == "mimic_cxr").all()
    first = _row(df, MIMIC_IMAGES[0][0])
    assert first["path"] == f"files/p10/p10000032/s50414267/{MIMIC_IMAGES[0][0]}.jpg"
    _labels(first, **dict.fromkeys(CHEST_FINDINGS, 0))  # No Finding = 1 -> every blank negative
    _labels(_row(df, MIMIC_IMAGES[2][0]), pneumothorax=1, edema=0)  # effusion -1 -> NaN
    _labels(_row(df, MIMIC_IMAGES[3][0]), lung_opacity=1)  # pneumonia -1 -> NaN
    _labels(_row(df, MIMIC_IMAGES[5][0]), cardiomegaly=1, fracture=0)
    _labels(_row(df, MIMIC_IMAGES[6][0]))  # study without a labeler row: unlabelled
    pos = build_manifest("mimic_cxr", mimic_root, uncertain="positive")
    _labels(_row(pos, MIMIC_IMAGES[2][0]), pneumothorax=1, edema=0, pleural_effusion=1)
    neg = build_manifest("mimic_cxr", mimic_root, uncertain="negative", views=["AP"])
    assert neg["view"].tolist() == ["AP", "AP"]
    _labels(_row(neg, MIMIC_IMAGES[3][0]), lung_opacity=1, pneumonia=0)


def test_ms_cxr_boxes_on_mimic_images(mimic_root):
    df = build_manifest("ms_cxr", mimic_root)
    assert df["sample_id"].tolist() == [MIMIC_IMAGES[0][0], MIMIC_IMAGES[2][0]]
    assert df["view"].tolist() == ["PA", "AP"] and df["acq_group"].tolist() == ["mimic_cxr_PA", "mimic_cxr_AP"]
    assert df["patient_id"].tolist() == ["10000032", "10000032"] and df["split"].tolist() == ["test", "train"]
    first = df.iloc[0]
    _labels(first, pneumothorax=1, pleural_effusion=1)  # MS-CXR has no negatives
    # two pneumothorax boxes (1800,200,400,300) and (1700,400,200,500) on a 2544x3056 image
    assert first[["box_x0", "box_y0", "box_x1", "box_y1"]].tolist() == pytest.approx(
        [1700 / 2544, 200 / 3056, 2200 / 2544, 900 / 3056])
    assert first["n_boxes"] == 2 and np.isnan(df.iloc[1]["box_x0"])
    heart = build_manifest("ms_cxr", mimic_root, box_finding="cardiomegaly").iloc[1]
    assert heart[["box_x0", "box_y0", "box_x1", "box_y1"]].tolist() == pytest.approx(
        [900 / 2544, 1500 / 3056, 2100 / 2544, 2400 / 3056])
    with pytest.raises(ChestDataError, match="box_finding"):
        build_manifest("ms_cxr", mimic_root, box_finding="fracture")


def test_chexpert(tmp_path):
    root = write_chexpert(tmp_path / "CheXpert-v1.0-small")
    df = build_manifest("chexpert", root)
    assert df["sample_id"].iloc[0] == "patient00001_study1_view1_frontal"
    assert df["path"].iloc[0] == "train/patient00001/study1/view1_frontal.jpg"
    assert df["view"].tolist() == ["AP", "AP", "LATERAL", "PA", "LATERAL", "AP"]
    assert df["split"].tolist() == ["train"] * 5 + ["val"] and df["patient_id"].nunique() == 5
    _labels(df.iloc[0], **dict.fromkeys(CHEST_FINDINGS, 0))
    _labels(df.iloc[1], lung_opacity=1, fracture=1)
    _labels(df.iloc[2], pneumothorax=0, pleural_effusion=1)
    _labels(df.iloc[3], pneumothorax=1)
    _labels(df.iloc[5], **dict.fromkeys(CHEST_FINDINGS, 0) | {"edema": 1})
    pos = build_manifest("chexpert", root, uncertain="positive")
    _labels(pos.iloc[1], lung_opacity=1, fracture=1, cardiomegaly=1, edema=1)
    _labels(pos.iloc[3], pneumothorax=1, atelectasis=1)
    with pytest.raises(ChestDataError, match="option 'uncertain'"):
        build_manifest("chexpert", root, uncertain="maybe")


def test_padchest(tmp_path):
    root = write_padchest(tmp_path / "padchest")
    df = build_manifest("padchest", root)
    assert len(df) == 6 and df["patient_id"].nunique() == 5
    assert df["path"].iloc[0] == "0/20536686640136348236148679891455886468_k6ga29.png"
    assert df["view"].tolist() == ["PA", "LATERAL", "AP", "AP", "COSTAL", "UNKNOWN"]
    assert df["split"].isna().all()
    _labels(df.iloc[0], **dict.fromkeys(CHEST_FINDINGS, 0))
    zero = dict.fromkeys(CHEST_FINDINGS, 0)
    _labels(df.iloc[1], **zero | {"pleural_effusion": 1, "cardiomegaly": 1})  # ' cardiomegaly' stripped
    _labels(df.iloc[2], **zero | {"pneumothorax": 1})  # pericardial effusion, pseudonodule unmapped
    _labels(df.iloc[3], **zero | {"fracture": 1, "lung_opacity": 1, "lung_lesion": 1, "pleural_other": 1})
    _labels(df.iloc[4])  # empty Labels cell: unlabelled
    _labels(df.iloc[5], **zero | {"enlarged_cardiomediastinum": 1, "consolidation": 1, "lung_opacity": 1})
    flat = build_manifest("padchest", root, verify_images=False, layout="flat")
    assert flat["path"].iloc[0] == "20536686640136348236148679891455886468_k6ga29.png"


def test_padchest_bad_list_cell_names_file_and_row(tmp_path):
    root = write_padchest(tmp_path / "padchest")
    csv = root / "PADCHEST_chest_x_ray_images_labels_160K_01.02.19.csv.gz"
    table = pd.read_csv(csv)
    table.loc[2, "Labels"] = "['pneumonia'"
    table.to_csv(csv, index=False)
    with pytest.raises(ChestDataError, match=r"column 'Labels', row 2"):
        build_manifest("padchest", root)


def test_nih_cxr14_bracketed_header(tmp_path):
    root = write_nih_cxr14(tmp_path / "nih")
    df = build_manifest("nih_cxr14", root)
    assert df["path"].tolist()[:2] == ["images/00000001_000.png", "images/00000001_001.png"]
    assert df["patient_id"].tolist() == ["1", "1", "2", "3", "3"]
    assert df["view"].tolist() == ["PA", "PA", "AP", "PA", "AP"]
    assert df["split"].tolist() == ["train", "train", "train", "test", "test"]
    nine = dict.fromkeys(["pneumothorax", "pneumonia", "consolidation", "edema", "lung_lesion", "pleural_effusion",
                          "cardiomegaly", "atelectasis", "pleural_other"], 0)
    _labels(df.iloc[0], **nine | {"cardiomegaly": 1})
    _labels(df.iloc[2], **nine)
    _labels(df.iloc[3], **nine | {"lung_lesion": 1, "pleural_other": 1})
    _labels(df.iloc[4], **nine | {"pneumothorax": 1, "pleural_effusion": 1})


def test_rsna_pneumonia_views_from_dicom_and_boxes(tmp_path):
    root = write_rsna_pneumonia(tmp_path / "rsna")
    df = build_manifest("rsna_pneumonia", root)
    assert len(df) == 4 and df["view"].tolist() == ["PA", "AP", "PA", "AP"]
    assert df["pneumonia"].tolist() == [0.0, 1.0, 1.0, 0.0]
    assert df["path"].iloc[0] == "stage_2_train_images/0004cfab-14fd-4e49-80ba-63a80b6bddd6.dcm"
    two = df.iloc[1]  # boxes (264,152,213,379) and (562,152,256,453) on 1024x1024
    assert two[["box_x0", "box_y0", "box_x1", "box_y1"]].tolist() == pytest.approx(
        [264 / 1024, 152 / 1024, 818 / 1024, 605 / 1024])
    assert two["n_boxes"] == 2 and df["box_x0"].notna().tolist() == [False, True, True, False]
    shutil.rmtree(root / "stage_2_train_images")  # label file alone: no view, boxes by the native 1024
    labels_only = build_manifest("rsna_pneumonia", root, verify_images=False)
    assert (labels_only["view"] == "UNKNOWN").all()
    assert labels_only["box_x1"].tolist()[1] == pytest.approx(818 / 1024)


def test_vindr_cxr_readers_and_boxes(tmp_path):
    root = write_vindr_cxr(tmp_path / "vindr-cxr" / "1.0.0")
    df = build_manifest("vindr_cxr", root)
    assert len(df) == 5 and (df["view"] == "PA").all() and df["patient_id"].nunique() == 5
    assert df["split"].tolist() == ["train"] * 3 + ["test"] * 2
    assert df["path"].iloc[0] == "train/000434271f63a053c4128a0ba6352c7f.dicom"
    eleven = dict.fromkeys(get("vindr_cxr").findings, 0)
    _labels(df.iloc[0], **eleven)
    _labels(df.iloc[1], **eleven | {"pneumothorax": 1, "lung_lesion": 1, "lung_opacity": 1})
    _labels(df.iloc[2], **eleven | {"fracture": 1})
    _labels(df.iloc[3], **eleven | {"pneumonia": 1, "pleural_effusion": 1})
    # pneumothorax boxes of R8 (1500,300,1900,900) and R9 (1450,350,1850,1000) on a 2500x2000 image
    box = df.iloc[1][["box_x0", "box_y0", "box_x1", "box_y1"]].tolist()
    assert box == pytest.approx([1450 / 2500, 300 / 2000, 1900 / 2500, 1000 / 2000])
    assert df["box_x0"].notna().sum() == 1
    majority = build_manifest("vindr_cxr", root, readers="majority", box_finding="lung_opacity")
    _labels(majority.iloc[1], **eleven | {"pneumothorax": 1})  # 2 of 3 readers; the others 1 of 3
    _labels(majority.iloc[2], **eleven)
    assert majority["box_x0"].isna().all()  # lung opacity not a majority finding: no box
    any_opacity = build_manifest("vindr_cxr", root, box_finding="lung_opacity").iloc[1]
    assert any_opacity[["box_x0", "box_y1"]].tolist() == pytest.approx([300 / 2500, 1200 / 2000])


def test_vindr_pcxr(tmp_path):
    root = write_vindr_pcxr(tmp_path / "vindr-pcxr")
    df = build_manifest("vindr_pcxr", root)
    assert df["split"].tolist() == ["train"] * 3 + ["test"] and df["acq_group"].iloc[0] == "vindr_pcxr_PA"
    assert df["pneumonia"].tolist() == [1.0, 0.0, 0.0, 0.0]
    assert df["lung_lesion"].tolist() == [0.0, 0.0, 0.0, 1.0]
    assert df["pneumothorax"].isna().all()


def test_openi_reports_and_dicom_views(tmp_path):
    root = write_openi(tmp_path / "openi")
    df = build_manifest("openi", root)
    assert len(df) == 6 and df["patient_id"].tolist() == ["CXR1", "CXR1", "CXR2", "CXR2", "CXR3", "CXR4"]
    assert df["view"].tolist() == ["PA", "LATERAL", "PA", "LATERAL", "UNKNOWN", "AP"]
    assert df["path"].iloc[0] == "NLMCXR_png/CXR1_1_IM-0001-3001.png"
    # Only terms that occur in the reports can be negative; here pneumothorax etc. never occur.
    present = dict.fromkeys(["cardiomegaly", "atelectasis", "pleural_other", "lung_opacity", "fracture"], 0)
    _labels(_row(df, "CXR1_1_IM-0001-3001"), **present)
    _labels(_row(df, "CXR2_IM-0652-1001"), **present | {"cardiomegaly": 1, "atelectasis": 1, "pleural_other": 1})
    _labels(_row(df, "CXR3_IM-1384-1001"), **present | {"lung_opacity": 1, "fracture": 1})  # not mediastinal thickening
    _labels(_row(df, "CXR4_IM-2050-1001"))  # 'No Indexing': unlabelled


@pytest.mark.parametrize("name,writer", [("vindr_cxr", write_vindr_cxr), ("rsna_pneumonia", write_rsna_pneumonia),
                                         ("openi", write_openi), ("padchest", write_padchest)])
def test_manifest_paths_decode(tmp_path, name, writer):
    """Every image the manifest points at opens with the shared reader (DICOM MONOCHROME1 included)."""
    root = writer(tmp_path / name)
    for row in build_manifest(name, root).to_dict("records"):
        assert read_image(root, row).mode == "L"


def test_missing_image_and_missing_label_file(tmp_path):
    root = write_nih_cxr14(tmp_path / "nih")
    (root / "images" / "00000002_000.png").unlink()
    with pytest.raises(FileNotFoundError, match="1 of 5 images missing"):
        build_manifest("nih_cxr14", root)
    assert len(build_manifest("nih_cxr14", root, verify_images=False)) == 5
    (root / "Data_Entry_2017_v2020.csv").unlink()
    with pytest.raises(ChestDataError, match="Data_Entry_2017_v2020.csv"):
        build_manifest("nih_cxr14", root)


def test_nih_cxr14_kaggle_mirror_folders(tmp_path):
    root = write_nih_cxr14(tmp_path / "nih")
    (root / "images_001").mkdir()
    (root / "images").rename(root / "images_001" / "images")
    df = build_manifest("nih_cxr14", root)
    assert df["path"].iloc[0] == "images_001/images/00000001_000.png"


def test_unreadable_dicom_header_names_the_file(tmp_path):
    root = write_rsna_pneumonia(tmp_path / "rsna")
    bad = root / "stage_2_train_images" / "00704310-78a8-4b38-8475-49f4573b2dbb.dcm"
    bad.write_bytes(b"not a dicom file")
    with pytest.raises(ChestDataError, match="00704310-78a8-4b38-8475-49f4573b2dbb.dcm: not a readable DICOM"):
        build_manifest("rsna_pneumonia", root)


def test_mapping_file_is_complete_and_documented():
    from robustbench_fm.data.chest.common import FINDINGS_FILE

    table = pd.read_csv(FINDINGS_FILE, dtype=str, keep_default_na=False)
    assert list(table.columns) == ["dataset", "source_label", "finding", "note"]
    assert set(table["dataset"]) == set(CHEST) and set(table["finding"]) <= set(CHEST_FINDINGS)
    assert not table.duplicated(["dataset", "source_label", "finding"]).any()
    assert (table["note"].str.len() > 0).all()
    # MIMIC and CheXpert carry all 12 findings (candor.md: "the only sites with all 12 findings")
    assert get("mimic_cxr").findings == get("chexpert").findings == CHEST_FINDINGS
