"""SPAR-Bench probe labels (spar.md 3.1, Levels 2-3) on phantoms against their definitions."""
import itertools

import nibabel as nib
import numpy as np
import pytest
from pandas import testing as pd_testing
from scipy import ndimage

from robustbench_fm.data.ct import phantoms
from robustbench_fm.data.ct.volumes import to_display
from robustbench_fm.methods.spar import probes
from robustbench_fm.methods.spar.samples import L3_PROBES, ORGANS, TRANSFORMS, apply_transform, build_samples

SIZE = 32
LK, RK, LIVER = ORGANS.index("left_kidney"), ORGANS.index("right_kidney"), ORGANS.index("liver")


@pytest.fixture(scope="module")
def phantom(tmp_path_factory):
    root = tmp_path_factory.mktemp("spar_phantom")
    phantoms.write_phantoms(root, "word", n_subjects=8, seed=3)
    phantoms.write_phantoms(root / "lits", "lits", n_subjects=5, seed=4)
    s = build_samples("spar_phantom_word", root, root / "cache", seed=7, size=SIZE, n_lits=4,
                      distance_rule="random")  # the phantom card's rule (the demo's)
    return root, s


def _questions(s, probe):
    return s.questions[s.questions["probe"] == probe].reset_index(drop=True)


def test_questions_table_follows_the_contract(phantom):
    _, s = phantom
    q = s.questions
    assert q.columns.tolist() == ["question_id", "probe", "slice_row", "transform", "organ_a", "organ_b", "organ_c",
                                  "organ_d", "label", "n_classes", "split"]
    assert q["question_id"].is_unique and set(q["probe"]) == set(L3_PROBES)
    assert q.groupby("probe")["n_classes"].unique().map(list).to_dict() == {
        p: [n] for p, n in {"relative_position": 2, "orientation": 5, "kidney_symmetry": 3, "liver_size": 3,
                            "distance_compare": 2, "tumour_count": 3}.items()}
    assert (q["label"] >= 0).all() and (q["label"] < q["n_classes"]).all()
    assert (q["split"].to_numpy() == s.slice_table["split"].to_numpy()[q["slice_row"]]).all()
    organs = set(q[["organ_a", "organ_b", "organ_c", "organ_d"]].to_numpy().ravel())
    assert organs <= set(ORGANS) | {""} and set(q["transform"]) == set(TRANSFORMS)
    lits = s.slice_table["dataset"].to_numpy()[q["slice_row"]] == "lits"
    assert (lits == (q["probe"] == "tumour_count")).all()


@pytest.mark.parametrize("transform", TRANSFORMS)
def test_transform_points_follow_the_image_transform(transform):
    h, w = 6, 9
    for r, c in [(0, 0), (1, 7), (5, 2)]:
        img = np.zeros((h, w))
        img[r, c] = 1
        moved = apply_transform(img, transform)
        r2, c2 = np.argwhere(moved)[0]
        point = probes.transform_points(np.array([(c + 0.5) / w, (r + 0.5) / h]), transform)
        np.testing.assert_allclose(point, [(c2 + 0.5) / moved.shape[1], (r2 + 0.5) / moved.shape[0]])


def test_relative_position_flip_control_flips_the_label(phantom):
    _, s = phantom
    q = _questions(s, "relative_position")
    none, flip = q[q["transform"] == "none"], q[q["transform"] == "hflip"]
    assert len(none) == len(flip) > 20
    assert (none["slice_row"].to_numpy() == flip["slice_row"].to_numpy()).all()
    assert (none["label"].to_numpy() == 1 - flip["label"].to_numpy()).all()
    a = none["organ_a"].map(ORGANS.index).to_numpy()
    b = none["organ_b"].map(ORGANS.index).to_numpy()
    rows = none["slice_row"].to_numpy()
    xa, xb = s.slice_centroids[rows, a, 0], s.slice_centroids[rows, b, 0]
    assert (none["label"].to_numpy() == (xa < xb)).all()  # 1: A on the patient's right of B (image left)
    assert (np.abs(xa - xb) * SIZE >= 1).all() and q["label"].mean() == 0.5
    assert s.slice_present[rows, a].all() and s.slice_present[rows, b].all()
    assert none[["organ_a", "organ_b"]].drop_duplicates().shape[0] > 5


def test_orientation_label_is_the_transform_and_balanced(phantom):
    _, s = phantom
    q = _questions(s, "orientation")
    assert (q["label"] == q["transform"].map(TRANSFORMS.index)).all()
    counts = q["label"].value_counts()
    assert len(counts) == 5 and counts.max() - counts.min() <= 1
    assert len(q) == (s.slice_table["dataset"] != "lits").sum() == q["slice_row"].nunique()


def test_kidney_symmetry_follows_the_area_ratio_and_is_balanced(phantom):
    _, s = phantom
    q = _questions(s, "kidney_symmetry")
    rows = q["slice_row"].to_numpy()
    ratio = s.slice_areas[rows, LK] / s.slice_areas[rows, RK]
    expected = [0 if 0.95 <= r <= 1.05 else 1 if r > 1.05 else 2 for r in ratio]
    assert q["label"].tolist() == expected and s.slice_present[rows][:, [LK, RK]].all()
    eligible = s.slice_present[:, LK] & s.slice_present[:, RK]
    all_labels = probes.kidney_symmetry_class(s.slice_areas[eligible, LK], s.slice_areas[eligible, RK])
    split = s.slice_table["split"].to_numpy()[eligible]
    for name in ("train", "val", "test"):  # undersampled to the rarest class (none when a class is missing)
        counts = np.bincount(q["label"][q["split"] == name], minlength=3)
        floor = min(int(((split == name) & (all_labels == c)).sum()) for c in range(3))
        assert (counts == floor).all(), name
    assert len(q) >= 9


def test_class_boundaries():
    np.testing.assert_array_equal(probes.kidney_symmetry_class([95, 105, 106, 94, 100], [100] * 5), [0, 0, 1, 2, 0])
    np.testing.assert_array_equal(probes.liver_size_class([0.0999, 0.1, 0.2, 0.2001, 0.5]), [0, 1, 1, 2, 2])
    np.testing.assert_array_equal(probes.tumour_count_class([0, 1, 2, 7]), [0, 1, 2, 2])


def test_liver_size_is_the_fraction_of_the_slice(phantom):
    _, s = phantom
    q = _questions(s, "liver_size")
    rows = q["slice_row"].to_numpy()
    fraction = s.slice_areas[rows, LIVER] / (s.slice_table["height"] * s.slice_table["width"]).to_numpy()[rows]
    assert q["label"].tolist() == [0 if f < 0.1 else 2 if f > 0.2 else 1 for f in fraction]
    assert len(q) == (s.slice_present[:, LIVER] & (s.slice_table["dataset"] != "lits").to_numpy()).sum()
    assert set(q["label"]) == {0, 1, 2}


def test_distance_compare_uses_varying_pairs(phantom):
    _, s = phantom
    q = _questions(s, "distance_compare")
    rows = q["slice_row"].to_numpy()
    idx = q[["organ_a", "organ_b", "organ_c", "organ_d"]].map(ORGANS.index).to_numpy()
    px = s.slice_centroids[rows[:, None], idx] * SIZE                          # (n, 4, 2)
    d_ab, d_cd = np.linalg.norm(px[:, 0] - px[:, 1], axis=1), np.linalg.norm(px[:, 2] - px[:, 3], axis=1)
    assert (q["label"].to_numpy() == (d_ab > d_cd)).all()
    assert all(len(set(r)) == 4 for r in idx) and s.slice_present[rows[:, None], idx].all()
    assert len({tuple(r) for r in idx}) > len(q) // 2 and 0.25 < q["label"].mean() < 0.75


def test_distance_questions_draws_that_many_distinct_questions_per_slice_and_one_keeps_the_first_draw(phantom):
    """``distance_questions=k``: up to k questions per slice, no pair of pairs asked twice (in
    either order), labels from the centroids; k = 1 asks exactly the default questions, and every
    other probe's questions are unchanged by k (spar.md 3.1 (v) gives no count; the demo asks 16)."""
    _, s = phantom
    pixels = (s.slice_table["height"] * s.slice_table["width"]).to_numpy()
    args = (s.slice_table, s.slice_present, s.slice_centroids, s.slice_areas, pixels, s.slice_tumours)

    def ask(k):
        return probes.make_questions(*args, np.random.default_rng(7), size=SIZE, distance_questions=k,
                                     distance_rule="random")

    one, many = ask(1), ask(8)
    pd_testing.assert_frame_equal(one, s.questions)  # build_samples' default is one draw per slice
    def of(q, probe):
        return q[q["probe"] == probe].reset_index(drop=True)

    for probe in L3_PROBES:
        if probe != "distance_compare":
            pd_testing.assert_frame_equal(of(one, probe), of(many, probe))
    q = of(many, "distance_compare")
    assert q["question_id"].is_unique
    per_slice = q.groupby("slice_row").size()
    assert per_slice.max() <= 8 and per_slice.mean() > 4 and len(q) > 4 * len(of(one, "distance_compare"))
    idx = q[["organ_a", "organ_b", "organ_c", "organ_d"]].map(ORGANS.index).to_numpy()
    keys = {(r, frozenset((frozenset(i[:2]), frozenset(i[2:])))) for r, i in zip(q["slice_row"], idx)}
    assert len(keys) == len(q)
    px = s.slice_centroids[q["slice_row"].to_numpy()[:, None], idx] * SIZE
    d_ab, d_cd = np.linalg.norm(px[:, 0] - px[:, 1], axis=1), np.linalg.norm(px[:, 2] - px[:, 3], axis=1)
    assert (q["label"].to_numpy() == (d_ab > d_cd)).all() and 0.3 < q["label"].mean() < 0.7


def test_tumour_count_matches_connected_components_of_the_lits_labels(phantom):
    root, s = phantom
    q = _questions(s, "tumour_count")
    table = s.slice_table.iloc[q["slice_row"]]
    expected = []
    for sid, z in zip(table["subject_id"], table["z"]):  # read back independently of the package's loader
        seg = nib.as_closest_canonical(nib.load(str(root / "lits" / f"segmentation-{int(sid[5:])}.nii.gz")))
        slice_ = to_display(np.asanyarray(seg.dataobj))[z]
        expected.append(min(ndimage.label(slice_ == 2, structure=np.ones((3, 3)))[1], 2))  # 8-connected
    assert q["label"].tolist() == expected and set(expected) == {0, 1, 2}
    used = table["subject_id"].unique()
    assert len(used) <= 4 and all((q["label"][table["subject_id"].to_numpy() == u] > 0).any() for u in used)


def test_tumours_are_counted_with_8_connectivity():
    """Issue 29 item 9: a lesion whose pixels touch only at a corner is one tumour (4-connectivity,
    scipy's default and the rule before, counted two); two lesions a pixel apart stay two."""
    mask = np.zeros((8, 8), bool)
    mask[1:3, 1:3] = True
    mask[3:5, 3:5] = True                                                # corner contact with the first block
    assert ndimage.label(mask)[1] == 2 and probes.count_tumours(mask) == 1
    mask[6:8, 6:8] = True                                                # a gap of one pixel: a second lesion
    assert probes.count_tumours(mask) == 2 and probes.tumour_count_class([probes.count_tumours(mask)]) == [2]


def test_distance_labels_are_measured_in_mm_when_the_spacing_is_known():
    """Issue 29 item 9: one 400 x 200 px slice of 1 mm pixels. d(liver, spleen) runs half the
    width (200 mm), d(left kidney, right kidney) three quarters of the height (150 mm), so the first
    pair is the longer one. In the squashed 224 frame the same pairs measure 112 and 168 px, the
    other order. With unknown spacing (NaN, or no frame given) the 224 frame is used, as before."""
    import pandas as pd

    from robustbench_fm.methods.spar.samples import slice_frame_mm

    table = pd.DataFrame({"sample_id": ["s"], "split": ["train"], "dataset": ["word"], "height": [200],
                          "width": [400], "spacing_x": [1.0], "spacing_y": [1.0]})
    assert slice_frame_mm(table).tolist() == [[400.0, 200.0]]
    assert np.isnan(slice_frame_mm(table.drop(columns=["spacing_x", "spacing_y"]))).all()
    present = np.zeros((1, 16), bool)
    present[0, :4] = True
    centroids = np.full((1, 16, 2), np.nan)
    centroids[0, :4] = [(0.2, 0.1), (0.7, 0.1), (0.1, 0.1), (0.1, 0.85)]  # liver, spleen, left / right kidney
    pair = {"liver", "spleen"}
    for frame, longer in ((slice_frame_mm(table), 1), (np.full((1, 2), np.nan), 0), (None, 0)):
        q = probes.make_questions(table, present, centroids, np.zeros((1, 16), np.int64), np.array([80000]),
                                  np.array([-1]), np.random.default_rng(0), probes=("distance_compare",), size=224,
                                  distance_questions=40, frame_mm=frame, distance_rule="random")
        first = q[[{a, b} == pair for a, b in zip(q["organ_a"], q["organ_b"])]]
        second = q[[{c, d} == pair for c, d in zip(q["organ_c"], q["organ_d"])]]
        assert len(first) + len(second) == 1, q                            # the pairing is asked once
        assert (first["label"] == longer).all() and (second["label"] == 1 - longer).all(), frame


def test_grid_cells_match_a_brute_force_assignment():
    """probes.grid_cells against a brute force over every assignment of 4 present organs to 16
    cells: most organs in the cell holding their centroid first, then the least summed distance
    to the cell centres. Half the draws crowd the organs into the upper-left quarter, so cells are
    shared; every organ whose cell no other centroid falls in keeps it."""
    rng = np.random.default_rng(0)
    centres = np.array([((c + 0.5) / 4, (r + 0.5) / 4) for r in range(4) for c in range(4)])
    perms = np.array(list(itertools.permutations(range(16), 4)))
    shared = 0
    for trial in range(12):
        present = np.zeros(16, bool)
        present[rng.choice(16, 4, replace=False)] = True
        centroids = np.full((16, 2), np.nan)
        centroids[present] = rng.random((4, 2)) * (0.5 if trial % 2 else 1.0)
        cells = probes.grid_cells(centroids[None], present[None])[0]
        xy = centroids[present]
        own = (np.floor(xy[:, 1] * 4) * 4 + np.floor(xy[:, 0] * 4)).astype(int)
        cost = np.linalg.norm(xy[:, None] - centres[None], axis=-1)   # (4, 16)
        kept, dist = (perms == own).sum(1), cost[np.arange(4), perms].sum(1)
        best = dist[kept == kept.max()].min()
        assert (cells[present] == own).sum() == kept.max()
        assert np.isclose(cost[np.arange(4), cells[present]].sum(), best)
        alone = np.array([(own == c).sum() == 1 for c in own])
        assert (cells[present][alone] == own[alone]).all()
        shared += int((~alone).any())
        assert sorted(cells) == list(range(16))
        free = sorted(set(range(16)) - set(cells[present]))
        assert cells[~present].tolist() == free                        # absent slots fill free cells in order
    assert shared >= 4


def test_grid_cells_of_the_phantom_tiles_are_permutations(phantom):
    _, s = phantom
    assert s.grid_cells.dtype == np.int64 and (np.sort(s.grid_cells, 1) == np.arange(16)).all()
    np.testing.assert_array_equal(s.grid_cells, probes.grid_cells(s.centroids, s.present))
    liver_cells = s.grid_cells[:, LIVER]   # the liver sits on the image left (patient right), upper half
    assert ((liver_cells % 4) <= 1).all()


def test_undersample_balances_every_group():
    rng = np.random.default_rng(1)
    labels, groups = rng.integers(0, 3, 300), rng.choice(["train", "val"], 300)
    keep = probes.undersample(labels, groups, rng, 3)
    for g in ("train", "val"):
        counts = np.bincount(labels[keep][groups[keep] == g], minlength=3)
        assert (counts == np.bincount(labels[groups == g], minlength=3).min()).all()
    assert len(np.unique(keep)) == len(keep)


def _canonical(q):
    """(split, pair of pairs, answer in the key's order) of distance questions (probes.question_key)."""
    out = []
    for split, *organs, label in q[["split", "organ_a", "organ_b", "organ_c", "organ_d", "label"]].itertuples(
            index=False):
        key, flip = probes.question_key("distance_compare", organs)
        out.append((split, key, 1 - label if flip else label))
    return out


def test_varying_distance_rule_asks_pairs_whose_order_changes_balanced_per_pair_of_pairs(phantom):
    """distance_rule="varying" (spar.md 3.1 controls: "Distance compares organ pairs that change
    across slices, so no single ordering applies"): every pair of pairs asked within a split has
    as many questions of either answer, so a lookup of the pair of pairs (the question-only prior)
    scores exactly half on every key it has seen; labels from the centroids, four distinct present
    organs, at most ``distance_questions`` per slice, the same questions for the same seed, and the
    other probes' questions are those of the default rule."""
    from collections import Counter

    from robustbench_fm.methods.spar import metrics

    _, s = phantom
    pixels = (s.slice_table["height"] * s.slice_table["width"]).to_numpy()
    args = (s.slice_table, s.slice_present, s.slice_centroids, s.slice_areas, pixels, s.slice_tumours)

    def ask(rule, seed=7):
        return probes.make_questions(*args, np.random.default_rng(seed), size=SIZE, distance_questions=6,
                                     distance_rule=rule)

    varying, default = ask("varying"), ask("random")
    pd_testing.assert_frame_equal(varying, ask("varying"))
    for probe in L3_PROBES:
        if probe != "distance_compare":
            pd_testing.assert_frame_equal(varying[varying["probe"] == probe].reset_index(drop=True),
                                          default[default["probe"] == probe].reset_index(drop=True))
    q = varying[varying["probe"] == "distance_compare"].reset_index(drop=True)
    assert len(q) >= 20 and q["question_id"].is_unique and q.groupby("slice_row").size().max() <= 6
    idx = q[["organ_a", "organ_b", "organ_c", "organ_d"]].map(ORGANS.index).to_numpy()
    assert all(len(set(r)) == 4 for r in idx) and s.slice_present[q["slice_row"].to_numpy()[:, None], idx].all()
    px = s.slice_centroids[q["slice_row"].to_numpy()[:, None], idx] * SIZE
    d_ab, d_cd = np.linalg.norm(px[:, 0] - px[:, 1], axis=1), np.linalg.norm(px[:, 2] - px[:, 3], axis=1)
    assert (q["label"].to_numpy() == (d_ab > d_cd)).all()
    votes = Counter((split, key, answer) for split, key, answer in _canonical(q))
    assert all(votes[(split, key, 1 - answer)] == n for (split, key, answer), n in votes.items())
    train = q[q["split"] == "train"]
    for split in ("val", "test"):
        asked = q[q["split"] == split]
        seen = [key in {k for _, k, _ in _canonical(train)} for _, key, _ in _canonical(asked)]
        _, prior = metrics.reference_answers(train, asked)
        assert np.mean(prior[seen] == asked["label"].to_numpy()[seen]) == 0.5, split
    old = default[default["probe"] == "distance_compare"]
    _, prior = metrics.reference_answers(old[old["split"] == "train"], old[old["split"] == "test"])
    assert (prior == old.loc[old["split"] == "test", "label"].to_numpy()).mean() > 0.7  # the random rule's prior


def test_the_distance_rule_is_a_dataset_option(phantom):
    """``dataset.options.distance_rule=varying`` (the default since issue 42 item 4) reaches the
    questions (those of make_questions under that rule, from the same seed); under ``random`` (the
    default before) the samples' cache key is the one caches had before the option existed, so
    they stay valid; an unknown rule is refused in one line."""
    from robustbench_fm.data.ct.layouts import sample_options
    from robustbench_fm.methods.spar.samples import content_key, slice_frame_mm

    root, s = phantom
    varying = build_samples("spar_phantom_word", root, root / "cache", seed=7, size=SIZE, n_lits=4)
    st = varying.slice_table
    want = probes.make_questions(st, varying.slice_present, varying.slice_centroids, varying.slice_areas,
                                 (st["height"] * st["width"]).to_numpy(), varying.slice_tumours,
                                 np.random.default_rng(7), size=SIZE, frame_mm=slice_frame_mm(st),
                                 distance_rule="varying")
    pd_testing.assert_frame_equal(varying.questions, want)
    assert not varying.questions.equals(s.questions)
    opts = sample_options("spar_phantom_word", {"size": SIZE, "n_lits": 4, "distance_rule": "random"})
    before = {k: v for k, v in opts.items() if k != "distance_rule"}
    assert content_key("spar_phantom_word", [], 7, opts) == content_key("spar_phantom_word", [], 7, before)
    assert content_key("spar_phantom_word", [], 7, {**opts, "distance_rule": "varying"}) != \
        content_key("spar_phantom_word", [], 7, opts)
    with pytest.raises(ValueError, match=r"^dataset 'word': dataset.options.distance_rule=fixed is not one of "
                                         r"random, varying$"):
        sample_options("word", {"distance_rule": "fixed"})


def test_varying_distance_rule_drops_pairs_whose_order_never_changes():
    """Three slices of one split, four organs: d(liver, spleen) vs d(left, right kidney) flips on
    the third slice only, so that pair of pairs is asked twice (one slice of each answer) and the
    pairings whose order never changes are not asked; an unknown rule is refused."""
    import pandas as pd

    table = pd.DataFrame({"sample_id": ["a", "b", "c"], "split": ["train"] * 3, "dataset": ["word"] * 3,
                          "height": [100] * 3, "width": [100] * 3})
    present = np.zeros((3, 16), bool)
    present[:, :4] = True                       # liver, spleen, left kidney, right kidney
    centroids = np.full((3, 16, 2), np.nan)
    centroids[:, :4] = [(0.1, 0.5), (0.9, 0.5), (0.4, 0.45), (0.6, 0.45)]  # liver-spleen 0.8 > kidneys 0.2
    centroids[2, 2:4] = [(0.0, 0.1), (1.0, 0.1)]                          # kidneys 1.0 apart on slice c
    q = probes.make_questions(table, present, centroids, np.zeros((3, 16), np.int64), np.full(3, 10000),
                              np.full(3, -1), np.random.default_rng(0), probes=("distance_compare",), size=100,
                              distance_questions=4, distance_rule="varying")
    keys = {key for _, key, _ in _canonical(q)}
    assert keys == {("distance_compare", ("left_kidney", "right_kidney"), ("liver", "spleen"))}, q
    assert len(q) == 2 and sorted(a for _, _, a in _canonical(q)) == [0, 1] and 2 in set(q["slice_row"])
    with pytest.raises(ValueError, match="distance_rule"):
        probes.make_questions(table, present, centroids, np.zeros((3, 16), np.int64), np.full(3, 10000),
                              np.full(3, -1), np.random.default_rng(0), probes=("distance_compare",),
                              distance_rule="other")
