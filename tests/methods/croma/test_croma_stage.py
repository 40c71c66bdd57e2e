"""The croma stage's contract beyond the oracle values: the near-separable case costs what the
normal case costs, short units (error / skip), one-line errors, paired subsets, app wiring."""
import time

import numpy as np
import pandas as pd
import pytest
from croma_cohorts import cohort, quartets
from omegaconf import OmegaConf

from robustbench_fm import evaluate
from robustbench_fm.methods.croma import stage
from robustbench_fm.pipeline import configstore


def best_time(x, manifest, repeats=3):
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        stage.run(x, manifest, device="cpu")
        times.append(time.perf_counter() - start)
    return min(times)


def test_near_separable_cells_cost_what_the_normal_case_costs():
    normal = cohort(slides_per_cell=8, tiles_per_slide=50, dim=64, seed=0)
    separable = cohort(slides_per_cell=8, tiles_per_slide=50, dim=64, seed=0, label_shift=3.0, conf_shift=3.0,
                       slide_shift=0.1, noise=0.3)
    # near-separable: the first typed (SO/OS) neighbour of every unit lies behind all 350 same-cell
    # cross-group tiles, beyond the reference's first typed search (200), which then has to grow
    assert stage.run(*separable, k=349).summary["support"][0] == 0.0
    ratio = best_time(*separable) / best_time(*normal)
    assert ratio < 3.0, f"near-separable case {ratio:.2f}x slower than the normal case"


def short_cohort():
    """Cell (class0, centre1) keeps only 3 tiles: the class0 x centre0 units have 3 SO candidates and
    the class1 x centre1 units 3 OS candidates."""
    x, manifest = cohort(slides_per_cell=3, tiles_per_slide=10, seed=2)
    keep = ~((manifest["bio_label"] == "class0") & (manifest["site"] == "centre1")).to_numpy()
    keep[np.flatnonzero(~keep)[:3]] = True
    return x[keep], manifest[keep].reset_index(drop=True)


def test_short_units_stop_the_stage_naming_the_cells():
    x, manifest = short_cohort()
    with pytest.raises(ValueError) as err:
        evaluate("croma", x, manifest)
    message = str(err.value)
    assert "\n" not in message and "60 of 93 units" in message
    assert "bio_label='class0' x site='centre0': 30 short of SO, 0 short of OS" in message
    assert "bio_label='class1' x site='centre1': 0 short of SO, 30 short of OS" in message
    assert "on_short='skip'" in message


def test_short_units_are_skipped_and_recorded_on_request():
    x, manifest = short_cohort()
    res = evaluate("croma", x, manifest, on_short="skip")
    row = res.summary.iloc[0]
    cell = manifest["bio_label"] + manifest["site"]
    short = cell.isin(["class0centre0", "class1centre1"])
    assert row["n_short"] == 60 and "class0" in row["short_cells"] and row["n"] == 93
    assert res.per_sample["croma"][short].isna().all() and res.per_sample["croma"][~short].notna().all()
    assert row["croma"] == pytest.approx(np.median(res.per_sample["croma"][~short]))


@pytest.mark.parametrize("params, field", [
    (dict(m=0), "m=0"), (dict(alpha=1.5), "alpha=1.5"), (dict(k_grid=[0, 3]), "k_grid value 0"),
    (dict(design="pairs"), "design='pairs'"), (dict(on_short="warn"), "on_short='warn'"),
    (dict(tau=-1.0), "tau=-1.0"), (dict(confounder_col="scanner"), "no column 'scanner'"),
    (dict(k=500), "below the largest scope size"),
])
def test_bad_options_fail_in_one_line(params, field):
    x, manifest = cohort(slides_per_cell=2, tiles_per_slide=10)
    with pytest.raises(ValueError) as err:
        evaluate("croma", x, manifest, **params)
    assert field in str(err.value) and "\n" not in str(err.value)


def test_empty_group_and_bad_features_are_refused():
    x, manifest = cohort(slides_per_cell=2, tiles_per_slide=10)
    with pytest.raises(ValueError, match="'slide_id' .* empty at row 4"):
        evaluate("croma", x, manifest.assign(slide_id=manifest["slide_id"].where(manifest.index != 4)))
    x[7] = 0.0
    with pytest.raises(ValueError, match="row 7 is a zero vector"):
        stage.run(x, manifest)


def incomplete_quartets():
    """Three quartets; q01 loses its cell (class2, centre3), q02 gains a third centre."""
    x, manifest = quartets(n_subsets=3, tiles_per_cell=12, reuse=False)
    drop = ((manifest["subset"] == "q01") & (manifest["bio_label"] == "class2") & (manifest["site"] == "centre3"))
    x, manifest = x[~drop.to_numpy()], manifest[~drop].reset_index(drop=True)
    extra = manifest[manifest["subset"] == "q00"].head(3).assign(subset="q02", site="centre0")
    return np.concatenate([x, x[extra.index]]), pd.concat([manifest, extra], ignore_index=True)


def test_incomplete_subsets_stop_the_stage_naming_them():
    """croma 1.0.1 refuses a paired manifest with an incomplete 2x2 subset."""
    from croma import RI
    from croma_cohorts import reference_manifest

    x, manifest = incomplete_quartets()
    with pytest.raises(ValueError) as err:
        stage.run(x, manifest, design="paired_2x2")
    message = str(err.value)
    assert "\n" not in message and "2 of 3 subsets in column 'subset'" in message
    assert "'q01', 'q02'" in message and "on_incomplete='skip'" in message
    with pytest.raises(ValueError, match="invalid subsets .*: q01, q02"):  # the reference refuses the same two
        RI.compute(x, reference_manifest(manifest), confounder_column="site", k_candidates=[3],
                   evaluation_design="paired_2x2")


def test_incomplete_subsets_are_skipped_with_a_warning_on_request():
    x, manifest = incomplete_quartets()
    with pytest.warns(RuntimeWarning, match="2 incomplete 2x2 subsets skipped"):
        res = stage.run(x, manifest, design="paired_2x2", on_incomplete="skip")
    assert res.summary["n_subsets"][0] == 1 and set(res.per_sample["subset"]) == {"q00"}
    assert res.summary["n"][0] == 48
    alone = stage.run(x[(manifest["subset"] == "q00").to_numpy()], manifest[manifest["subset"] == "q00"],
                      design="paired_2x2")
    assert res.summary["croma"][0] == alone.summary["croma"][0]


def test_units_at_the_rounding_floor_are_scored_and_counted():
    """distinct, structured rows whose distances sit at the float32 rounding floor
    (D = 768, rows 1 + small·signal: most units have d_SO + d_OS <= 4·eps·sqrt(D)) used to refuse
    the whole stage. They are scored now, counted in n_floor with a warning that names float64, and the
    float32 median stays close to the float64 truth."""
    signal, manifest = cohort(slides_per_cell=3, tiles_per_slide=19, dim=768, label_shift=1.5, seed=2,
                              dtype=np.float64)
    x = 1 + 0.04 * signal  # every unit's d_SO + d_OS (about 4e-6) under the float32 floor (1.3e-5)
    truth = stage.run(x, manifest, k=5, device="cpu")
    assert "n_floor" not in truth.summary  # float64: far above its floor
    with pytest.warns(RuntimeWarning, match="rounding floor.*pass float64 features") as caught:
        res = stage.run(x.astype(np.float32), manifest, k=5, device="cpu")
    assert "duplicated" not in str(caught[0].message)
    row = res.summary.iloc[0]
    tol = stage.zero_margin_tolerance(np.float32, 768)
    d = res.per_sample["d_so"] + res.per_sample["d_os"]
    assert row["n_floor"] == int((d <= tol).sum()) > len(x) / 2  # most units: the case
    assert res.per_sample["croma"].notna().all()  # distinct rows: every unit scored
    # at the floor float32 distances carry the matmul's summation order: measured 0.4938 vs 0.4834 on
    # one 2-core machine, 0.025 apart on another (same packages, another CPU's BLAS kernels)
    assert abs(row["croma"] - truth.summary["croma"][0]) < 0.05


def test_only_units_whose_typed_candidates_are_copies_are_left_out():
    """A unit whose m nearest SO and OS candidates are all copies of it has d_SO + d_OS = 0
    exactly: its CRoMa_i is NaN; every other unit is scored (croma 1.0.1 refuses the whole call)."""
    x, manifest = cohort(slides_per_cell=6, tiles_per_slide=4, seed=4, dtype=np.float32)
    cells = manifest["bio_label"] + "/" + manifest["site"]
    v = np.random.default_rng(5).standard_normal(x.shape[1]).astype(np.float32)  # a vector no row had
    picks = {c: np.flatnonzero(cells == c)[::4][:6] for c in ("class0/centre0", "class0/centre1", "class1/centre0")}
    for rows in picks.values():
        x[rows] = v
    with pytest.warns(RuntimeWarning, match="6 of them exactly 0"):
        res = stage.run(x, manifest, k=5, device="cpu")
    nan = res.per_sample["croma"].isna().to_numpy()
    assert set(np.flatnonzero(nan)) == set(picks["class0/centre0"])
    assert res.summary["n_floor"][0] >= 6 and np.isfinite(res.summary["croma"][0])


def test_collapse_guard_leaves_ordinary_features_alone():
    x, manifest = cohort(slides_per_cell=2, tiles_per_slide=10, dtype=np.float32)
    res = stage.run(x, manifest, device="cpu")
    d = res.per_sample["d_so"] + res.per_sample["d_os"]
    assert d.min() > 1e3 * stage.zero_margin_tolerance(np.float32, x.shape[1])


def test_finding_names_the_label_and_leads_the_summary():
    x, manifest = cohort(slides_per_cell=2, tiles_per_slide=10)
    res = evaluate("croma", x, manifest.rename(columns={"bio_label": "tissue"}), finding="tissue")
    assert list(res.summary.columns) == ["finding", "ri", "mari", "tau", "k", "support", "croma", "f0", "q_alpha",
                                         "ltm", "bio_knn_bacc", "conf_knn_bacc", "n", "selected_k_confounder",
                                         "ri_median", "ri_q_alpha", "ri_ltm", "mari_median", "mari_q_alpha", "mari_ltm",
                                         "ss_undefined_frac", "oo_undefined_frac", "mixed_undefined_frac",
                                         "croma_auc", "croma_min", "croma_delta", "m_sweep", "m_range",
                                         "n_undefined_m1", "ri_std", "mari_std", "croma_std", "reason"]
    assert res.summary["finding"][0] == "tissue" and res.params["label_col"] == "tissue"


def test_stage_config_runs_as_the_app_calls_it():
    cfg = OmegaConf.create(configstore.nodes("stage")["croma"])  # what stage=croma composes
    params = OmegaConf.to_container(cfg.params)
    params["device"] = "cpu"  # ${device} in the app
    stage.check_params(**params)
    x, manifest = cohort(slides_per_cell=2, tiles_per_slide=10)
    res = evaluate(cfg.name, x, manifest, finding=cfg.findings[0], **params)
    assert res.summary["finding"][0] == "bio_label" and res.summary["n"][0] == 80


def test_results_save(tmp_path):
    x, manifest = cohort(slides_per_cell=2, tiles_per_slide=10)
    res = evaluate("croma", x, manifest)
    res.save(tmp_path)
    # + undefined, and for paired comparisons n_so, n_typed, the two weights, cluster and the slides' influence
    # as candidates on each half's median (croma_bank_0 / _1)
    assert pd.read_parquet(tmp_path / "per_sample.parquet").shape == (80, 14)
    assert pd.read_parquet(tmp_path / "summary.parquet")["k"].dtype == np.int64


def test_f0_counts_exact_zeros_as_the_reference_does():
    """F(0) = share <= 0 (croma 1.0.1's closed boundary; the paper's Eq. 12 writes < 0)."""
    from robustbench_fm.methods.croma.scores import tail

    values = np.array([0.0, 0.0, 0.3, -0.2, 0.5])
    f0, q, ltm = tail(values, 0.10)
    assert f0 == 3 / 5 and (values < 0).mean() == 1 / 5
    assert q == pytest.approx(np.percentile(values, 10)) and ltm == -0.2
