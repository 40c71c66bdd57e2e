"""Occlusion geometry and pixels (robustbench_fm.features.occlusion): mean-fill exactness on real PNGs,
the mirrored / random control box, lesion-mask boxes, and the retention closed forms."""

import numpy as np
import pandas as pd
import pytest
from PIL import Image

from robustbench_fm.data.images import read_image
from robustbench_fm.features import occlusion as occ
from robustbench_fm.methods.candor import retention


@pytest.mark.parametrize("mode", ["RGB", "L"])
@pytest.mark.parametrize("fill", ["image_mean", "box_mean"])
def test_mean_fill_matches_a_pixel_loop_on_a_png(tmp_path, mode, fill):
    rng = np.random.default_rng(3)
    arr = rng.integers(0, 256, size=(4, 5, 3) if mode == "RGB" else (4, 5), dtype=np.uint8)
    Image.fromarray(arr).save(tmp_path / "x.png")
    row = {"path": "x.png", "occlude_x0": 0.2, "occlude_y0": 0.25, "occlude_x1": 0.5, "occlude_y1": 0.6,
           "occlude_fill": fill}
    out = np.asarray(occ.occlude_row(read_image(tmp_path, row), row))
    # every pixel the box touches: columns floor(1.0)=1 .. ceil(2.5)-1=2, rows floor(1.0)=1 .. ceil(2.4)-1=2
    inside = [(r, c) for r in range(4) for c in range(5) if 1 <= r <= 2 and 1 <= c <= 2]
    chans = arr.reshape(4, 5, -1).astype(float)
    pool = [chans[r, c] for r in range(4) for c in range(5)] if fill == "image_mean" \
        else [chans[r, c] for r, c in inside]
    want = arr.copy().reshape(4, 5, -1)
    for r, c in inside:
        want[r, c] = np.rint(np.mean(pool, axis=0))
    assert out.dtype == np.uint8 and np.array_equal(out, want.reshape(arr.shape))
    assert not np.array_equal(out, arr)
    no_box = {"path": "x.png", **{c: np.nan for c in occ.OCCLUSION_BOX_COLUMNS}}
    assert np.array_equal(np.asarray(occ.occlude_row(read_image(tmp_path, no_box), no_box)), arr)


def test_a_box_thinner_than_a_pixel_still_erases_one_and_bad_boxes_fail():
    assert occ.pixel_box((0.5, 0.5, 0.5, 0.5), 10, 10) == (5, 5, 6, 6)
    assert occ.pixel_box((0.0, 0.0, 1.0, 1.0), 7, 3) == (0, 0, 7, 3)
    with pytest.raises(ValueError, match="occlude_x0"):
        occ.pixel_box((0.6, 0.1, 0.4, 0.2), 10, 10)


def test_control_is_the_mirror_when_it_does_not_overlap():
    box = (0.1, 0.2, 0.3, 0.5)
    ctrl, how = occ.control_box(box, np.random.default_rng(0))
    assert how == "mirror" and ctrl == pytest.approx((0.7, 0.2, 0.9, 0.5))
    # touching the mirror along the midline is not an overlap
    assert occ.control_box((0.0, 0.0, 0.5, 1.0), np.random.default_rng(0)) == ((0.5, 0.0, 1.0, 1.0), "mirror")


def test_an_overlapping_mirror_gives_a_seeded_random_same_size_box_outside_the_box():
    box = (0.4, 0.1, 0.7, 0.3)  # mirror (0.3, 0.1, 0.6, 0.3) overlaps
    draws = []
    for s in range(2000):
        ctrl, how = occ.control_box(box, np.random.default_rng(s))
        assert how == "random"
        assert ctrl[2] - ctrl[0] == pytest.approx(0.3) and ctrl[3] - ctrl[1] == pytest.approx(0.2)
        assert 0 <= ctrl[0] and ctrl[2] <= 1 + 1e-12 and 0 <= ctrl[1] and ctrl[3] <= 1 + 1e-12
        assert not occ.overlaps(box, ctrl)
        draws.append(ctrl[:2])
    assert occ.control_box(box, np.random.default_rng(7)) == occ.control_box(box, np.random.default_rng(7))
    assert occ.control_box(box, occ.sample_rng(42, "a")) != occ.control_box(box, occ.sample_rng(42, "b"))
    # uniform over the allowed corners: corner range [0, .7] x [0, .8] minus (0.1, 0.7) x (0, 0.3)
    u, v = np.array(draws).T
    allowed = 0.7 * 0.8 - 0.6 * 0.3
    assert np.mean(v >= 0.3) == pytest.approx(0.7 * 0.5 / allowed, abs=0.04)
    assert np.mean(u <= 0.1) == pytest.approx(0.1 * 0.8 / allowed, abs=0.03)


def test_no_control_when_every_same_size_position_overlaps():
    assert occ.control_box((0.2, 0.2, 0.8, 0.8), np.random.default_rng(0)) == (None, "none")


def test_lesion_mask_box_from_idrid_masks(tmp_path):
    from fixtures_fundus import write_idrid

    from robustbench_fm.data import build_manifest

    write_idrid(tmp_path)
    m = build_manifest("idrid", tmp_path, part="segmentation", lesion_boxes=False)
    ma = retention.boxed_positives(m, "microaneurysms", tmp_path)
    # fixture: IDRiD_01's MA mask is rows 2-3, columns 3-4 of a 16 x 20 image
    assert ma["sample_id"].tolist() == ["idrid_seg_train_IDRiD_01"]
    assert ma[["box_x0", "box_y0", "box_x1", "box_y1"]].iloc[0].tolist() == pytest.approx([3 / 20, 2 / 16,
                                                                                            5 / 20, 4 / 16])
    assert retention.boxed_positives(m, "soft_exudates", tmp_path).empty
    assert all(np.isnan(occ.mask_box(np.zeros((3, 3), bool))))


def test_standardisation_and_random_pair_cosine_closed_forms():
    assert retention.standardise(0.9, 0.5) == pytest.approx(0.8)
    assert retention.standardise(0.5, 0.5) == 0.0 and retention.standardise(1.0, 0.3) == pytest.approx(1.0)
    assert np.isnan(retention.standardise(0.9, 1.0 - 1e-12))  # identical random pairs: undefined
    rng = np.random.default_rng(0)
    x = rng.normal(size=(6, 4)) + 1.0
    unit = x / np.linalg.norm(x, axis=1, keepdims=True)
    brute = np.mean([unit[i] @ unit[j] for i in range(6) for j in range(6) if i < j])
    assert retention.pair_cosine(unit, 15, rng) == pytest.approx(brute, abs=1e-12)  # 15 pairs: all of them
    big = rng.normal(size=(300, 4)) + 0.5
    big /= np.linalg.norm(big, axis=1, keepdims=True)
    exact = (np.square(big.sum(0)).sum() - 300) / (300 * 299)  # mean off-diagonal cosine
    assert retention.pair_cosine(big, 20000, rng) == pytest.approx(exact, abs=0.01)


def test_derived_manifest_rows_ids_and_controls():
    boxed = pd.DataFrame({"sample_id": ["a", "b"], "path": ["a.png", "b.png"], "patient_id": ["p", "p"],
                          "box_x0": [0.1, 0.2], "box_y0": [0.1, 0.2], "box_x1": [0.3, 0.8], "box_y1": [0.3, 0.8]})
    m = retention.derived_manifest({"pneumothorax": boxed, "pneumonia": boxed.iloc[:1]}, seed=1)
    assert m["sample_id"].tolist() == ["a", "b", "a#pneumothorax#box", "b#pneumothorax#box",
                                       "a#pneumothorax#control", "a#pneumonia#box", "a#pneumonia#control"]
    assert m["sample_id"].is_unique and m.loc[:1, "occlude_x0"].isna().all()
    ctrl = m[m["sample_id"] == "a#pneumothorax#control"].iloc[0]
    assert (ctrl["occlude_x0"], ctrl["occlude_x1"]) == pytest.approx((0.7, 0.9))
    assert ctrl["occlusion_placement"] == "mirror" and ctrl["occlusion_of"] == "a"
    assert set(m["occlude_fill"].dropna()) == {"image_mean"} and m["path"].iloc[3] == "b.png"
