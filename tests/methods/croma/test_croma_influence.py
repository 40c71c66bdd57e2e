"""A slide's role as a candidate on the median CRoMa (issue 58 item 3; methods/croma/influence.py): the
per-sample ``croma_bank_0`` / ``_1`` equal a brute force from croma.md's definitions (d = mean cosine distance
to the m nearest cross-slide SO / OS candidates; each slide's tiles left out in turn), the median's shift
taken as the kernel-weighted mean of the anchors' shifts near it."""
import numpy as np
import pandas as pd
import pytest
from croma_cohorts import cohort

from robustbench_fm import evaluate
from robustbench_fm.core.stats import cluster_halves, smoothed_density


def _croma_i(x, i, lab, con, slide, m, gone=None):
    d = 1.0 - x @ x[i]
    other = (slide != slide[i]) & (True if gone is None else slide != gone)
    so = np.sort(d[other & (lab == lab[i]) & (con != con[i])])[:m].mean()
    os_ = np.sort(d[other & (lab != lab[i]) & (con == con[i])])[:m].mean()
    return (os_ - so) / (os_ + so)


def test_bank_shares_equal_a_brute_force_of_each_slide_left_out():
    # strong slide offsets: a slide often fills an anchor's short candidate list (the full-width search again)
    x, manifest = cohort(slides_per_cell=3, tiles_per_slide=12, slide_shift=1.2, seed=2, dtype=np.float64)
    m = 3
    res = evaluate("croma", x, manifest, k=5, m=m)
    unit = x / np.linalg.norm(x, axis=1, keepdims=True)
    lab, con, slide = (manifest[c].to_numpy() for c in ("bio_label", "site", "slide_id"))
    values = np.array([_croma_i(unit, i, lab, con, slide, m) for i in range(len(x))])
    per = res.per_sample.set_index("sample_id").loc[manifest["sample_id"]]
    np.testing.assert_allclose(per["croma"].to_numpy(), values, atol=1e-12)
    density = smoothed_density(values)
    weight = density(values - np.median(values))
    halves = cluster_halves(slide)
    want = {}
    for p in np.unique(slide):
        for i in np.flatnonzero(slide != p):
            shift = values[i] - _croma_i(unit, i, lab, con, slide, m, gone=p)
            if shift:
                want[(p, int(halves[i]))] = want.get((p, int(halves[i])), 0.0) + weight[i] * shift / weight.sum()
    for h in (0, 1):
        got = per.groupby(per["cluster"].to_numpy())[f"croma_bank_{h}"].sum()
        expect = pd.Series({p: v for (p, hh), v in want.items() if hh == h}).reindex(got.index, fill_value=0.0)
        np.testing.assert_allclose(got.to_numpy(), expect.to_numpy(), atol=1e-10)
    assert len(want) > 20 and abs(np.array(list(want.values()))).max() > 1e-3


@pytest.mark.parametrize("block_size", [4096, 72])  # one tile of 144 rows; four of 72 (the influence: 144)
def test_float32_bank_shares_read_the_scope_pass_lists(monkeypatch, block_size):
    """Issue 57: float32 features on the CPU: the influence's first search (the 4m nearest SO and OS
    candidates of every anchor) is read off the scope pass's typed lists, not searched again over the
    scope (only the rows a slide filled are searched, at the full width), and every output equals, bit
    for bit, that of its own search."""
    from robustbench_fm.methods.croma import influence, stage

    x, manifest = cohort(slides_per_cell=3, tiles_per_slide=12, slide_shift=1.2, seed=2)  # float32
    searched = []
    real_search = influence._typed_lists
    monkeypatch.setattr(influence, "_typed_lists",
                        lambda x, anchors, *a: searched.append(len(anchors)) or real_search(x, anchors, *a))
    fused = evaluate("croma", x, manifest, k=5, m=3, device="cpu", block_size=block_size)
    assert searched and max(searched) < len(x)  # only the full-width search of the rows a slide filled
    searched.clear()
    real = stage.median_influence
    monkeypatch.setattr(stage, "median_influence", lambda *a, typed=None: real(*a))  # its own search
    own = evaluate("croma", x, manifest, k=5, m=3, device="cpu", block_size=block_size)
    assert searched[0] == len(x)  # its own first search: every anchor
    for a, b in ((fused.summary, own.summary), (fused.per_sample, own.per_sample), (fused.neighbours, own.neighbours)):
        pd.testing.assert_frame_equal(a, b, check_exact=True)
    assert (fused.per_sample["croma_bank_0"] != 0).sum() > 20


def test_bank_lists_only_for_float32_without_copies():
    """The scope pass keeps the influence's lists only where its products are the influence's own:
    float32 rows, tiles at least 64 on each edge, no identical rows (the pass sets a copy's similarity
    to 1, the influence computes it)."""
    from robustbench_fm.methods.croma import stage

    x, manifest = cohort(slides_per_cell=2, tiles_per_slide=10, seed=4)
    kept = stage.prepare(x, manifest, m=3, m_sweep=8, bank_lists=True, device="cpu").scopes[0].nb.typed
    assert kept is not None and kept[0][0].shape == kept[1][1].shape == (len(x), 4 * 3 + 1)  # the 4m nearest + 1
    assert stage.prepare(x, manifest, m=3, device="cpu").scopes[0].nb.typed is None
    # a tile edge below 64 (80 = 50 + 30): MKL may round a product that thin its own way
    assert stage.prepare(x, manifest, m=3, block_size=50, bank_lists=True, device="cpu").scopes[0].nb.typed is None
    assert stage.prepare(x.astype(np.float64), manifest, m=3, bank_lists=True, device="cpu").scopes[0].nb.typed is None
    x[3] = x[5]
    assert stage.prepare(x, manifest, m=3, bank_lists=True, device="cpu").scopes[0].nb.typed is None


def test_given_lists_search_again_the_rows_tied_at_m_or_width():
    """Lists handed over are read as given, except the rows whose m-th and (m + 1)-th (or width-th and
    (width + 1)-th) similarities tie: which tied candidate torch.topk keeps is its own, so those rows
    are searched again as the influence's own search does."""
    import torch

    from robustbench_fm.methods.croma import influence

    x, manifest = cohort(slides_per_cell=2, tiles_per_slide=10, seed=4)
    lab, con, grp = (pd.factorize(manifest[c])[0] for c in ("bio_label", "site", "slide_id"))
    unit = torch.as_tensor(x / np.linalg.norm(x, axis=1, keepdims=True))
    m, width = 3, 12
    own = influence._typed_lists(unit, np.arange(len(x)), lab, con, grp, width)
    given = [(s.copy(), r.copy()) for s, r in influence._typed_lists(unit, np.arange(len(x)), lab, con, grp, width + 1)]
    given[0][0][5, m] = given[0][0][5, m - 1]  # row 5: a tie across the m-th place
    given[1][0][20, width] = given[1][0][20, width - 1]  # row 20: across the width-th
    given[0][1][[5, 9, 20]] = -7  # rows no search gives
    got = influence._given_lists(unit, given, width, m, lab, con, grp)
    for (s, r), (s0, r0) in zip(got, own):
        assert s.shape == r.shape == (len(x), width)
        np.testing.assert_array_equal(s[[5, 20]], s0[[5, 20]])
        np.testing.assert_array_equal(r[[5, 20]], r0[[5, 20]])
    assert (got[0][1][9] == -7).all()  # row 9 has no tie: read as given
