"""vindr_mammo: mass or suspicious calcification per image, union box, DICOM polarity."""
import numpy as np
import pytest
from fixtures_mammo import write_vindr_mammo

from robustbench_fm.data import build_manifest
from robustbench_fm.data.files import DatasetError
from robustbench_fm.data.images import read_image


def test_vindr_mammo_labels_boxes_views_and_splits(tmp_path):
    write_vindr_mammo(tmp_path)
    m = build_manifest("vindr_mammo", tmp_path).set_index("sample_id")
    assert len(m) == 5 and m["patient_id"].nunique() == 2
    assert m["mass_or_calcification"].tolist() == [1.0, 0.0, 1.0, 0.0, 0.0]
    assert m["view"].tolist() == ["CC", "MLO", "CC", "MLO", "CC"] and m["laterality"].iloc[2] == "R"
    assert m.groupby("split").size().to_dict() == {"test": 2, "train": 3}
    boxes = ["box_x0", "box_y0", "box_x1", "box_y1"]
    assert m.loc["vindr_mammo_i1", boxes].tolist() == [0.1, 0.1, 0.5, 0.5]
    assert m.loc["vindr_mammo_i3", boxes].tolist() == [0.2, 0.2, 0.8, 0.8]  # mass + calcification, not the distortion
    assert m.loc[["vindr_mammo_i2", "vindr_mammo_i4"], boxes].isna().all().all()
    assert m.loc["vindr_mammo_i3", "path"] == "images/s1/i3.dicom"


def test_vindr_mammo_dicom_polarity(tmp_path):
    write_vindr_mammo(tmp_path)
    m = build_manifest("vindr_mammo", tmp_path)
    mono2 = np.asarray(read_image(tmp_path, m.iloc[0].to_dict()))
    mono1 = np.asarray(read_image(tmp_path, m.iloc[2].to_dict()))
    assert (mono2[0, 0], mono2[-1, -1]) == (0, 255) and (mono1[0, 0], mono1[-1, -1]) == (255, 0)
    j2k = np.asarray(read_image(tmp_path, m.iloc[3].to_dict()))  # JPEG 2000, MONOCHROME1
    assert j2k.shape == (20, 10) and (j2k[0, 0], j2k[-1, -1]) == (255, 0)


def test_vindr_mammo_bad_list_cell_is_one_clear_error(tmp_path):
    write_vindr_mammo(tmp_path)
    csv = tmp_path / "finding_annotations.csv"
    csv.write_text(csv.read_text().replace("\"['Focal Asymmetry']\"", "Focal Asymmetry"))
    with pytest.raises(ValueError, match="finding_categories', row 5: 'Focal Asymmetry' is not a list") as err:
        build_manifest("vindr_mammo", tmp_path)
    assert isinstance(err.value, DatasetError) and str(err.value).startswith(f"dataset 'vindr_mammo': {csv}:")
