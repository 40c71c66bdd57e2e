"""A slide's role as a candidate on the median CRoMa (issue 58 item 3; methods/croma/influence.py): the
per-sample ``croma_bank_0`` / ``_1`` equal a brute force from croma.md's definitions (d = mean cosine distance
to the m nearest cross-slide SO / OS candidates; each slide's tiles left out in turn), the median's shift
taken as the kernel-weighted mean of the anchors' shifts near it."""
import numpy as np
import pandas as pd
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
