"""CRoMa figures: files written (PNG + PDF, non-empty), one series per encoder, ridges ordered by
median, the Pareto frontier ringed exactly on the non-dominated encoders."""
import numpy as np
import pandas as pd
import pytest
from matplotlib.collections import PolyCollection

from robustbench_fm.methods.croma import plots as cp

ENCODERS = ["enc_a", "enc_b", "enc_c", "enc_d"]


@pytest.fixture(scope="module")
def per_sample():
    rng = np.random.default_rng(0)
    parts = []
    for k, enc in enumerate(ENCODERS):
        d_so = np.exp(rng.normal(np.log(0.1 * (k + 1)), 0.3, 200))
        d_os = d_so * np.exp(rng.normal(0.2 * (k - 1), 0.3, 200))
        parts.append(pd.DataFrame({"encoder": enc, "d_so": d_so, "d_os": d_os,
                                   "croma": (d_os - d_so) / (d_os + d_so)}))
    return pd.concat(parts, ignore_index=True)


@pytest.fixture(scope="module")
def summary():
    # enc_c and enc_d are on the frontier (enc_d best median, enc_c best tail), enc_a/enc_b dominated
    return pd.DataFrame({"encoder": ENCODERS, "croma": [-0.1, 0.0, 0.05, 0.2], "ltm": [-0.6, -0.5, -0.2, -0.3],
                         "apd_id": [-0.12, -0.08, -0.03, -0.01], "apd_ood": [-0.1, -0.09, -0.01, -0.02]})


def test_ridgeline_one_ridge_per_encoder_ordered_by_median(per_sample, tmp_path):
    fig = cp.ridgeline_figure(per_sample)
    ax = fig.axes[0]
    ridges = [c for c in ax.collections if isinstance(c, PolyCollection) and c.get_label() in ENCODERS]
    assert len(ridges) == len(ENCODERS)
    order = per_sample.groupby("encoder")["croma"].median().sort_values().index.tolist()
    assert [t.get_text() for t in ax.get_yticklabels()] == order
    for path in cp.plot_ridgeline(per_sample, tmp_path / "fig4_ridgeline"):
        assert path.is_file() and path.stat().st_size > 1000
    assert {p.suffix for p in tmp_path.iterdir()} == {".png", ".pdf"}


def test_pareto_frontier_is_ringed(summary, tmp_path):
    assert cp.pareto_frontier(summary["croma"], summary["ltm"]).tolist() == [False, False, True, True]
    fig = cp.pareto_figure(summary)
    rings = fig.axes[0].collections[2]
    assert len(rings.get_offsets()) == 2
    assert sorted(map(tuple, rings.get_offsets().tolist())) == [(0.05, -0.2), (0.2, -0.3)]
    assert len(cp.pareto_figure(summary, frontier=["enc_a"]).axes[0].collections[2].get_offsets()) == 1
    assert all(p.stat().st_size > 1000 for p in cp.plot_pareto(summary, tmp_path / "fig3_pareto"))


def test_typed_distance_plane_on_log_axes(per_sample, tmp_path):
    ax = cp.typed_distance_figure(per_sample).axes[0]
    assert ax.get_xscale() == ax.get_yscale() == "log"
    assert [t.get_text() for t in ax.get_legend().get_texts()] == ENCODERS
    assert len(ax.collections) == 2 * len(ENCODERS)  # samples + median marker per encoder
    assert all(p.stat().st_size > 1000 for p in cp.plot_typed_distances(per_sample, tmp_path / "fig9"))
    with pytest.raises(ValueError, match="must be positive"):
        cp.typed_distance_figure(per_sample.assign(d_so=0.0))


def test_croma_vs_apd_one_panel_per_test_set(summary, tmp_path):
    fig = cp.croma_apd_figure(summary)
    assert len(fig.axes) == 2
    assert len(fig.axes[0].collections[0].get_offsets()) == len(ENCODERS)
    assert "ρ = 1.00" in fig.axes[0].get_title()  # APD_ID rises with median CRoMa in this table
    assert all(p.stat().st_size > 1000 for p in cp.plot_croma_vs_apd(summary, tmp_path / "fig6"))
    with pytest.raises(ValueError, match="columns ltm missing"):
        cp.pareto_figure(summary.drop(columns="ltm"))
    with pytest.raises(ValueError, match="no APD column"):
        cp.croma_apd_figure(summary[["encoder", "croma"]])


def enclosed_share(x, y, polygons) -> float:
    """Share of the points (x, y) inside any of ``polygons`` (matplotlib's point-in-polygon)."""
    from matplotlib.path import Path as PolygonPath

    pts = np.column_stack([x, y])
    return float(np.any([PolygonPath(poly).contains_points(pts) for poly in polygons], axis=0).mean())


@pytest.mark.parametrize("n, seed", [(41, 0), (300, 1)])
def test_75_percent_outline_encloses_at_least_75_percent(n, seed):
    rng = np.random.default_rng(seed)
    x = np.concatenate([rng.normal(0, 1, n // 2), rng.normal(4, 0.5, n - n // 2)])
    y = 0.5 * x + rng.normal(0, 1, n)
    polygons = cp.hdr_outline(x, y, 0.75)
    share = enclosed_share(x, y, polygons)
    assert 0.75 <= share <= 0.75 + 2.5 / n  # the ⌈0.75 n⌉ densest points, give or take a boundary tie
    assert enclosed_share(x, y, cp.hdr_outline(x, y, 0.5)) < share


def test_typed_distance_plane_draws_one_outline_per_encoder_in_log_space(per_sample):
    ax = cp.typed_distance_figure(per_sample).axes[0]
    outlines = [line for line in ax.lines if line.get_linestyle() == "-"]
    assert len(outlines) >= len(ENCODERS)
    rows = per_sample[per_sample["encoder"] == ENCODERS[0]]
    expected = cp.hdr_outline(np.log10(rows["d_so"]), np.log10(rows["d_os"]))[0]
    np.testing.assert_allclose(outlines[0].get_xdata(), 10 ** expected[:, 0])


def test_croma_vs_apd_top_row_shows_probe_accuracy_against_cramers_v(summary):
    probe = pd.DataFrame([dict(encoder=e, test_set=t, replicate=r, cramers_v=v, accuracy=0.9 - 0.1 * k * v + 0.01 * r)
                          for k, e in enumerate(ENCODERS) for t in ("id", "ood") for r in range(3)
                          for v in (0.0, 0.5, 1.0)])
    fig = cp.croma_apd_figure(summary, probe=probe)
    assert len(fig.axes) == 4
    top_id = fig.axes[1]  # created after the first scatter, drawn above it
    assert top_id.get_position().y0 > fig.axes[0].get_position().y0
    curve = top_id.lines[0]
    np.testing.assert_allclose(curve.get_xdata(), [0.0, 0.5, 1.0])
    np.testing.assert_allclose(curve.get_ydata(), [0.91, 0.91, 0.91])  # enc_a: mean over 3 replicates


def test_mean_rank_figure_puts_better_ranks_upper_right(tmp_path):
    """Figure 5: lower (better) ranks toward the upper-right, the frontier ringed."""
    ranks = pd.DataFrame({"encoder": ENCODERS, "mean_croma_rank": [1.0, 2.0, 3.5, 3.5],
                          "mean_ltm_rank": [3.0, 1.0, 2.0, 4.0], "pareto": [True, True, False, False]})
    fig = cp.mean_rank_figure(ranks, ["Camelyon", "TCGA-4x4"])
    ax = fig.axes[0]
    assert ax.xaxis_inverted() and ax.yaxis_inverted()
    assert "Camelyon, TCGA-4x4" in ax.get_xlabel()
    ringed = [c for c in ax.collections if len(c.get_facecolors()) == 0]
    assert len(ringed) == 1 and len(ringed[0].get_offsets()) == 2
    for path in cp.plot_mean_ranks(ranks, tmp_path / "fig5"):
        assert path.is_file() and path.stat().st_size > 1000
