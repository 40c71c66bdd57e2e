"""Synthetic CT phantoms (robustbench_fm.data.ct.phantoms) in the WORD, TotalSegmentator and LiTS layouts."""
from pathlib import Path

import numpy as np
import pytest
from hydra import compose, initialize_config_dir
from omegaconf import OmegaConf
from scipy import ndimage

from robustbench_fm import data
from robustbench_fm.cli.main import CONFIG_DIR
from robustbench_fm.data.ct import layouts as ct_datasets
from robustbench_fm.data.ct import phantoms
from robustbench_fm.data.ct.volumes import load_ras, to_display
from robustbench_fm.methods.spar.samples import L3_PROBES, ORGANS, build_samples
from robustbench_fm.pipeline.job import load_manifest
from robustbench_fm.pipeline.plan import Plan


def _centroid_x(labels, organ):
    return np.argwhere(labels == ORGANS.index(organ) + 1)[:, 2].mean() / labels.shape[2]


def test_word_phantoms_have_the_release_layout_and_plausible_anatomy(tmp_path):
    root = phantoms.write_phantoms(tmp_path, "word", n_subjects=6, seed=1)
    names = {d: sorted(p.name for p in (root / d).iterdir()) for d in
             ("imagesTr", "imagesVal", "imagesTs", "labelsTr", "labelsVal", "labelsTs")}
    assert names["imagesTr"] == names["labelsTr"] == [f"word_{i:04d}.nii.gz" for i in range(1, 5)]
    assert names["imagesVal"] == ["word_0005.nii.gz"] and names["imagesTs"] == ["word_0006.nii.gz"]
    vols = ct_datasets.list_volumes("word", root)
    ratios = []
    for v in vols:
        labels = to_display(ct_datasets.load_labels(v)[0])
        hu = to_display(load_ras(v.image))
        assert labels.shape == hu.shape == phantoms.SHAPE[::-1]
        assert set(np.unique(labels)) == set(range(len(ORGANS) + 1))          # all 16 organs drawn
        # radiological display: patient right (liver, right kidney) on the image left
        assert _centroid_x(labels, "liver") < 0.5 < _centroid_x(labels, "spleen")
        assert _centroid_x(labels, "right_kidney") < 0.5 < _centroid_x(labels, "left_kidney")
        assert np.median(hu[labels == 0][hu[labels == 0] > -500]) < 0 < np.median(hu[labels == 1])
        ratios.append((labels == 3).sum() / (labels == 4).sum())
    ratios = np.array(ratios)
    assert (ratios > 1.01).any() and (ratios < 0.99).any() and (abs(ratios - 1) < 1e-3).any()  # three kidney cases


def test_phantoms_are_idempotent_and_seeded(tmp_path):
    root = phantoms.write_phantoms(tmp_path / "a", "lits", n_subjects=2, seed=0)
    stamp = (root / "volume-0.nii.gz").stat().st_mtime_ns
    phantoms.write_phantoms(root, "lits", n_subjects=2, seed=0)
    assert (root / "volume-0.nii.gz").stat().st_mtime_ns == stamp
    other = phantoms.write_phantoms(tmp_path / "b", "lits", n_subjects=2, seed=1)
    assert not np.array_equal(load_ras(root / "volume-0.nii.gz"), load_ras(other / "volume-0.nii.gz"))
    with pytest.raises(ValueError, match="unknown phantom layout"):
        phantoms.write_phantoms(tmp_path / "c", "nnunet")


def test_lits_phantoms_hold_zero_to_three_tumours_inside_the_liver(tmp_path):
    root = phantoms.write_phantoms(tmp_path, "lits", n_subjects=8, seed=2)
    counts = []
    for v in ct_datasets.list_volumes("lits", root):
        seg = load_ras(v.labels, np.int16)
        assert set(np.unique(seg)) <= {0, 1, 2}
        tumours = ndimage.label(seg == 2)[1]
        counts.append(tumours)
        hu = load_ras(v.image)
        if tumours:
            assert np.median(hu[seg == 2]) < np.median(hu[seg == 1])     # hypodense lesions
    assert counts == [1, 2, 3, 0, 1, 2, 3, 0]


def test_extra_test_subjects_join_the_test_split_and_leave_the_others_alone(tmp_path):
    """extra_test (the SPAR demo's larger test sets): subjects drawn after the n_subjects, all in
    the test split; the training, validation and first test subjects are byte for byte those
    written without it, so every trained head stays the same; at 0 the generator's stamp is the
    one written before the option, so existing phantom sets are not rewritten."""
    import json

    plain = phantoms.write_phantoms(tmp_path / "a", "word", n_subjects=3, seed=1)
    more = phantoms.write_phantoms(tmp_path / "b", "word", n_subjects=3, seed=1, extra_test=2)
    files = {d: sorted(p.name for p in (more / d).iterdir()) for d in ("imagesTr", "imagesVal", "imagesTs")}
    assert files == {"imagesTr": ["word_0001.nii.gz"], "imagesVal": ["word_0002.nii.gz"],
                     "imagesTs": ["word_0003.nii.gz", "word_0004.nii.gz", "word_0005.nii.gz"]}
    for d, name in (("imagesTr", "word_0001"), ("labelsVal", "word_0002"), ("labelsTs", "word_0003")):
        np.testing.assert_array_equal(load_ras(plain / d / f"{name}.nii.gz"), load_ras(more / d / f"{name}.nii.gz"))
    assert not np.array_equal(load_ras(more / "imagesTs" / "word_0004.nii.gz"),
                              load_ras(more / "imagesTs" / "word_0005.nii.gz"))
    assert json.loads((plain / "generator.json").read_text()) == {"layout": "word", "n_subjects": 3, "seed": 1,
                                                                 "version": phantoms.PHANTOM_VERSION}
    assert json.loads((more / "generator.json").read_text())["extra_test"] == 2
    ts = phantoms.write_phantoms(tmp_path / "ts", "totalsegmentator", n_subjects=1, seed=0, extra_test=1)
    assert ct_datasets.read_totalseg_meta(ts)["split"].tolist() == ["train", "test"]
    from robustbench_fm.data.files import DatasetError

    with pytest.raises(DatasetError, match="extra_test must be >= 0 .and 0 for LiTS"):
        phantoms.write_phantoms(tmp_path / "l", "lits", n_subjects=2, extra_test=1)


def test_totalsegmentator_phantoms_write_every_mapped_class(tmp_path):
    root = phantoms.write_phantoms(tmp_path, "totalsegmentator", n_subjects=3, seed=0)
    files = {p.name for p in (root / "s0001" / "segmentations").iterdir()}
    mapped = {f"{n}.nii.gz" for names in ct_datasets.TOTALSEG_CLASSES.values() for n in names}
    assert mapped < files and "aorta.nii.gz" in files
    assert ct_datasets.read_totalseg_meta(root)["split"].tolist() == ["train", "val", "test"]


@pytest.mark.slow
def test_phantom_dataset_composes_generates_and_builds_every_probe(tmp_path):
    with initialize_config_dir(config_dir=str(CONFIG_DIR), version_base="1.3"):
        cfg = compose("config", overrides=[f"paths.root={tmp_path}", "dataset=spar_phantom_word", "stage=candor",
                                           "dataset.options.n_subjects=3", "dataset.options.n_lits=3"])
    # the dataset part of plan() / load_manifest() (plan() itself would import every encoder)
    assert cfg.dataset.name in data.names() and not Path(cfg.dataset.root).exists()
    cfg.dataset.card.expected.images = cfg.dataset.card.expected.patients = 3
    job = Plan(cfg.dataset.name, Path(cfg.dataset.root), [], "spar", list(cfg.dataset.findings), None,
               dataset_options=OmegaConf.to_container(cfg.dataset.options, resolve=True),
               generate=bool(cfg.dataset.generate), card=OmegaConf.to_container(cfg.dataset.card, resolve=True))
    manifest = load_manifest(job)
    assert manifest["split"].tolist() == ["train", "val", "test"] and (job.root / "lits" / "volume-2.nii.gz").is_file()
    assert data.get("spar_phantom_word").generate is not None
    options = OmegaConf.to_container(cfg.dataset.options, resolve=True)
    s = build_samples("spar_phantom_word", job.root, tmp_path / "cache", **options)
    assert s.tiles.shape[1:] == (16, 224, 224) and s.slices.shape[1:] == (224, 224)
    np.testing.assert_allclose(s.centroids_px, s.centroids * 224, rtol=1e-6)
    assert np.nanmax(s.centroids_px) <= 224 and np.nanmin(s.centroids_px) >= 0
    assert set(s.questions["probe"]) >= set(L3_PROBES) - {"kidney_symmetry"}  # symmetry needs more subjects
    assert len(s.table) == len(s.present) == len(s.grid_cells) and set(s.table["split"]) <= {"train", "val", "test"}


def test_a_phantom_count_below_one_names_the_option_and_an_unknown_layout_is_a_bug(tmp_path):
    from robustbench_fm.core.errors import UserError
    from robustbench_fm.data.files import DatasetError

    with pytest.raises(DatasetError) as err:
        phantoms.write_phantoms(tmp_path / "a", "lits", n_subjects=0)
    assert isinstance(err.value, (UserError, ValueError))
    assert str(err.value) == ("write_phantoms: n_subjects must be >= 1, got 0; set dataset.options.n_subjects "
                              "(or n_lits) to 1 or more")
    with pytest.raises(ValueError, match="unknown phantom layout") as err:  # the adapters' own names
        phantoms.write_phantoms(tmp_path / "c", "nnunet")
    assert not isinstance(err.value, UserError)

