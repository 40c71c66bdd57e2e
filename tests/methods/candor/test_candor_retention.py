"""The retention stage: occluded images through the extraction engine (exact ρ = 1 for an encoder
blind to the box, cached entries, keys), scoring brought features in closed form, and an
end-to-end app run on MS-CXR + RSNA fixtures."""
import logging
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
from feature_fixtures import tiny_encoder
from PIL import Image

from robustbench_fm import evaluate
from robustbench_fm.data import manifest as mf
from robustbench_fm.features import cache_key, cache_key_fields, extract, load_features
from robustbench_fm.methods.candor import retention


def _left_half(model, x):
    """Sees only the left half of the 32 px input (columns 0-15)."""
    return model(x[..., :16])


def _images(root: Path, n: int) -> pd.DataFrame:
    rng = np.random.default_rng(0)
    (root / "img").mkdir(parents=True, exist_ok=True)
    for i in range(n):
        Image.fromarray(rng.integers(0, 256, size=(32, 32, 3), dtype=np.uint8)).save(root / "img" / f"{i}.png")
    return pd.DataFrame({"sample_id": [f"s{i}" for i in range(n)], "path": [f"img/{i}.png" for i in range(n)],
                         "patient_id": [f"p{i // 2}" for i in range(n)], "marker": 1.0})


def test_an_encoder_blind_to_the_box_retains_exactly_and_the_cache_is_reused(tmp_path):
    encoder = tiny_encoder(weights_id="left-half", forward=_left_half)
    boxed = _images(tmp_path, 4).assign(box_x0=0.5, box_y0=0.25, box_x1=0.875, box_y1=0.75)  # right half
    derived = retention.derived_manifest({"marker": boxed}, seed=0)
    assert derived["occlusion_placement"].dropna().tolist() == ["expert"] * 4 + ["mirror"] * 4  # mirror: left half
    feats = extract(encoder, derived, tmp_path, tmp_path / "cache", progress=False, read=False)
    assert feats.n_forward > 0 and feats.n_images_embedded == 12
    ids, emb = load_features(feats.path, derived)
    orig, box, ctrl = emb[:4], emb[4:8], emb[8:]
    assert np.array_equal(orig, box)  # the box lies where the encoder does not look: identical features
    res = retention.run(emb, derived, finding="marker", n_boot=20)
    ps = res.per_sample
    assert ps["rho_box"].to_numpy() == pytest.approx(np.ones(4), abs=1e-12)
    assert (ps["rho_control"] < 1 - 1e-4).all()  # the mirrored box erases pixels it reads
    assert res.summary.loc[0, "retention"] == pytest.approx(1.0, abs=1e-12)
    assert res.summary.loc[0, "retention_std"] == pytest.approx(1.0, abs=1e-9)
    assert not np.array_equal(orig, ctrl)
    # the encoder that sees everything is moved by the box
    full = tiny_encoder(weights_id="full")
    emb_full = load_features(extract(full, derived, tmp_path, tmp_path / "cache", progress=False,
                                     read=False).path, derived)[1]
    assert (retention.run(emb_full, derived, finding="marker", n_boot=0).per_sample["rho_box"] < 1 - 1e-4).all()

    again = extract(encoder, derived, tmp_path, tmp_path / "cache", progress=False, read=False)
    assert again.n_forward == 0 and again.path == feats.path
    originals = derived[derived["occlusion"].isna()][["sample_id", "path"]]
    assert cache_key(cache_key_fields(encoder, originals, tmp_path)) != feats.key
    moved = derived.copy()
    moved.loc[4, "occlude_x0"] = 0.55
    assert cache_key(cache_key_fields(encoder, moved, tmp_path)) != feats.key
    refilled = derived.assign(occlude_fill=derived["occlude_fill"].replace("image_mean", "box_mean"))
    assert cache_key(cache_key_fields(encoder, refilled, tmp_path)) != feats.key
    # a manifest without occlusion columns hashes as it always did (existing cache entries stay valid)
    assert cache_key_fields(encoder, originals)["manifest_hash"] == mf.content_hash(originals, ("sample_id", "path"))


def test_brought_features_score_in_closed_form():
    boxed = pd.DataFrame({"sample_id": ["a", "b", "c"], "path": ["a", "b", "c"], "patient_id": ["p", "q", "r"],
                          "box_x0": 0.1, "box_y0": 0.1, "box_x1": 0.3, "box_y1": 0.3})
    m = retention.derived_manifest({"f1": boxed.iloc[:2], "f2": boxed.iloc[2:]}, seed=0)
    assert m["sample_id"].tolist() == ["a", "b", "c", "a#f1#box", "b#f1#box", "a#f1#control", "b#f1#control",
                                       "c#f2#box", "c#f2#control"]
    e = np.eye(3)
    feats = np.array([e[0], e[1], e[2],
                      [1, 1, 0], [0, 1, 0],      # rho_box a = 1/sqrt2, b = 1
                      [1, 0, 1], [0, 1, 1],      # rho_control a = b = 1/sqrt2
                      [0, 0, -1], [0, 0, 2]])    # rho_box c = -1, rho_control c = 1
    res = evaluate("retention", feats, m, finding=["f1", "f2"], n_boot=200, seed=1)
    s = res.summary.set_index("finding")
    r = 1 / np.sqrt(2)
    assert s.loc["f1", "retention"] == pytest.approx((r + 1) / 2)
    assert s.loc["f1", "retention_control"] == pytest.approx(r)
    assert s.loc["f1", "control_minus_box"] == pytest.approx(((r - r) + (r - 1)) / 2)
    assert s.loc["pooled", "control_minus_box"] == pytest.approx((0 + r - 1 + 2) / 3)
    # one c for the job, over the boxed images of every finding (orthogonal originals): f2's single
    # image has no pair of its own but is standardised with the job's c
    assert (s["c"] == 0.0).all() and s.loc["f2", "retention_std"] == pytest.approx(s.loc["f2", "retention"])
    assert s.loc["pooled", "n"] == 3 and s.loc["pooled", "retention"] == pytest.approx((r + 1 - 1) / 3)
    assert s.loc["pooled", "retention_std"] == pytest.approx(s.loc["pooled", "retention"])  # c = 0
    # two patients: below the floor of 5 clusters (core.stats.MIN_CLUSTERS), no interval rather than a degenerate one
    assert np.isnan(s.loc["f1", "retention_ci_low"]) and np.isnan(s.loc["f1", "retention_ci_high"])
    assert res.per_sample["rho_control"].tolist() == pytest.approx([r, r, 1.0])
    with pytest.raises(ValueError, match="occlusion_of"):
        retention.run(feats[:3], m.iloc[:3].drop(columns="occlusion_of"), finding="f1")


def test_one_reference_c_per_encoder_and_domain():
    """Standardised retention (candor.md "Occlusion Retention and Discordance": (ρ − c)/(1 − c), c the mean
    cosine of random pairs of the boxed images): every row of a job, each finding's and the pooled
    one, is standardised with the same c, the mean cosine of all pairs of all the job's boxed images
    (brute force). Findings from different sources have different within-source similarity (here
    0.8 and 0), so a c per finding would put them on different references."""
    rng = np.random.default_rng(3)
    boxed = pd.DataFrame({"sample_id": [f"s{i}" for i in range(6)], "path": "x",
                          "patient_id": [f"p{i}" for i in range(6)],
                          "box_x0": 0.1, "box_y0": 0.1, "box_x1": 0.3, "box_y1": 0.3})
    m = retention.derived_manifest({"ptx": boxed.iloc[:3], "pna": boxed.iloc[3:]}, seed=0)
    d = 8
    common = np.eye(d)[0]
    originals = np.vstack([common + 0.5 * np.eye(d)[1 + i] for i in range(3)] + [np.eye(d)[4 + i] for i in range(3)])
    variants = m["occlusion"].astype(object).fillna("")
    feats = np.empty((len(m), d))
    ids = m["sample_id"].tolist()
    for row, (sid, kind, of) in enumerate(zip(ids, variants, m["occlusion_of"])):
        base = originals[int((of if kind else sid)[1:])]
        feats[row] = base if not kind else base + rng.normal(scale=0.3, size=d)
    res = retention.run(feats, m, finding=["ptx", "pna"], n_boot=0, n_pairs=1000)
    s = res.summary.set_index("finding")
    unit = originals / np.linalg.norm(originals, axis=1, keepdims=True)
    i, j = np.triu_indices(6, k=1)
    c = float(np.mean([unit[a] @ unit[b] for a, b in zip(i, j)]))
    within = [float(np.mean([unit[a] @ unit[b] for a, b in zip(*np.triu_indices(3, k=1))])) for unit in
              (unit[:3], unit[3:])]
    assert within == pytest.approx([0.8, 0.0]) and c == pytest.approx(0.8 * 3 / 15)
    assert s["c"].tolist() == pytest.approx([c, c, c])
    for f in ("ptx", "pna", "pooled"):
        assert s.loc[f, "retention_std"] == pytest.approx((s.loc[f, "retention"] - c) / (1 - c))
    # linear in ρ with one c: the pooled standardised retention is the n-weighted mean of the findings'
    assert s.loc["pooled", "retention_std"] == pytest.approx(s.loc[["ptx", "pna"], "retention_std"].mean())


@pytest.mark.slow
def test_app_run_on_ms_cxr_and_rsna_fixtures(tmp_path, caplog):
    from chest_fixtures import write_mimic_cxr, write_ms_cxr, write_rsna_pneumonia
    from hydra import compose, initialize_config_dir

    from robustbench_fm.cli import app
    from robustbench_fm.cli.main import CONFIG_DIR

    mimic, rsna = write_ms_cxr(write_mimic_cxr(tmp_path / "mimic")), write_rsna_pneumonia(tmp_path / "rsna")
    with initialize_config_dir(config_dir=str(CONFIG_DIR), version_base="1.3"):
        cfg = compose("config", overrides=[
            f"paths.root={tmp_path}", "dataset=rsna_pneumonia", f"dataset.root={rsna}", "stage=retention",
            "encoder=planted_sharp", "encoders=null", "stage.params.n_boot=50", "stage.params.n_pairs=100",
            f"stage.params.sources=[{{dataset: ms_cxr, root: '{mimic}'}}, {{dataset: rsna_pneumonia}}]"])
    summary = app.run(cfg, tmp_path / "run1")
    s = summary.set_index("finding")
    assert list(s.index) == ["pneumothorax", "pneumonia", "pooled"]
    assert s["n"].tolist() == [1, 2, 3] and set(summary["encoder"]) == {"planted_sharp"}
    assert set(summary["dataset"]) == {"rsna_pneumonia"}
    pooled = (s.loc["pneumothorax", "retention"] + 2 * s.loc["pneumonia", "retention"]) / 3
    assert s.loc["pooled", "retention"] == pytest.approx(pooled)
    c = s.loc["pooled", "c"]
    assert s.loc["pooled", "retention_std"] == pytest.approx((s.loc["pooled", "retention"] - c) / (1 - c))
    assert ((s["retention"] > -1) & (s["retention"] < 1)).all()
    per = pd.read_parquet(tmp_path / "run1" / "results" / "planted_sharp" / "rsna_pneumonia" / "retention"
                          / "pneumonia" / "per_sample.parquet").set_index("sample_id")
    assert sorted(per.index) == ["00436515-870c-4b36-a041-de91049b9ab4", "00704310-78a8-4b38-8475-49f4573b2dbb"]
    # fixture boxes (264, 152, 213, 379) and (562, 152, 256, 453) on 1024 px merge into 264-818 x 152-605
    assert per.loc["00436515-870c-4b36-a041-de91049b9ab4", "box_area"] == pytest.approx(554 * 453 / 1024 ** 2)
    assert (tmp_path / "run1" / "results" / "planted_sharp" / "rsna_pneumonia" / "retention" / "pooled"
            / "summary.parquet").is_file()
    caplog.clear()
    with caplog.at_level(logging.INFO, logger="robustbench_fm"):
        again = app.run(cfg, tmp_path / "run2")
    assert [m for m in caplog.messages if "forward passes" in m and "retention" in m] and \
        all(" 0 forward passes" in m for m in caplog.messages if "forward passes" in m and "retention" in m)
    pd.testing.assert_frame_equal(again, summary)


@pytest.mark.slow
def test_app_run_on_idrid_lesion_masks(tmp_path):
    from fixtures_fundus import write_idrid
    from hydra import compose, initialize_config_dir

    from robustbench_fm.cli import app
    from robustbench_fm.cli.main import CONFIG_DIR

    root = write_idrid(tmp_path / "idrid")
    with initialize_config_dir(config_dir=str(CONFIG_DIR), version_base="1.3"):
        cfg = compose("config", overrides=[
            f"paths.root={tmp_path}", "dataset=idrid", f"dataset.root={root}", "dataset.options.part=segmentation",
            "stage=retention", "stage.findings=[microaneurysms,haemorrhages,soft_exudates]", "encoder=planted_blur",
            "encoders=null", "stage.params.n_boot=20", "stage.params.fill=box_mean",
            "extract.duplicates=keep"])  # the fixture's images are one constant image
    s = app.run(cfg, tmp_path / "run").set_index("finding")
    # fixture: MA on IDRiD_01 (rows 2-3, cols 3-4), HE on IDRiD_02 (row 0, col 0), no soft exudates
    assert s["n"].to_dict() == {"microaneurysms": 1, "haemorrhages": 1, "soft_exudates": 0, "pooled": 2}
    assert np.isnan(s.loc["soft_exudates", "retention"])
    assert s.loc["microaneurysms", "box_area"] == pytest.approx(2 / 20 * 2 / 16)
    # the fixture's images are constant (value 90): a box_mean fill changes no pixel, so ρ = 1
    assert s.loc["pooled", "retention"] == pytest.approx(1.0, abs=1e-6)


@pytest.mark.slow
def test_a_missing_retention_source_names_the_override_that_fixes_it(tmp_path):
    """experiment=chest_candor on a machine without MIMIC-CXR (so without MS-CXR's boxes): the
    error names retention source 'ms_cxr' and the `retention_sources=...` override (a sweep over
    stages can only set it there), and that override, as printed, runs."""
    import re

    from chest_fixtures import write_chexpert, write_rsna_pneumonia
    from hydra import compose, initialize_config_dir

    from robustbench_fm.cli import app
    from robustbench_fm.cli.main import CONFIG_DIR

    data = tmp_path / "data"
    write_chexpert(data / "CheXpert-v1.0-small")
    rsna = write_rsna_pneumonia(data / "rsna-pneumonia-detection-challenge")
    base = [f"paths.root={tmp_path}", "experiment=chest_candor", "dataset=chexpert", "stage=retention",
            "encoder=planted_sharp", "encoders=null", "stage.params.n_boot=50", "stage.params.n_pairs=100",
            "extract.duplicates=keep"]  # the fixture's images are one constant image

    def config(*extra):
        with initialize_config_dir(config_dir=str(CONFIG_DIR), version_base="1.3"):
            return compose("config", overrides=[*base, *extra])

    with pytest.raises(FileNotFoundError) as err:
        app.run(config(), tmp_path / "run1")
    message = str(err.value)
    assert message == (
        f"stage retention: retention source 'ms_cxr' (root '{data}/mimic-cxr-jpg/2.1.0') does not exist; "
        f"set retention_sources to the boxed datasets you have: "
        f"'retention_sources=[{{dataset: rsna_pneumonia, root: {rsna}}}]', "
        f"or give the folder: retention_sources.0.root=<folder of ms_cxr>")
    assert "dataset.root" not in message
    cache = tmp_path / "outputs" / "cache"  # refused before any image was embedded (the files' hash memo aside)
    assert not [p for p in cache.rglob("*") if p.is_file() and "_files" not in p.relative_to(cache).parts]

    suggested = re.search(r"'(retention_sources=[^']+)'", message).group(1)
    summary = app.run(config(suggested), tmp_path / "run2").set_index("finding")
    assert summary["n"].to_dict() == {"pneumothorax": 0, "pneumonia": 2, "pooled": 2}
    assert set(summary["dataset"]) == {"chexpert"}
    # the other way out: the source's folder, by list index
    moved = config(f"retention_sources.0.root={tmp_path}/elsewhere")
    assert moved.stage.params.sources[0] == {"dataset": "ms_cxr", "root": f"{tmp_path}/elsewhere"}
