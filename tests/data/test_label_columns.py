"""A label file missing a finding's column: the finding would silently read as
"0 positives". A finding the run scores (stage.findings) is refused in one line naming the file,
the missing column(s) and the fix; a finding it does not score gets one warning line."""
import gzip
import logging
from pathlib import Path

import cli_process
import pandas as pd
import pytest
from chest_fixtures import write_chexpert, write_mimic_cxr, write_vindr_cxr

from robustbench_fm.data import build_manifest
from robustbench_fm.data.files import DatasetError

ROOT = Path(__file__).resolve().parents[2]


def _drop(path: Path, *columns: str) -> Path:
    opener = gzip.open if path.suffix == ".gz" else open
    with opener(path, "rt") as f:
        table = pd.read_csv(f)
    with opener(path, "wt", newline="") as f:
        table.drop(columns=list(columns)).to_csv(f, index=False)
    return path


@pytest.fixture
def chexpert_without_pneumothorax(tmp_path):
    root = write_chexpert(tmp_path / "CheXpert-v1.0-small")
    _drop(root / "train.csv", "Pneumothorax")
    return root


def test_a_finding_the_run_scores_is_refused_naming_file_column_and_fix(chexpert_without_pneumothorax):
    root = chexpert_without_pneumothorax
    with pytest.raises(DatasetError) as err:
        build_manifest("chexpert", root, findings=["edema", "pneumothorax"])
    assert str(err.value) == (
        f"dataset 'chexpert': {root / 'train.csv'} has no column 'Pneumothorax', so finding 'pneumothorax' "
        "(in stage.findings) gets no labels from it; use the official, unmodified file or drop pneumothorax "
        "from stage.findings")


def test_a_finding_the_run_does_not_score_is_one_warning_line(chexpert_without_pneumothorax, caplog):
    root = chexpert_without_pneumothorax
    with caplog.at_level(logging.WARNING, logger="robustbench_fm"):
        df = build_manifest("chexpert", root, findings=["edema"])
    assert [r.getMessage() for r in caplog.records] == [
        f"dataset 'chexpert': {root / 'train.csv'} has no column 'Pneumothorax', so finding 'pneumothorax' gets "
        "no labels from it; use the official, unmodified file to score it"]
    assert df.loc[df["split"] == "train", "pneumothorax"].isna().all()  # unlabelled, not negative
    assert df.loc[df["split"] == "train", "edema"].notna().any()


def test_the_official_files_give_no_warning(tmp_path, caplog):
    with caplog.at_level(logging.WARNING, logger="robustbench_fm"):
        build_manifest("chexpert", write_chexpert(tmp_path / "cx"), findings=["pneumothorax"])
        build_manifest("mimic_cxr", write_mimic_cxr(tmp_path / "mimic"), findings=["pneumothorax"])
        build_manifest("vindr_cxr", write_vindr_cxr(tmp_path / "vindr"), findings=["lung_opacity"])
    assert caplog.records == []


def test_every_column_type_adapter_reports_the_gap(tmp_path):
    """MIMIC's gzipped label file; VinDr's per-split files, where a finding fed by several columns
    (lung_opacity: Lung Opacity, Infiltration, Consolidation) loses one of them."""
    mimic = write_mimic_cxr(tmp_path / "mimic")
    _drop(mimic / "mimic-cxr-2.0.0-chexpert.csv.gz", "Edema", "Fracture")
    with pytest.raises(DatasetError, match=r"mimic-cxr-2\.0\.0-chexpert\.csv\.gz has no columns 'Edema', "
                                           r"'Fracture', so findings 'edema', 'fracture' \(in stage\.findings\) "
                                           r"get no labels from it; .* or drop edema, fracture from stage\.findings"):
        build_manifest("mimic_cxr", mimic, findings=["edema", "fracture"])
    vindr = write_vindr_cxr(tmp_path / "vindr")
    _drop(vindr / "annotations" / "image_labels_test.csv", "Infiltration")
    with pytest.raises(DatasetError) as err:
        build_manifest("vindr_cxr", vindr, findings=["lung_opacity"])
    assert str(err.value) == (
        f"dataset 'vindr_cxr': {vindr / 'annotations' / 'image_labels_test.csv'} has no column 'Infiltration', "
        "so finding 'lung_opacity' (in stage.findings) gets incomplete labels from it; use the official, "
        "unmodified file or drop lung_opacity from stage.findings")


def test_cli_refuses_before_any_image_is_read(chexpert_without_pneumothorax, tmp_path):
    out = tmp_path / "out"
    proc = cli_process.run(["-m", "robustbench_fm", f"paths.output_root={out}", "dataset=chexpert",
                           f"dataset.root={chexpert_without_pneumothorax}", "encoder=planted_sharp",
                           "stage.findings=[pneumothorax]"], cwd=ROOT, timeout=300)
    assert proc.returncode == 2, proc.stdout[-2000:] + proc.stderr[-2000:]
    assert proc.stderr.strip().splitlines() == [
        f"error: dataset 'chexpert': {chexpert_without_pneumothorax / 'train.csv'} has no column 'Pneumothorax', "
        "so finding 'pneumothorax' (in stage.findings) gets no labels from it; use the official, unmodified "
        "file or drop pneumothorax from stage.findings"]
    assert not (out / "cache").exists()
