"""SPAR-Bench data (spar.md 3.1; catalog 1.7): slice selection, organ tiles, RAS, caching, adapters."""
import nibabel as nib
import numpy as np
import pandas as pd
import pytest

from robustbench_fm import data
from robustbench_fm.data.ct import layouts as ct_datasets
from robustbench_fm.data.ct import phantoms
from robustbench_fm.data.ct.volumes import load_ras, to_display
from robustbench_fm.data.files import DatasetError, DatasetFileMissing, UnknownOption
from robustbench_fm.methods.spar.samples import ORGANS, build_samples

SIZE = 32  # tile / slice size for these tests (224 in the benchmark); keeps them fast

# Hand-built WORD subject in the display frame (z, y, x): cuboid organs, rows/cols inclusive.
Z, H, W = 12, 32, 40
CUBOIDS = {  # organ: (z0, z1, r0, r1, c0, c1)
    "liver": (2, 9, 4, 13, 2, 15),
    "spleen": (3, 8, 4, 11, 30, 36),
    "left_kidney": (4, 7, 18, 25, 26, 31),
    "right_kidney": (1, 10, 18, 26, 8, 13),
    "stomach": (5, 6, 2, 3, 20, 25),
    "gallbladder": (0, 11, 15, 16, 17, 20),
}
# IQR of the slices each organ occupies (np.percentile, inclusive), worked by hand:
# liver 2..9 -> [3.75, 7.25] -> 4..7; spleen 3..8 -> [4.25, 6.75] -> 5..6; left kidney 4..7 -> [4.75, 6.25] -> 5..6;
# right kidney 1..10 -> [3.25, 7.75] -> 4..7; stomach 5..6 -> [5.25, 5.75] -> none; gallbladder 0..11 -> 3..8.
PRESENT_Z = {"liver": range(4, 8), "spleen": range(5, 7), "left_kidney": range(5, 7), "right_kidney": range(4, 8),
             "stomach": range(0), "gallbladder": range(3, 9)}


def _hand_subject():
    hu = np.full((Z, H, W), -1000, np.int16)
    labels = np.zeros((Z, H, W), np.uint8)
    for organ, (z0, z1, r0, r1, c0, c1) in CUBOIDS.items():
        labels[z0:z1 + 1, r0:r1 + 1, c0:c1 + 1] = ORGANS.index(organ) + 1
        hu[z0:z1 + 1, r0:r1 + 1, c0:c1 + 1] = 50          # window (50, 400) -> 127.5 -> 128
    hu[2:10, 4:14, 9:16] = 250                              # liver's right half -> 255
    return hu, labels


def _write_word(root, hu, labels, name="word_0001.nii.gz", split_dir="Tr"):
    phantoms.save_nifti(root / f"images{split_dir}" / name, hu)
    phantoms.save_nifti(root / f"labels{split_dir}" / name, labels)


@pytest.fixture(scope="module")
def hand(tmp_path_factory):
    root = tmp_path_factory.mktemp("hand_word")
    hu, labels = _hand_subject()
    _write_word(root, hu, labels)
    return root, build_samples("word", root, root / "cache", lits_root=None, size=SIZE)


def test_slices_come_from_each_organs_interquartile_range(hand):
    _, s = hand
    n_present = {z: sum(z in r for r in PRESENT_Z.values()) for z in range(Z)}
    assert s.slice_table["z"].tolist() == [z for z in range(Z) if n_present[z] > 0] == [3, 4, 5, 6, 7, 8]
    assert s.table["z"].tolist() == [5, 6] and s.table["n_present"].tolist() == [5, 5]  # >= 5 organs
    for organ, zs in PRESENT_Z.items():
        assert s.slice_present[:, ORGANS.index(organ)].tolist() == [z in zs for z in range(3, 9)], organ
    assert (s.table["sample_id"] == ["word_0001_z0005", "word_0001_z0006"]).all()
    assert set(s.table["split"]) == {"train"} and set(s.table["dataset"]) == {"word"}


def test_centroids_and_tiles_match_the_hand_computed_boxes(hand):
    _, s = hand
    for organ, (_, _, r0, r1, c0, c1) in CUBOIDS.items():
        o = ORGANS.index(organ)
        if organ == "stomach":  # outside its inter-quartile range: absent, NaN, black
            assert not s.present[:, o].any() and np.isnan(s.centroids[:, o]).all() and (s.tiles[:, o] == 0).all()
            continue
        expected = [((c0 + c1) / 2 + 0.5) / W, ((r0 + r1) / 2 + 0.5) / H]
        np.testing.assert_allclose(s.centroids[:, o], [expected] * 2, atol=1e-6)
        np.testing.assert_allclose(s.centroids_px[:, o], np.array([expected] * 2) * SIZE, atol=1e-4)
        if organ != "liver":  # the tightest box holds only the organ: any air would darken the tile
            assert (s.tiles[:, o] == 128).all(), organ
    liver = s.tiles[:, ORGANS.index("liver")]  # 7 columns at 50 HU, then 7 at 250 HU, stretched to SIZE
    assert (liver[:, :, : SIZE // 2 - 3] == 128).all() and (liver[:, :, SIZE // 2 + 3:] == 255).all()
    absent = [i for i, o in enumerate(ORGANS) if o not in CUBOIDS]
    assert (s.tiles[:, absent] == 0).all() and not s.present[:, absent].any()
    assert s.tiles.shape == (2, 16, SIZE, SIZE) and s.tiles.dtype == np.uint8


def test_whole_slices_are_windowed_and_resized(hand):
    _, s = hand
    assert s.slices.shape == (6, SIZE, SIZE) and s.slices.dtype == np.uint8
    assert s.slices[:, 0, 0].tolist() == [0] * 6                     # air at -1000 HU
    liver_px = s.slices[2, int(8.5 / H * SIZE), int(4 / W * SIZE)]   # inside the liver's 50 HU half, z = 5
    assert liver_px == 128
    assert (s.slice_table[["height", "width"]].to_numpy() == [H, W]).all()
    np.testing.assert_array_equal(s.slice_areas[2, ORGANS.index("liver")], 10 * 14)


def test_second_build_loads_the_cache_without_reading_nifti(hand, monkeypatch):
    root, first = hand
    monkeypatch.setattr(nib, "load", lambda *a, **k: pytest.fail("NIfTI read on a cached build"))
    again = build_samples("word", root, root / "cache", lits_root=None, size=SIZE)
    for field in ("tiles", "present", "centroids", "grid_cells", "slices", "slice_areas"):
        np.testing.assert_array_equal(getattr(again, field), getattr(first, field))
    pd.testing.assert_frame_equal(again.questions, first.questions)
    assert len(list((root / "cache" / "spar").iterdir())) == 1


def test_a_volume_saved_in_another_orientation_gives_the_same_samples(tmp_path):
    hu, labels = _hand_subject()
    _write_word(tmp_path / "ras", hu, labels)
    ras = build_samples("word", tmp_path / "ras", tmp_path / "cache", lits_root=None, size=SIZE)
    # the same voxels stored as P-L-I (axes permuted and flipped), the affine saying so
    target = nib.orientations.axcodes2ornt(("P", "L", "I"))
    for kind in ("images", "labels"):
        src = tmp_path / "ras" / f"{kind}Tr" / "word_0001.nii.gz"
        img = nib.load(str(src))
        moved = img.as_reoriented(nib.orientations.ornt_transform(nib.orientations.io_orientation(img.affine), target))
        (tmp_path / "pli" / f"{kind}Tr").mkdir(parents=True, exist_ok=True)
        nib.save(moved, str(tmp_path / "pli" / f"{kind}Tr" / "word_0001.nii.gz"))
    stored = np.asanyarray(nib.load(str(tmp_path / "pli" / "imagesTr" / "word_0001.nii.gz")).dataobj)
    assert stored.shape == (H, W, Z)  # really stored differently
    pli = build_samples("word", tmp_path / "pli", tmp_path / "cache", lits_root=None, size=SIZE)
    np.testing.assert_array_equal(to_display(load_ras(tmp_path / "pli" / "imagesTr" / "word_0001.nii.gz")), hu)
    for field in ("tiles", "slices", "centroids", "present", "slice_areas"):
        np.testing.assert_array_equal(getattr(pli, field), getattr(ras, field))


def test_word_adapter_reads_the_release_layout(tmp_path):
    hu, labels = _hand_subject()
    base = tmp_path / "WORD-V0.1.0"
    for i, suffix in enumerate(["Tr", "Tr", "Val", "Ts"]):
        _write_word(base, hu, labels, f"word_{i + 1:04d}.nii.gz", suffix)
    vols = ct_datasets.list_volumes("word", tmp_path)
    assert [(v.subject_id, v.split) for v in vols] == [("word_0001", "train"), ("word_0002", "train"),
                                                        ("word_0003", "val"), ("word_0004", "test")]
    organ_map, tumour = ct_datasets.load_labels(vols[0])
    assert tumour is None and np.array_equal(to_display(organ_map), labels)  # WORD ids kept as they are
    m = data.build_manifest("word", tmp_path, lits_root=None)
    assert m["path"].tolist()[2] == "WORD-V0.1.0/imagesVal/word_0003.nii.gz" and m["split"].tolist()[3] == "test"
    (base / "labelsTs" / "word_0004.nii.gz").unlink()
    with pytest.raises(FileNotFoundError, match="labelsTs.*word_0004"):
        ct_datasets.list_volumes("word", tmp_path)
    with pytest.raises(TypeError, match="unknown option") as err:
        data.build_manifest("word", tmp_path, lits_rot="x")
    assert isinstance(err.value, UnknownOption) and "unknown option(s) ['lits_rot']; accepted: " in str(err.value)


def test_out_of_range_sample_options_are_refused_naming_each_override():
    """One line naming the dataset, every option out of range, its value and bound, as the
    override that sets it (dataset.options.<name>); in-range options come back with the defaults."""
    from robustbench_fm.data.ct.layouts import SAMPLE_OPTIONS, sample_options

    assert sample_options("word", {"distance_questions": 32}) == {**SAMPLE_OPTIONS, "distance_questions": 32}
    with pytest.raises(ValueError) as err:
        sample_options("spar_phantom_word", {"distance_questions": 0, "size": 4, "n_subjects": 3})
    assert str(err.value) == ("dataset 'spar_phantom_word': dataset.options.size=4 is out of range (need >= 8); "
                              "dataset.options.distance_questions=0 is out of range (need >= 1)")


def test_lits_adapter_reads_original_and_msd_layouts(tmp_path):
    hu, labels = _hand_subject()
    seg = (labels == 1).astype(np.uint8)
    seg[6, 5:7, 3:5] = 2
    phantoms.save_nifti(tmp_path / "batch1" / "volume-14.nii", hu)
    phantoms.save_nifti(tmp_path / "batch1" / "segmentation-14.nii", seg)
    phantoms.save_nifti(tmp_path / "batch1" / "test-volume-3.nii", hu)   # unlabelled challenge volume
    for name in ("liver_12.nii.gz", "._liver_12.nii.gz"):
        phantoms.save_nifti(tmp_path / "Task03_Liver" / "imagesTr" / name, hu)
        phantoms.save_nifti(tmp_path / "Task03_Liver" / "labelsTr" / name, seg)
    vols = ct_datasets.list_volumes("lits", tmp_path)
    assert [(v.subject_id, v.split) for v in vols] == [("lits_012", "test"), ("lits_014", "train")]
    splits = [ct_datasets.lits_split(n) for n in range(150)]
    assert splits[:3] == ["train", "val", "test"] and splits[15:18] == splits[:3]
    assert [splits.count(k) for k in ("train", "val", "test")] == [100, 20, 30]   # WORD's proportions
    organ_map, tumour = ct_datasets.load_labels(vols[1])
    assert set(np.unique(organ_map)) == {0, 1} and np.array_equal(to_display(organ_map), (seg > 0).astype(np.uint8))
    assert np.array_equal(to_display(tumour), seg == 2)


def test_totalsegmentator_adapter_maps_classes_to_word_organs(tmp_path):
    phantoms.write_phantoms(tmp_path / "word", "word", n_subjects=3, seed=5)
    phantoms.write_phantoms(tmp_path / "ts", "totalsegmentator", n_subjects=3, seed=5)
    raw = (tmp_path / "ts" / "meta.csv").read_bytes()
    assert raw.startswith(b"\xef\xbb\xbfimage_id;") and b";split;" in raw
    meta = ct_datasets.read_totalseg_meta(tmp_path / "ts")
    meta.loc[0, "split"] = "test"
    (tmp_path / "ts" / "meta.csv").write_text("\ufeff" + meta.to_csv(sep=";", index=False))
    ts = ct_datasets.list_volumes("totalsegmentator", tmp_path / "ts")
    word = ct_datasets.list_volumes("word", tmp_path / "word")
    assert [(v.subject_id, v.split) for v in ts] == [("s0000", "test"), ("s0001", "val"), ("s0002", "test")]
    assert sorted(p.name for p in ts[0].label_files())[:3] == ["adrenal_gland_left.nii.gz",
                                                             "adrenal_gland_right.nii.gz", "colon.nii.gz"]
    # the same phantom subject in both layouts: identical labels once the TS colon (which holds the
    # rectum) is accounted for, although the TS files are stored x-flipped (LAS)
    rectum, colon = ORGANS.index("rectum") + 1, ORGANS.index("colon") + 1
    for t, w in zip(ts, word):
        ts_map, word_map = ct_datasets.load_labels(t)[0], ct_datasets.load_labels(w)[0]
        assert rectum in word_map and rectum not in ts_map
        np.testing.assert_array_equal(ts_map, np.where(word_map == rectum, colon, word_map))
    assert nib.aff2axcodes(nib.load(str(ts[0].image)).affine) == ("L", "A", "S")
    m = data.build_manifest("totalsegmentator", tmp_path / "ts")
    assert m["path"].tolist() == ["s0000/ct.nii.gz", "s0001/ct.nii.gz", "s0002/ct.nii.gz"]
    (tmp_path / "ts" / "s0001" / "segmentations" / "kidney_left.nii.gz").unlink()
    with pytest.raises(FileNotFoundError, match="kidney_left"):
        ct_datasets.load_labels(ts[1])


def test_missing_and_unreadable_volumes_are_user_errors_naming_the_file(tmp_path):
    from robustbench_fm.core.errors import UserError

    with pytest.raises(DatasetFileMissing) as err:
        load_ras(tmp_path / "a.nii.gz")
    assert isinstance(err.value, (UserError, FileNotFoundError))
    assert str(err.value) == f"NIfTI file '{tmp_path / 'a.nii.gz'}' not found; check dataset.root"
    (tmp_path / "b.nii.gz").write_bytes(b"not a volume")
    with pytest.raises(DatasetError, match=f"^'{tmp_path / 'b.nii.gz'}' is not a readable NIfTI file .*; "
                                           "re-download it$"):
        load_ras(tmp_path / "b.nii.gz")
    with pytest.raises(ValueError, match="unknown CT layout 'words'") as err:  # the adapters' own names: a bug
        ct_datasets.list_volumes("words", tmp_path)
    assert not isinstance(err.value, UserError)
