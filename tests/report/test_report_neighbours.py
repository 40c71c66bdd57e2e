"""Issue 55 item 2: report.html shows CANDOR's neighbourhoods as thumbnails.

A run folder of two encoders on 16-bit PNGs (some cropped through the manifest's crop columns): the
section's panels are the best and the worst encoder by D in the run's ranking, each with its most
discordant queries (largest DM, as neighbours.parquet holds them), each query's nearest positives and
negatives in rank order with their similarities, and the same query under the other encoder; an
embedded thumbnail read back from the page is the dataset reader's image (16-bit stretched to 8 bit,
crop applied) shrunk to at most 96 px; a run from a features file names the images by id instead.
"""
from __future__ import annotations

import base64
import io
import re

import numpy as np
import pandas as pd
import pytest
from omegaconf import OmegaConf
from PIL import Image

from robustbench_fm.data.images import read_image
from robustbench_fm.methods.run import score_and_save
from robustbench_fm.report import comparisons as which_mod
from robustbench_fm.report import html
from robustbench_fm.report import neighbours as nbrs_mod
from robustbench_fm.report.long_format import to_long

CONFIG = "dataset:\n  name: toy\nstage:\n  name: candor\n  findings: [marker]\n  params:\n    k: 3\n"
IMG = re.compile(r"<img alt='([^']+)' src='data:image/png;base64,([^']+)'>")


def make_run(tmp_path, n=48):
    """Images (16-bit, 120 x 80; every third cropped by 10 px on the left), a manifest, two encoders'
    results, comparisons and the report's inputs."""
    rng = np.random.default_rng(0)
    root = tmp_path / "data"
    (root / "images").mkdir(parents=True)
    for i in range(n):
        pixels = (rng.random((80, 120)) * 4000 + 1000 * (i % 5)).astype(np.uint16)  # 12-bit data in 16 bits
        Image.fromarray(pixels).save(root / "images" / f"img_{i:03d}.png")
    man = pd.DataFrame({"sample_id": [f"s{i:03d}" for i in range(n)], "patient_id": [f"p{i:03d}" for i in range(n)],
                        "path": [f"images/img_{i:03d}.png" for i in range(n)],
                        "acq_group": np.where(np.arange(n) % 2, "A", "B"),
                        "marker": (np.arange(n) // 2 % 2).astype(float),
                        "crop_left": np.where(np.arange(n) % 3 == 0, 10, 0)})
    labels = man["marker"].to_numpy()
    good = rng.standard_normal((n, 8)).astype(np.float32) * 0.3
    good[:, 0] += 3 * labels  # separates the classes: D near 0
    bad = rng.standard_normal((n, 8)).astype(np.float32)  # knows nothing of them
    out = tmp_path / "run"
    out.mkdir()
    (out / "config.yaml").write_text(CONFIG)
    summaries = []
    for name, feats in (("enc_bad", bad), ("enc_good", good)):
        summaries += score_and_save("candor", feats, man, ["marker"], {"k": 3, "n_boot": 200}, out, name, "toy")
    which_mod.build(out, n_boot=200)
    long = to_long(pd.concat(summaries, ignore_index=True), "candor", OmegaConf.create(CONFIG), out.name)
    return out, man, root, long


def expected_thumbnail(root, row) -> np.ndarray:
    image = read_image(root, row)
    image.thumbnail((96, 96), Image.Resampling.LANCZOS)
    return np.asarray(image)


def test_report_shows_the_best_and_worst_encoders_neighbourhoods_as_the_right_images(tmp_path):
    out, man, root, long = make_run(tmp_path)
    report = html.run_report(out, CONFIG, long, 1.0, manifest=man, image_root=root)
    section = report.neighbours
    ranking = which_mod.headline_rows(which_mod.read(out).ranking)
    d = ranking[ranking["metric"] == "d"].set_index("encoder")["estimate"]
    assert d["enc_good"] < d["enc_bad"]
    assert [(p.encoder, p.role) for p in section.panels] == [("enc_good", "best"), ("enc_bad", "worst")]
    assert section.k == 3 and section.images and not section.note

    nbrs = pd.concat([pd.read_parquet(out / "results" / e / "toy" / "candor" / "marker" / "neighbours.parquet")
                      for e in ("enc_bad", "enc_good")])
    bank = nbrs[(nbrs["candidates"] == "bank") & (nbrs["query_label"] == 1)]
    for panel in section.panels:
        mine = bank[bank["encoder"] == panel.encoder].drop_duplicates("query_id")
        top = mine.sort_values(["dm", "query_id"], ascending=[False, True], kind="stable").head(4)
        assert [row.query.sample_id for row in panel.rows] == top["query_id"].tolist()
        assert panel.d == pytest.approx(d[panel.encoder])
        for row in panel.rows:
            assert [s.encoder for s in row.strips] == [panel.encoder] + [e for e in ("enc_good", "enc_bad")
                                                                           if e != panel.encoder]
            for strip in row.strips:
                part = bank[(bank["encoder"] == strip.encoder) & (bank["query_id"] == row.query.sample_id)]
                assert strip.dm == part["dm"].iloc[0] and strip.discordant == part["discordant"].iloc[0]
                for side, thumbs in (("pos", strip.positives), ("neg", strip.negatives)):
                    want = part[part["side"] == side].sort_values("rank")
                    assert [t.sample_id for t in thumbs] == want["neighbour_id"].tolist()
                    assert [t.caption for t in thumbs] == [f"{s:.{panel.decimals}f}" for s in want["similarity"]]

    page = html.to_html(report)
    md = html.to_markdown(report, out)
    assert "<h2>Neighbourhoods</h2>" in page and "## Neighbourhoods" in md
    assert "the 4 most discordant queries under enc_good (best by D, D = " in page
    start = page.index("<h2>Neighbourhoods</h2>")
    shown = dict(IMG.findall(page[start:page.index("<h2>", start + 1)]))
    rows = man.set_index("sample_id")
    cropped = next(s for s in shown if rows.loc[s, "crop_left"] == 10)
    for sample_id in (section.panels[0].rows[0].query.sample_id, cropped):  # a query and a cropped image
        got = np.asarray(Image.open(io.BytesIO(base64.b64decode(shown[sample_id]))))
        row = {"sample_id": sample_id, **rows.loc[sample_id].to_dict()}
        np.testing.assert_array_equal(got, expected_thumbnail(root, row))
        assert got.dtype == np.uint8 and got.max() == 255 and got.min() <= 5  # 16-bit data stretched to 0-255
        width = 110 if rows.loc[sample_id, "crop_left"] else 120
        assert got.shape == (round(80 * 96 / width), 96)  # the crop applied, then shrunk to 96 px
    first = section.panels[0].rows[0]
    for thumb in first.strips[1].positives:  # the other encoder's neighbours, embedded too
        assert thumb.sample_id in shown


def test_similarities_crowded_below_one_get_more_decimals():
    assert nbrs_mod.decimals([0.9989, 0.9985, 0.9987]) == 4 and nbrs_mod.decimals([0.99989, 0.99987]) == 5
    assert nbrs_mod.decimals([0.8, 0.6]) == 3 and nbrs_mod.decimals([1.0]) == 6 and nbrs_mod.decimals([]) == 3


def test_a_run_from_a_features_file_names_the_images_instead(tmp_path):
    out, man, root, long = make_run(tmp_path)
    report = html.run_report(out, CONFIG, long, 1.0, no_images=nbrs_mod.FROM_FEATURES)
    page = html.to_html(report)
    section = page[page.index("<h2>Neighbourhoods</h2>"):]
    assert "This run scored a features file: there are no images to show" in section
    assert "data:image/png" not in section[:section.index("</div>\n", section.index("class='nbrs'"))]
    first = report.neighbours.panels[0].rows[0]
    assert f"<span class='box'>{first.query.sample_id}</span>" in section
    (out / "results" / "enc_bad").rename(tmp_path / "elsewhere")  # one encoder left: its panel alone
    (out / "comparisons.csv").unlink()  # no ranking: D of the saved queries
    [alone] = html.run_report(out, CONFIG, long, 1.0, no_images=nbrs_mod.FROM_FEATURES).neighbours.panels
    assert (alone.encoder, alone.role) == ("enc_good", "only") and [len(r.strips) for r in alone.rows] == [1] * 4
    assert not report.neighbours.images


def test_an_unreadable_image_costs_its_thumbnail_not_the_report(tmp_path):
    out, man, root, long = make_run(tmp_path)
    victim = html.run_report(out, CONFIG, long, 1.0, manifest=man, image_root=root).neighbours.panels[0].rows[0]
    (root / man.set_index("sample_id").loc[victim.query.sample_id, "path"]).write_bytes(b"not a png")
    report = html.run_report(out, CONFIG, long, 1.0, manifest=man, image_root=root)
    query = report.neighbours.panels[0].rows[0].query
    assert query.png == "" and query.error.startswith("UnidentifiedImageError")
    assert f"title='{query.sample_id}: UnidentifiedImageError" in html.to_html(report)


CROMA_CONFIG = "dataset:\n  name: toy\nstage:\n  name: croma\n  findings: [bio_label]\n  params:\n    k: 4\n    m: 2\n"


def test_croma_anchors_with_os_neighbours_are_shown_under_the_best_and_worst_encoder(tmp_path):
    """Issue 55 item 2, CRoMa: the anchors with the most neighbours of the same centre and another label
    (OS) under the best and the worst encoder by CRoMa, each with its k neighbours as neighbours.parquet
    holds them (type, distance), the same anchor under the other encoder, and the thumbnails the images'."""
    rng = np.random.default_rng(1)
    root = tmp_path / "data"
    (root / "tiles").mkdir(parents=True)
    rows = []
    for lab in range(2):
        for centre in range(2):
            for slide in range(3):
                for t in range(4):
                    i = len(rows)
                    Image.fromarray((rng.random((40, 40)) * 255).astype(np.uint8)).save(root / "tiles" / f"t{i}.png")
                    rows.append((f"t{i:03d}", f"tiles/t{i}.png", f"class{lab}", f"centre{centre}",
                                 f"s{lab}{centre}{slide}"))
    man = pd.DataFrame(rows, columns=["sample_id", "path", "bio_label", "site", "slide_id"])
    lab = (man["bio_label"] == "class1").to_numpy(float)
    site = (man["site"] == "centre1").to_numpy(float)
    noise = rng.standard_normal((len(man), 8)).astype(np.float32)
    biology, centre = noise * 0.3, noise * 0.3
    biology[:, 0] += 2 * lab  # neighbours follow the label: CRoMa high
    centre[:, 0] += 2 * site  # neighbours follow the centre: OS neighbours
    out = tmp_path / "run"
    out.mkdir()
    (out / "config.yaml").write_text(CROMA_CONFIG)
    summaries = []
    for name, feats in (("enc_centre", centre), ("enc_bio", biology)):
        summaries += score_and_save("croma", feats, man, ["bio_label"], {"k": 4, "m": 2}, out, name, "toy")
    which_mod.build(out, n_boot=100)
    long = to_long(pd.concat(summaries, ignore_index=True), "croma", OmegaConf.create(CROMA_CONFIG), out.name)
    report = html.run_report(out, CROMA_CONFIG, long, 1.0, manifest=man, image_root=root)
    section = report.anchors
    assert section is not None and section.k == 4 and section.images
    assert [(p.encoder, p.role) for p in section.panels] == [("enc_bio", "best"), ("enc_centre", "worst")]
    nbrs = {e: pd.read_parquet(out / "results" / e / "toy" / "croma" / "bio_label" / "neighbours.parquet")
            for e in ("enc_bio", "enc_centre")}
    worst = section.panels[1]
    n_os = (nbrs["enc_centre"]["type"] == "OS").groupby(nbrs["enc_centre"]["anchor_id"]).sum()
    assert [r.strips[0].n_os for r in worst.rows] == sorted(n_os, reverse=True)[:len(worst.rows)]
    assert worst.rows[0].strips[0].n_os >= 3  # the centre encoder's anchors are surrounded by OS tiles
    for row in worst.rows:
        for strip in row.strips:
            want = nbrs[strip.encoder][nbrs[strip.encoder]["anchor_id"] == row.anchor.sample_id].sort_values("rank")
            got = [(t.sample_id, kind) for t, kind in strip.neighbours]
            assert got == list(zip(want["neighbour_id"], want["type"]))
            assert [t.caption for t, _ in strip.neighbours] == [f"{v:.3f}" for v in want["distance"]]
    page = html.to_html(report)
    assert "<h2>Neighbourhoods: anchors that follow the centre</h2>" in page
    assert "## Neighbourhoods: anchors that follow the centre" in html.to_markdown(report, out)
    shown = dict(IMG.findall(page[page.index("anchors that follow the centre"):]))
    anchor = worst.rows[0].anchor.sample_id
    got = np.asarray(Image.open(io.BytesIO(base64.b64decode(shown[anchor]))))
    np.testing.assert_array_equal(got, expected_thumbnail(root, {"sample_id": anchor,
                                                                **man.set_index("sample_id").loc[anchor].to_dict()}))
