"""cub and fgvc_aircraft: classes, matched groups (family, manufacturer), splits, banner crop."""
from pathlib import Path

import numpy as np
import pytest
from fixtures_natural import FGVC_SIZE, write_cub, write_fgvc

from robustbench_fm.data import build_manifest
from robustbench_fm.data.files import DatasetError
from robustbench_fm.data.images import read_image
from robustbench_fm.data.natural import classes_sharing_group, cub_family

#: The official classes.txt of CUB-200-2011 (a copy of ../shared/reference/cub_classes.txt).
CUB_NAMES = Path(__file__).resolve().parents[1] / "fixtures" / "cub_classes.txt"


def test_cub_species_family_and_split(tmp_path):
    write_cub(tmp_path)
    m = build_manifest("cub", tmp_path)
    assert len(m) == 14 and m.groupby("split").size().to_dict() == {"test": 7, "train": 7}
    assert m["bio_label"].nunique() == 7
    assert m.groupby("acq_group")["bio_label"].nunique().to_dict() == {"Albatross": 2, "Ani": 1, "Chat": 1,
                                                                       "Warbler": 3}
    first = m.iloc[0].to_dict()
    assert first["path"] == "CUB_200_2011/images/001.Black_footed_Albatross/Black_footed_Albatross_0000_1.jpg"
    assert first["bio_label"] == "Black_footed_Albatross" and first["sample_id"] == "cub_1"
    assert classes_sharing_group(m) == ["Bay_breasted_Warbler", "Black_and_white_Warbler",
                                        "Black_footed_Albatross", "Black_throated_Blue_Warbler", "Laysan_Albatross"]
    inner = build_manifest("cub", tmp_path / "CUB_200_2011")  # root may be the CUB_200_2011 folder itself
    assert inner["path"].iloc[0].startswith("images/") and len(inner) == 14


def test_cub_manifest_of_the_200_real_class_names_has_167_testable_species(tmp_path):
    names = [line.split()[1] for line in CUB_NAMES.read_text().splitlines() if line.strip()]
    write_cub(tmp_path, class_names=names, per_class=1, images=False)
    m = build_manifest("cub", tmp_path, verify_images=False)
    assert len(names) == 200 and len(m) == 200 and m["acq_group"].nunique() == 70
    assert len(classes_sharing_group(m)) == 167
    assert cub_family("200.Common_Yellowthroat") == "Yellowthroat"


def test_cub_missing_label_line_is_one_clear_error(tmp_path):
    write_cub(tmp_path)
    labels = tmp_path / "CUB_200_2011" / "image_class_labels.txt"
    labels.write_text("\n".join(labels.read_text().splitlines()[:-1]) + "\n")
    with pytest.raises(ValueError, match="image_id 14 of images.txt has no class") as err:
        build_manifest("cub", tmp_path)
    assert isinstance(err.value, DatasetError) and "re-extract CUB_200_2011.tgz" in str(err.value)


def test_fgvc_variant_within_manufacturer_and_banner_crop(tmp_path):
    write_fgvc(tmp_path)
    m = build_manifest("fgvc_aircraft", tmp_path)
    assert len(m) == 7 and m.groupby("split").size().to_dict() == {"test": 3, "train": 2, "val": 2}
    assert m["sample_id"].iloc[0] == "fgvc_0034309"  # leading zeros kept
    row = m.set_index("sample_id").loc["fgvc_0041135"]
    assert (row["bio_label"], row["acq_group"], row["aircraft_family"]) == ("F-16A/B", "Lockheed Martin", "F-16")
    assert m.set_index("sample_id").loc["fgvc_0062781", "bio_label"] == "Cessna 172"
    assert classes_sharing_group(m) == ["737-700", "737-800", "747-400", "C-130", "F-16A/B"]
    im = read_image(tmp_path, m.iloc[0].to_dict())
    assert im.size == (FGVC_SIZE[0], FGVC_SIZE[1] - 20)
    assert np.abs(np.asarray(im).astype(int) - 40).max() <= 2  # the white banner is gone
    inner = build_manifest("fgvc_aircraft", tmp_path / "fgvc-aircraft-2013b" / "data")
    assert inner["path"].iloc[0] == "images/0034309.jpg"


def test_fgvc_label_without_manufacturer_is_one_clear_error(tmp_path):
    write_fgvc(tmp_path)
    (tmp_path / "fgvc-aircraft-2013b" / "data" / "images_manufacturer_test.txt").write_text("0041135 Lockheed Martin\n")
    with pytest.raises(ValueError, match="images_variant_test.txt has no family or manufacturer"):
        build_manifest("fgvc_aircraft", tmp_path)
