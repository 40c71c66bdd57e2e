"""The null designs the paired comparisons are calibrated on (issue 58, "Tests that could fail"), the script
that measures them (``python scripts/calibrate_compare.py --cohorts 300 --out benchmarks/cpu2/calibration.json``;
its table is docs/comparisons.md "Calibration"), and the calibration itself: equally good encoders
(tests/fixtures/null_cohorts.py) -> ``evaluate(stage)`` -> ``compare_tables``, 300 null cohorts of each
design, every compared metric (CANDOR's D and D_all, CRoMa's median; the margin AUROC, RI, MaRI and the heads'
AUROC are not compared) at p < 0.05 in at most 7% of null pairs, its 95% interval covering 0 in at least 93%,
pooled rows and per-group rows apart. One class per design, so that pytest-xdist's ``loadscope`` runs them
on both workers."""
import importlib.util
from pathlib import Path

import pytest

COHORTS = 300
#: resamples per comparison in the calibration tests (the script's default is 1,000; p's resolution 1/301)
CALIBRATION_BOOT = 300
ROOT = Path(__file__).resolve().parents[2]


def _script():
    spec = importlib.util.spec_from_file_location("calibrate_compare", ROOT / "scripts" / "calibrate_compare.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_the_null_designs_are_unlike_the_suite_s_old_cohort():
    """What the calibration rests on (fixtures only, no stage): unequal images per patient, 2-4 matched
    groups, prevalence 5-30% differing by group, patients in several groups, and encoders that see the
    same latent rows through isometries (their pairwise cosine geometry equal up to their own noise)."""
    import numpy as np
    from null_cohorts import CROMA_DESIGN, DESIGNS, FINDING, _rotations, cohort, croma_cohort

    assert len(DESIGNS) >= 3
    for design in DESIGNS:
        manifest, feats = cohort(design, seed=1)
        per_patient = manifest.groupby("patient_id").size()
        prevalence = manifest.groupby("acq_group")[FINDING].mean()
        assert per_patient.min() == 1 and per_patient.max() >= 4, design.name
        assert 2 <= manifest["acq_group"].nunique() == len(design.groups) <= 4
        assert prevalence.min() >= 0.03 and prevalence.max() <= 0.40 and prevalence.max() > 1.5 * prevalence.min()
        assert (manifest.groupby("patient_id")["acq_group"].nunique() > 1).any(), design.name
        assert sorted(feats) == ["enc0", "enc1", "enc2"] and all(f.shape == (len(manifest), design.dim)
                                                                for f in feats.values())
        norms = [np.linalg.norm(f, axis=1).mean() for f in feats.values()]
        assert max(norms) / min(norms) < 1.05  # the same signal and noise sizes: equally good
        assert not np.allclose(feats["enc0"], feats["enc1"])
    assert DESIGNS[2].singletons >= 0.5  # design C: most patients have one image
    rot = _rotations(np.random.default_rng(0), 1, 8, 16)[0]
    np.testing.assert_allclose(rot @ rot.T, np.eye(8), atol=1e-12)  # an isometry of the latent space
    tiles, feats = croma_cohort(CROMA_DESIGN, seed=1)
    assert tiles.groupby("slide_id")["site"].nunique().max() == 1  # a slide is of one centre
    assert tiles["slide_id"].nunique() == CROMA_DESIGN.n_labels * CROMA_DESIGN.n_sites * CROMA_DESIGN.slides
    assert tiles.groupby("slide_id").size().nunique() > 1  # slides of unequal size


@pytest.mark.slow  # the stages' first calls (torch) take most of its ~10 s
def test_the_script_tallies_two_cohorts_and_writes_its_table(tmp_path):
    """scripts/calibrate_compare.py on 2 cohorts of design C (100 resamples): one summary row per
    (metric, row type), the compared ones with their simultaneous coverage, the old ones without, and
    the markdown table naming each; counts that add up (2 cohorts × 2 groups × 3 pairs)."""
    import json

    out = tmp_path / "calibration.json"
    result = _script().main(["--cohorts", "2", "--designs", "C", "--n-boot", "100", "--out", str(out)])
    assert json.loads(out.read_text()) == result
    rows = {(s["metric"], s["row_type"]): s for s in result["summary"]}
    assert set(rows) == {(m, r) for m in ("d", "d_all", "margin_auroc") for r in ("pooled", "group")}
    assert rows[("d", "group")]["n_pairs"] == 12 and rows[("d", "group")]["n_families"] == 4
    assert rows[("d", "pooled")]["n_pairs"] == 6 and rows[("d", "pooled")]["n_cohorts"] == 2
    assert rows[("d", "pooled")]["compared"] and "coverage_sim" in rows[("d", "pooled")]
    assert not rows[("margin_auroc", "pooled")]["compared"] and "coverage_sim" not in rows[("margin_auroc", "pooled")]
    for s in result["summary"]:
        for key in ("p_below_005", "p_adj_le_005", "coverage"):
            assert 0 <= s[key]["rate"] <= 1 and s[key]["n"] == s["n_pairs"]
        assert s["fwer"]["n"] == s["n_families"]
    assert "| C | margin_auroc | pooled (2 families) | no (Holm, percentile) |" in result["markdown"]


def _calibrated(design_name: str) -> list[dict]:
    """The summary rows of ``COHORTS`` null cohorts of one design through the public path, 3 encoders."""
    import null_cohorts as nc

    script = _script()
    design = {d.name: d for d in (*nc.DESIGNS, nc.CROMA_DESIGN)}[design_name]
    records, _ = script.run_design(design, COHORTS, 3, CALIBRATION_BOOT, 0, old=False, check_summaries=False)
    return script.summarise(records)


def _assert_calibrated(summary: list[dict], metrics: set[str]) -> None:
    assert {s["metric"] for s in summary} == metrics
    for s in summary:
        assert s["compared"] and s["n_cohorts"] == COHORTS
        where = f"{s['design']} {s['metric']} {s['row_type']}"
        assert s["p_below_005"]["rate"] <= 0.07, where
        assert s["coverage"]["rate"] >= 0.93, where
        assert s["fwer"]["rate"] <= 0.08, where  # every pair of a family at once (max-T), 3 encoders


@pytest.mark.slow
class TestCalibrationDesignA:
    def test_d_and_d_all_are_calibrated(self):
        _assert_calibrated(_calibrated("A"), {"d", "d_all"})


@pytest.mark.slow
class TestCalibrationDesignB:
    def test_d_and_d_all_are_calibrated(self):
        _assert_calibrated(_calibrated("B"), {"d", "d_all"})


@pytest.mark.slow
class TestCalibrationDesignC:
    def test_d_and_d_all_are_calibrated(self):
        _assert_calibrated(_calibrated("C"), {"d", "d_all"})


@pytest.mark.slow
class TestCalibrationCroma:
    def test_the_median_croma_is_calibrated(self):
        _assert_calibrated(_calibrated("croma"), {"croma"})
