"""Issue 54, ``dataset=csv``: CheXpert-style labels (item 6), label files in other encodings
(item 9), symbolic links out of the root (item 7), ``;``-separated files and ``\\`` paths (item 14)."""
from __future__ import annotations

import codecs
import logging
import os

import numpy as np
import pandas as pd
import pytest
from PIL import Image

from robustbench_fm import data
from robustbench_fm.data import csv_manifest
from robustbench_fm.data.manifest import ManifestError
from robustbench_fm.pipeline.resolvers import csv_findings

CHEXPERT_STYLE = "path,Pneumothorax,male,age\na.png,1,1,30\nb.png,-1,0,40\nc.png,,1,50\nd.png,0,0,60\ne.png,-1,1,70\n"


def _write(tmp_path, text: str, name: str = "labels.csv"):
    path = tmp_path / name
    path.write_text(text)
    return path


def _build(tmp_path, path, **options):
    return data.build_manifest("csv", tmp_path, verify_images=False, manifest=path, **options)


def test_a_chexpert_column_is_a_finding_and_a_demographic_0_1_column_is_not(tmp_path):
    """Before: Pneumothorax (-1/0/1/blank) skipped, ``male`` scored as the finding, nothing said."""
    path = _write(tmp_path, CHEXPERT_STYLE)
    assert csv_manifest.finding_columns(path) == ["Pneumothorax"]
    assert csv_findings(str(path)) == ["Pneumothorax"]
    taken, skipped = csv_manifest.classify_columns(pd.read_csv(path))
    assert skipped == {"male": "a demographic column; name it in dataset.findings to score it", "age": "value '30'"}


def test_minus_one_without_a_convention_is_refused_naming_the_column_and_the_key(tmp_path):
    path = _write(tmp_path, CHEXPERT_STYLE)
    with pytest.raises(ManifestError) as err:
        _build(tmp_path, path, finding_columns=["Pneumothorax"])
    assert str(err.value) == (
        f"{path}: column 'Pneumothorax' holds -1 (uncertain, as in CheXpert's labels) in 2 rows, first row 1; set "
        "dataset.uncertain=zero (read as negative; also what a +1/-1 coding needs), one (positive) or drop "
        "(unlabelled), or leave the column out with dataset.findings=[...]")


@pytest.mark.parametrize("uncertain, blank, want", [
    ("zero", None, [1, 0, None, 0, 0]), ("one", None, [1, 1, None, 0, 1]), ("drop", None, [1, None, None, 0, None]),
    ("zero", "negative", [1, 0, 0, 0, 0]), ("drop", "negative", [1, None, 0, 0, None]),
])
def test_the_uncertainty_conventions(tmp_path, uncertain, blank, want):
    """U-Zeros, U-Ones, U-Ignore (drop: unlabelled); blank (not mentioned) unlabelled by default."""
    path = _write(tmp_path, CHEXPERT_STYLE)
    m = _build(tmp_path, path, finding_columns=["Pneumothorax"], uncertain=uncertain, blank=blank)
    got = [None if np.isnan(v) else int(v) for v in m["Pneumothorax"]]
    assert got == want


def test_every_run_logs_which_columns_are_findings_and_why_the_others_are_not(tmp_path, caplog):
    path = _write(tmp_path, CHEXPERT_STYLE)
    with caplog.at_level(logging.INFO, logger="robustbench_fm.data"):
        _build(tmp_path, path, finding_columns=csv_manifest.finding_columns(path), uncertain="zero")
        _build(tmp_path, path, finding_columns=["Pneumothorax", "male"], uncertain="one", blank="negative")
    lines = [r.getMessage() for r in caplog.records if "findings" in r.getMessage()]
    assert lines == [
        f"{path}: findings 'Pneumothorax' (auto-detected: columns of 1, 0, -1 or empty); skipped: 'male' (a "
        "demographic column; name it in dataset.findings to score it), 'age' (value '30'); -1 (uncertain) 2 in "
        "'Pneumothorax' read as dataset.uncertain=zero; blank = unlabelled (dataset.blank)",
        f"{path}: findings 'Pneumothorax', 'male' (dataset.findings); skipped: 'age' (not in dataset.findings); -1 "
        "(uncertain) 2 in 'Pneumothorax' read as dataset.uncertain=one; blank = negative (dataset.blank)"]


def test_an_unknown_convention_is_one_line(tmp_path):
    path = _write(tmp_path, CHEXPERT_STYLE)
    with pytest.raises(ManifestError, match=r"^dataset.uncertain='maybe': use one of zero, one, drop "):
        _build(tmp_path, path, finding_columns=["Pneumothorax"], uncertain="maybe")


def test_the_cli_config_passes_dataset_uncertain_and_blank(tmp_path):
    from hydra import compose, initialize_config_dir

    from robustbench_fm.cli.main import CONFIG_DIR

    path = _write(tmp_path, CHEXPERT_STYLE)
    with initialize_config_dir(config_dir=str(CONFIG_DIR), version_base="1.3"):
        cfg = compose("config", overrides=["dataset=csv", f"dataset.manifest={path}", "dataset.uncertain=drop"])
    assert list(cfg.dataset.findings) == ["Pneumothorax"]
    assert cfg.dataset.options.uncertain == "drop" and cfg.dataset.options.blank is None
    m = data.build_manifest("csv", tmp_path, verify_images=False, **dict(cfg.dataset.options))
    assert m["Pneumothorax"].isna().sum() == 3


TEXT = "path,marker,note\na.png,1,café\nb.png,0,naïve\n"


@pytest.mark.parametrize("encoding, data_bytes, said", [
    ("utf-8-sig", codecs.BOM_UTF8 + TEXT.encode("utf-8"), None),
    ("utf-16 with BOM", TEXT.encode("utf-16"), None),
    ("utf-16-le without BOM", TEXT.encode("utf-16-le"), "utf-16-le"),
    ("cp1252", TEXT.replace("naïve", "naïve – “x”").encode("cp1252"), "cp1252"),
    ("latin-1", TEXT.encode("latin-1") + "c.png,1,\x81\n".encode("latin-1"), "latin-1"),
])
def test_a_label_file_in_another_encoding_is_read(tmp_path, caplog, encoding, data_bytes, said):
    """Before: ``InterpolationResolutionError: UnicodeDecodeError`` from the findings resolver."""
    path = tmp_path / "labels.csv"
    path.write_bytes(data_bytes)
    with caplog.at_level(logging.WARNING, logger="robustbench_fm.data"):
        assert csv_findings(str(path)) == ["marker"]
        m = _build(tmp_path, path, finding_columns=["marker"])
    assert m["note"].iloc[0] == "café" and m["marker"].tolist()[:2] == [1.0, 0.0]
    warned = [r.getMessage() for r in caplog.records if "UTF-8" in r.getMessage()]
    if said is None:
        assert warned == []
    else:  # one line per file, naming the encoding and how to convert
        assert len(warned) == 1 and warned[0].startswith(f"{path}: not UTF-8; read as {said}")
        assert f"iconv -f {said.upper()} -t UTF-8 labels.csv > utf8.csv" in warned[0]


def _png(path):
    path.parent.mkdir(parents=True, exist_ok=True)
    Image.fromarray(np.zeros((20, 20), np.uint8)).save(path)


def test_a_symbolic_link_out_of_the_root_is_refused_naming_the_row_the_path_and_its_target(tmp_path):
    """Before: a link to a system file was opened and a link to an image outside embedded."""
    root, outside = tmp_path / "root", tmp_path / "outside"
    _png(root / "imgs" / "a.png")
    _png(outside / "b.png")
    os.symlink(outside / "b.png", root / "imgs" / "b.png")
    os.symlink("/etc/passwd", root / "imgs" / "c.png")
    os.symlink(outside, root / "linked")
    os.symlink(root / "imgs" / "a.png", root / "imgs" / "same.png")  # inside the root: fine
    for row, rel, target in [(1, "imgs/b.png", outside / "b.png"), (1, "imgs/c.png", os.path.realpath("/etc/passwd")),
                             (1, "linked/b.png", outside / "b.png")]:
        path = _write(tmp_path, f"path,m\nimgs/a.png,0\n{rel},1\nimgs/same.png,1\n")
        with pytest.raises(ManifestError) as err:
            data.build_manifest("csv", root, manifest=path, finding_columns=["m"])
        assert str(err.value) == (
            f"{path}: column 'path', row {row}: '{rel}' is a symbolic link (or lies under one) pointing to "
            f"'{target}', outside dataset.root '{root}'; copy the file into dataset.root, or set dataset.root to a "
            "folder that holds it")
    path = _write(tmp_path, "path,m\nimgs/a.png,0\nimgs/same.png,1\n")
    assert len(data.build_manifest("csv", root, manifest=path, finding_columns=["m"])) == 2


def test_a_semicolon_separated_csv_gets_a_hint(tmp_path):
    path = _write(tmp_path, "path;marker\na.png;1\nb.png;0\n")
    with pytest.raises(ManifestError) as err:
        _build(tmp_path, path, finding_columns=[])
    assert str(err.value).endswith("; the file seems to be separated by ';', not commas (its one column is "
                                   "'path;marker'): save it as comma-separated CSV")
    assert csv_manifest.no_findings_reason(path) == (
        f"{path}: no finding column; the file seems to be separated by ';', not commas (its one column is "
        "'path;marker'): save it as comma-separated CSV")


def test_a_backslash_path_gets_a_hint(tmp_path):
    _png(tmp_path / "imgs" / "a.png")
    path = _write(tmp_path, "path,m\nimgs\\a.png,1\n")
    with pytest.raises(ManifestError) as err:
        data.build_manifest("csv", tmp_path, manifest=path, finding_columns=["m"])
    assert str(err.value) == (f"{path}: column 'path', row 0: 'imgs\\a.png' is written with '\\' (Windows); write the "
                              "paths with '/': 'imgs/a.png'")


def test_a_missing_backslash_path_gets_the_hint_too(tmp_path):
    path = _write(tmp_path, "path,m\nimgs\\nowhere.png,1\n")
    with pytest.raises(FileNotFoundError) as err:
        data.build_manifest("csv", tmp_path, manifest=path, finding_columns=["m"])
    assert "first 'imgs\\nowhere.png' (row 0) (written with '\\': write paths with '/'); fix dataset.root" in str(
        err.value)


def test_every_row_keeps_its_csv_row(tmp_path):
    path = _write(tmp_path, "path,m\na.png,1\nb.png,0\n")
    assert _build(tmp_path, path, finding_columns=["m"])["source_row"].tolist() == [f"{path} row 0", f"{path} row 1"]


def test_an_empty_file_is_one_line_and_no_resolver_crash(tmp_path):
    path = _write(tmp_path, "")
    assert csv_findings(str(path)) == []
    with pytest.raises(ManifestError) as err:
        _build(tmp_path, path, finding_columns=[])
    assert str(err.value) == (f"{path}: not a readable CSV (No columns to parse from file); save it as a "
                              "comma-separated file with a header line")


def test_a_manifest_file_in_utf16_is_read(tmp_path):
    from robustbench_fm.data import manifest

    path = tmp_path / "manifest.csv"
    path.write_bytes("sample_id,path,m\ns1,a.png,1\ns2,b.png,0\n".encode("utf-16"))
    assert manifest.header(path) == ["sample_id", "path", "m"]
    assert manifest.read(path, findings=["m"])["m"].tolist() == [1.0, 0.0]
