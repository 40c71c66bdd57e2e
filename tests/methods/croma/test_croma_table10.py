"""CRoMa Table 10: median per-sample CRoMa on the original Tolkach-ESCA cohorts and on the held-out
TCGA cases of one run, and the boost = median(d_OS/d_SO on TCGA) / median(d_OS/d_SO on original)."""
from __future__ import annotations

from types import SimpleNamespace

import numpy as np
import pandas as pd
import pytest

from robustbench_fm.core.errors import UserError
from robustbench_fm.methods.croma import tables as tc
from robustbench_fm.paper import published
from robustbench_fm.report.compare import compare_table

KEY = "pathorob_tolkach"
SITES = ["VALSET1_UKK", "VALSET2_WNS", "VALSET4_CHA_FULL", "VALSET3_TCGA"]


def fake_per_sample(encoders, n_per_site=5, seed=0):
    """Per encoder and site: random typed distances (one d_SO = 0 row per site: r undefined)."""
    rng = np.random.default_rng(seed)
    parts = []
    for enc in encoders:
        for site in SITES:
            d_so = rng.uniform(0.1, 1.0, n_per_site)
            d_os = rng.uniform(0.1, 1.0, n_per_site) * (2.0 if "TCGA" in site else 1.0)
            d_so[0] = 0.0
            ids = [f"{site}-{i}" for i in range(n_per_site)]
            parts.append(pd.DataFrame({"sample_id": ids, "croma": (d_os - d_so) / (d_os + d_so), "d_so": d_so,
                                       "d_os": d_os, "encoder": enc, "benchmark": KEY, "finding": "bio_label",
                                       "site": site}))
    return pd.concat(parts, ignore_index=True)


def expected(per_sample, encoder):
    g = per_sample[per_sample["encoder"] == encoder]
    tcga = g["site"] == "VALSET3_TCGA"
    ok = g["d_so"] > 0
    r = g["d_os"] / g["d_so"]
    return (float(np.median(g.loc[~tcga, "croma"])), float(np.median(g.loc[tcga, "croma"])),
            float(np.median(r[tcga & ok]) / np.median(r[~tcga & ok])))


@pytest.mark.parametrize("sites_from", ["per_sample", "manifest"])
def test_table10_layout_and_values(monkeypatch, tmp_path, sites_from):
    encoders = ["uni", "midnight_12k", "dinov2_b", "phikon"]
    per_sample = fake_per_sample(encoders)
    panel_rows = per_sample if sites_from == "per_sample" else per_sample.drop(columns="site")
    monkeypatch.setattr(tc, "croma_panel", lambda results: tc.Panel(None, panel_rows, None, None))
    manifest = per_sample[["sample_id", "site"]].drop_duplicates("sample_id")
    monkeypatch.setattr(tc, "benchmark_groups", lambda results: {KEY: {"cfg": None, "stage": "croma", "entries": {}}})
    monkeypatch.setattr(tc, "panel_manifest", lambda results, cfg, entries: manifest)

    (table,) = tc.croma_table10(SimpleNamespace(root=tmp_path))
    frame = table.frame
    cols = list(dict.fromkeys(published.table("croma", 10, "")["column"]))
    assert cols == ["Tolkach-ESCA", "TCGA extension", "Boost"]
    assert list(frame.columns) == ["section", "Model", *cols]
    assert table.name == "croma_table10"
    assert set(frame["section"]) <= set(published.table("croma", 10, "")["section"])
    assert frame["section"].iloc[-1] == "natural-image control" and frame["Model"].iloc[-1] == "DINOv2-B"
    assert set(frame["Model"]) <= set(published.table("croma", 10, "")["row"])
    path = frame[frame["section"] == "pathology encoders"]
    assert list(path["Boost"]) == sorted(path["Boost"], reverse=True)
    for enc in encoders:
        row = frame[frame["Model"] == tc.label(enc)].iloc[0]
        orig, tcga, boost = expected(per_sample, enc)
        assert row["Tolkach-ESCA"] == pytest.approx(orig, abs=1e-12)
        assert row["TCGA extension"] == pytest.approx(tcga, abs=1e-12)
        assert row["Boost"] == pytest.approx(boost, rel=1e-12)
        assert row["Boost"] > 1  # TCGA rows were given twice the d_OS
    # every cell finds its published counterpart (section + Model + column)
    cmp = compare_table(table)
    assert len(cmp) == 3 * len(encoders)
    assert set(cmp.loc[cmp["row"] == "DINOv2-B", "section"]) == {"natural-image control"}


def test_table10_needs_the_tcga_cases(monkeypatch, tmp_path):
    per_sample = fake_per_sample(["uni"])
    per_sample = per_sample[per_sample["site"] != "VALSET3_TCGA"]
    monkeypatch.setattr(tc, "croma_panel", lambda results: tc.Panel(None, per_sample, None, None))
    with pytest.raises(UserError, match="TCGA"):
        tc.croma_table10(SimpleNamespace(root=tmp_path))
