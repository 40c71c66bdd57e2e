"""PCaBiop cohorts from PANDA's slide table: the ISUP cohort is per_cell slides per grade x
centre, the binary cohort its matched subset (all benign + as many cancer slides per centre,
spread evenly over grades 1-5), and the isup view the 15 grade-pair quartets."""

import pandas as pd
import pytest
from croma_sweeps import panda_table  # noqa: E402

from robustbench_fm.data import build_manifest
from robustbench_fm.data import manifest as mf
from robustbench_fm.data.pathorob import pcabiop_cohorts


@pytest.fixture(scope="module")
def panda(tmp_path_factory):
    root = tmp_path_factory.mktemp("panda")
    panda_table(root / "train.csv", per_cell=9)
    return root


def test_binary_cohort_is_a_matched_subset_of_the_isup_cohort(panda):
    isup = build_manifest("pcabiop", panda, verify_images=False, view="isup", per_cell=7)
    binary = build_manifest("pcabiop", panda, verify_images=False, view="binary", per_cell=7)
    slides = isup.drop_duplicates("sample_id")
    assert len(slides) == 6 * 2 * 7
    assert slides.groupby(["isup_grade", "site"]).size().eq(7).all()
    assert set(binary["sample_id"]) <= set(slides["sample_id"])
    assert binary.groupby(["site", "bio_label"]).size().to_dict() == {
        (s, c): 7 for s in ("karolinska", "radboud") for c in ("benign", "cancer")}
    cancer = binary[binary["bio_label"] == "cancer"].groupby(["site", "isup_grade"]).size()
    assert cancer.unstack().values.tolist() == [[2, 2, 1, 1, 1]] * 2  # 7 = 5 x 1 + 2 to the lowest grades
    assert (binary["bio_label"] == "benign").eq(binary["isup_grade"] == 0).all()
    assert binary["path"].iloc[0] == f"train_images/{binary['sample_id'].iloc[0]}.tiff"
    # isup view: 15 quartets of 2 grades x 2 centres x 7 slides, one row per (slide, pair)
    assert isup["subset"].nunique() == 15 and len(isup) == 15 * 28
    assert isup.groupby("subset").apply(lambda q: q.groupby(["bio_label", "site"]).size().eq(7).all()).all()
    mf.validate(isup)  # unique per (sample_id, subset)
    again = build_manifest("pcabiop", panda, verify_images=False, view="binary", per_cell=7)
    pd.testing.assert_frame_equal(binary, again)  # seeded draw


def test_whole_table_and_errors(panda, tmp_path):
    binary, isup = pcabiop_cohorts(pd.DataFrame({"slide_id": [f"s{i}" for i in range(24)],
                                                 "isup_grade": [g for g in range(6) for _ in range(4)],
                                                 "site": ["a", "b"] * 12}), per_cell=None)
    assert len(isup) == 24 and len(binary) == 8  # per centre: 2 benign + 2 cancer (grades 1 and 2)
    with pytest.raises(ValueError, match="fewer than per_cell=10"):
        build_manifest("pcabiop", panda, verify_images=False, per_cell=10)
    with pytest.raises(ValueError, match="no column"):
        build_manifest("pcabiop", panda, verify_images=False, grade_col="grade")
    with pytest.raises(FileNotFoundError, match="PANDA's train.csv"):
        build_manifest("pcabiop", tmp_path, verify_images=False)
