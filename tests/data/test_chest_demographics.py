"""Issue 55 item 4: the chest adapters' metadata the confounder scan reads (``sex``, ``age``, ``manufacturer``),
from what each release has: PadChest's CSV, RSNA's and VinDr's DICOM headers (written here with pydicom),
MIMIC-CXR with MIMIC-IV's patients table. Exact manifest values, including the blanks."""
from __future__ import annotations

import gzip
import shutil

import numpy as np
import pandas as pd
import pytest
from chest_fixtures import (
    MIMIC_IMAGES,
    PCXR_TEST,
    PCXR_TRAIN,
    RSNA_VIEWS,
    VINDR_SIZE,
    VINDR_TEST,
    VINDR_TRAIN,
    write_dicom,
    write_mimic_cxr,
    write_padchest,
    write_rsna_pneumonia,
    write_vindr_cxr,
    write_vindr_pcxr,
)

from robustbench_fm.data import build_manifest
from robustbench_fm.data.chest.common import ChestDataError, birth_year_age, dicom_age, sex_of, text_of
from robustbench_fm.methods.confounders import stage as confounders

NAN = np.nan
PADCHEST_CSV = "PADCHEST_chest_x_ray_images_labels_160K_01.02.19.csv.gz"


def _same(got: pd.Series, want: list) -> None:
    """Equal values, NaN where ``want`` has NaN (object or float)."""
    assert len(got) == len(want)
    for g, w in zip(got.tolist(), want):
        assert (pd.isna(g) and pd.isna(w)) or g == w, f"{got.tolist()} != {want}"


def test_dicom_age_reads_the_age_string_in_years():
    got = dicom_age(pd.Series(["058Y", "006M", "026W", "073D", "51", 43, 43.0, " 045Y ", "058y",
                               "000Y", "000D", "", None, "58 years", "150Y", "-3Y"], dtype=object))
    want = [58.0, 0.5, 26 * 7 / 365.25, 73 / 365.25, 51.0, 43.0, 43.0, 45.0, 58.0] + [NAN] * 7
    assert got.tolist() == pytest.approx(want, nan_ok=True, rel=1e-12)
    # a paediatric release keeps a zero age (a newborn imaged on its first day)
    assert dicom_age(pd.Series(["000D", "000Y", "006M"]), zero_is_blank=False).tolist() == [0.0, 0.0, 0.5]


def test_birth_year_age_sex_codes_and_text():
    birth = pd.Series([1950.0, 1930.0, NAN, 1950.0, 2020.0, 2009.0])
    study = pd.Series([20150312, "20141231", 20150312, "2015031", 20150101, "20090301"], dtype=object)
    _same(birth_year_age(birth, study), [65.0, 84.0, NAN, NAN, NAN, 0.0])  # malformed date, born after: blank
    _same(sex_of(pd.Series(["M", "F", "O", NAN, "", "Female", "male"])),
          ["male", "female", NAN, NAN, NAN, "female", "male"])
    _same(text_of(pd.Series([" SIEMENS ", "", None, NAN, "GE"])), ["SIEMENS", NAN, NAN, NAN, "GE"])


def _padchest_metadata(root, drop=()):
    csv = root / PADCHEST_CSV
    table = pd.read_csv(csv, index_col=0)
    table["PatientSex_DICOM"] = ["M", "F", "O", NAN, "M", "F"]
    table["PatientBirth"] = [1950.0, 1950.0, 1930.0, NAN, 2009.0, 1904.0]
    table["StudyDate_DICOM"] = [20150312, 20150312, 20141231, 20150101, 20090301, 20171117]
    table["Manufacturer_DICOM"] = [" PhilipsMedicalSystems ", "PhilipsMedicalSystems", "ImagingDynamicsCompanyLtd",
                                   NAN, "", "ImagingDynamicsCompanyLtd"]
    table.drop(columns=list(drop)).to_csv(csv, index=True)


def test_padchest_sex_age_and_manufacturer_from_its_csv(tmp_path):
    root = write_padchest(tmp_path / "padchest")
    _padchest_metadata(root)
    df = build_manifest("padchest", root)
    _same(df["sex"], ["male", "female", NAN, NAN, "male", "female"])  # O = other: blank
    _same(df["age"], [65.0, 65.0, 84.0, NAN, 0.0, 113.0])  # study year - birth year
    _same(df["manufacturer"], ["PhilipsMedicalSystems", "PhilipsMedicalSystems", "ImagingDynamicsCompanyLtd",
                               NAN, NAN, "ImagingDynamicsCompanyLtd"])
    assert df["view"].tolist() == ["PA", "LATERAL", "AP", "AP", "COSTAL", "UNKNOWN"]  # unchanged


def test_padchest_older_copy_without_a_column_builds_without_it(tmp_path):
    root = write_padchest(tmp_path / "padchest")
    _padchest_metadata(root, drop=("PatientBirth", "Manufacturer_DICOM"))
    df = build_manifest("padchest", root)
    assert "age" not in df.columns and "manufacturer" not in df.columns
    _same(df["sex"], ["male", "female", NAN, NAN, "male", "female"])


RSNA_TAGS = [{"PatientSex": "M", "PatientAge": "51"}, {"PatientSex": "F", "PatientAge": "8"},
             {"PatientSex": "O", "PatientAge": "155"}, {}]  # in RSNA_VIEWS' order; 155 is an error: blank


@pytest.mark.filterwarnings("ignore:Invalid value for VR AS")  # pydicom on writing RSNA's bare '51'
def test_rsna_sex_and_age_from_dicom_headers(tmp_path):
    root = write_rsna_pneumonia(tmp_path / "rsna")
    for (pid, view), tags in zip(RSNA_VIEWS.items(), RSNA_TAGS):
        write_dicom(root / "stage_2_train_images" / f"{pid}.dcm", 1024, 1024, view=view, patient_id=pid, bits=8,
                    tags=tags)
    df = build_manifest("rsna_pneumonia", root)
    assert df["sample_id"].tolist() == list(RSNA_VIEWS) and df["view"].tolist() == ["PA", "AP", "PA", "AP"]
    _same(df["sex"], ["male", "female", NAN, NAN])
    _same(df["age"], [51.0, 8.0, NAN, NAN])


def test_rsna_sex_and_age_from_the_headers_table(tmp_path):
    root = write_rsna_pneumonia(tmp_path / "rsna")
    shutil.rmtree(root / "stage_2_train_images")
    ids = list(RSNA_VIEWS)
    table = pd.DataFrame({"PatientID": ids, "ViewPosition": list(RSNA_VIEWS.values()),
                          "PatientSex": ["F", "M", "M", NAN], "PatientAge": [43, 148, 62, 7]})
    table.to_csv(tmp_path / "headers.csv.gz", index=False)
    df = build_manifest("rsna_pneumonia", root, verify_images=False, headers=str(tmp_path / "headers.csv.gz"))
    _same(df["sex"], ["female", "male", "male", NAN])
    _same(df["age"], [43.0, NAN, 62.0, 7.0])
    table.drop(columns=["PatientSex", "PatientAge"]).to_csv(tmp_path / "views.csv", index=False)
    views_only = build_manifest("rsna_pneumonia", root, verify_images=False, headers=str(tmp_path / "views.csv"))
    assert "sex" not in views_only.columns and "age" not in views_only.columns
    assert views_only["view"].tolist() == ["PA", "AP", "PA", "AP"]


VINDR_TAGS = [  # train images then test images, in the fixture's order
    {"PatientSex": "M", "PatientAge": "058Y", "Manufacturer": " SIEMENS "},
    {"PatientSex": "F", "PatientAge": "000Y", "Manufacturer": "Carestream Health"},  # 000Y in an adult release
    {"PatientSex": "O", "PatientAge": ""},
    {"PatientSex": "F", "PatientAge": "045Y", "Manufacturer": "SIEMENS"},
]


def test_vindr_cxr_sex_age_and_manufacturer_from_dicom_headers(tmp_path):
    root = write_vindr_cxr(tmp_path / "vindr-cxr" / "1.0.0")
    images = [("train", i) for i in VINDR_TRAIN] + [("test", i) for i in VINDR_TEST]
    for n, ((split, image), tags) in enumerate(zip(images, VINDR_TAGS)):
        rows, columns = VINDR_SIZE if n == 1 else (256, 200)
        write_dicom(root / split / f"{image}.dicom", rows, columns, view=None, bits=14, tags=tags)
    (root / "test" / f"{images[-1][1]}.dicom").unlink()  # an absent file: blank
    df = build_manifest("vindr_cxr", root, verify_images=False)
    assert df["sample_id"].tolist() == [i for _, i in images]
    _same(df["sex"], ["male", "female", NAN, "female", NAN])
    _same(df["age"], [58.0, NAN, NAN, 45.0, NAN])
    _same(df["manufacturer"], ["SIEMENS", "Carestream Health", NAN, "SIEMENS", NAN])
    # the boxes still take their image size from the same header pass
    assert df.iloc[1][["box_x0", "box_y0", "box_x1", "box_y1"]].tolist() == pytest.approx(
        [1450 / 2500, 300 / 2000, 1900 / 2500, 1000 / 2000])


def test_vindr_pcxr_keeps_a_newborns_age_in_days(tmp_path):
    root = write_vindr_pcxr(tmp_path / "vindr-pcxr")
    ages = ["000D", "006M", "003Y", "010W"]
    for (split, image), age, sex in zip([("train", i) for i in PCXR_TRAIN] + [("test", i) for i in PCXR_TEST],
                                        ages, ["F", "M", "M", "F"]):
        write_dicom(root / split / f"{image}.dicom", 128, 100, view="PA",
                    tags={"PatientAge": age, "PatientSex": sex, "Manufacturer": "FUJIFILM Corporation"})
    df = build_manifest("vindr_pcxr", root)
    assert df["age"].tolist() == pytest.approx([0.0, 0.5, 3.0, 70 / 365.25], rel=1e-12)
    assert df["sex"].tolist() == ["female", "male", "male", "female"]
    assert df["manufacturer"].tolist() == ["FUJIFILM Corporation"] * 4


def _mimic_patients(tmp_path):
    root = write_mimic_cxr(tmp_path / "mimic-cxr-jpg" / "2.1.0")
    meta_file = root / "mimic-cxr-2.0.0-metadata.csv.gz"
    meta = pd.read_csv(meta_file)
    meta.loc[meta["study_id"] == 53189527, "StudyDate"] = 21820101  # two years after the subject's first study
    meta.to_csv(meta_file, index=False)
    patients = tmp_path / "mimic-iv" / "3.1" / "hosp" / "patients.csv.gz"
    patients.parent.mkdir(parents=True)
    with gzip.open(patients, "wt", newline="") as f:
        pd.DataFrame({"subject_id": [10000032, 10000764, 11000011, 19999999], "gender": ["F", "M", "M", "F"],
                      "anchor_age": [52, 86, 91, 30], "anchor_year": [2180, 2176, 2185, 2150],
                      "anchor_year_group": ["2014 - 2016", "2011 - 2013", "2017 - 2019", "2008 - 2010"],
                      "dod": [None, "2178-05-01", None, None]}).to_csv(f, index=False)
    return root, patients


def test_mimic_cxr_sex_and_age_from_mimic_iv_patients(tmp_path):
    root, patients = _mimic_patients(tmp_path)
    plain = build_manifest("mimic_cxr", root)
    assert "sex" not in plain.columns and "age" not in plain.columns  # the JPG release has neither
    df = build_manifest("mimic_cxr", root, patients=str(patients))
    assert df["sample_id"].tolist() == [d for d, *_ in MIMIC_IMAGES]
    # anchor_age + (study year - anchor_year); subject 10000898 is not in the file: blank
    _same(df["age"], [52.0, 52.0, 54.0, 90.0, 90.0, NAN, 86.0])
    _same(df["sex"], ["female", "female", "female", "male", "male", NAN, "male"])
    assert (df.drop(columns=["sex", "age"]).fillna("-") == plain.fillna("-")).all().all()
    with pytest.raises(ChestDataError, match=r"option 'patients' '.*nope\.csv\.gz' is not a file; point it at "
                                             r"MIMIC-IV's hosp/patients\.csv\.gz"):
        build_manifest("mimic_cxr", root, patients="nope.csv.gz")


def test_the_scan_reads_the_new_columns(tmp_path):
    """End to end: the confounder scan's default columns include the adapter's sex, age and manufacturer."""
    root = write_padchest(tmp_path / "padchest")
    _padchest_metadata(root)
    df = build_manifest("padchest", root)
    features = np.random.default_rng(0).normal(size=(len(df), 8)).astype(np.float32)
    res = confounders.run(features, df, k=1, device="cpu")
    scanned = res.summary.set_index("column")
    assert {"sex", "age", "manufacturer", "view"} <= set(scanned.index)
    assert scanned.loc["sex", "n_values"] == 2 and scanned.loc["manufacturer", "n_values"] == 2
    assert scanned.loc["age", "n"] == 5  # the image without an age is no query
