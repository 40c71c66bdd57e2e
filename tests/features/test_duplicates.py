"""An image listed under two sample_ids (issue 54 item 2: one film under two accession numbers):
each positive's nearest positive is its own copy, so a blind encoder looks good. The store hashes
every file anyway; ``extract.duplicates`` (default ``refuse``) refuses such a manifest in one line
naming the rows, or drops all but each image's first sample_id (the result is the deduplicated
run's), or keeps them. On ae38a5a the run went on without a word."""
from __future__ import annotations

import logging
import shutil

import numpy as np
import pandas as pd
import pytest
from hydra import compose, initialize_config_dir

from robustbench_fm.core.errors import InvalidSetting
from robustbench_fm.data.synthetic import generate_planted
from robustbench_fm.features.store import apply_duplicates, duplicate_images

N = 60


@pytest.fixture(scope="module")
def planted(tmp_path_factory):
    root = tmp_path_factory.mktemp("dup")
    folder = generate_planted(root / "planted", n=N, size=64, seed=0)
    labels = pd.read_csv(folder / "labels.csv")
    once = pd.DataFrame({"sample_id": [f"s{i}" for i in range(N)],
                         "path": [f"planted/images/{f}" for f in labels["image"]], "marker": labels["marker"]})
    twice = pd.concat([once, once.assign(sample_id=[f"copy{i}" for i in range(N)])], ignore_index=True)
    once.to_csv(root / "once.csv", index=False)
    twice.to_csv(root / "twice.csv", index=False)
    return root, once, twice


def test_the_same_files_under_other_ids_are_refused_in_one_line(planted, tmp_path):
    root, once, twice = planted
    assert duplicate_images(once, root, tmp_path / "cache") == []
    groups = duplicate_images(twice, root, tmp_path / "cache")
    assert len(groups) == N and [list(g) for g in groups[:2]] == [[0, N], [1, N + 1]]
    with pytest.raises(InvalidSetting) as err:
        apply_duplicates(twice, root, tmp_path / "cache", "refuse", "twice.csv")
    msg = str(err.value)
    first = once["path"][0]
    assert "\n" not in msg and msg.startswith(f"twice.csv: {N} images listed under more than one sample_id "
                                              f"({N} extra sample_ids, {N} rows); first: row 0 '{first}' "
                                              f"(sample_id 's0') = row {N} '{first}' (sample_id 'copy0')")
    assert "extract.duplicates=drop" in msg and "extract.duplicates=keep" in msg


def test_drop_keeps_each_images_first_sample_id_and_keep_keeps_all(planted, tmp_path, caplog):
    root, once, twice = planted
    with caplog.at_level(logging.WARNING, logger="robustbench_fm.features"):
        dropped = apply_duplicates(twice, root, tmp_path / "cache", "drop", "twice.csv")
        kept = apply_duplicates(twice, root, tmp_path / "cache", "keep", "twice.csv")
    pd.testing.assert_frame_equal(dropped, once)
    assert kept is twice
    lines = [r.getMessage() for r in caplog.records]
    assert len(lines) == 2 and "dropped the 60 rows" in lines[0] and "kept (extract.duplicates=keep)" in lines[1]


def test_a_copy_of_a_file_is_the_same_image_and_a_repeated_sample_id_is_not_a_duplicate(planted, tmp_path):
    root, once, _ = planted
    shutil.copy(root / once["path"][3], root / "copy.png")
    rows = pd.concat([once.head(5), pd.DataFrame({"sample_id": ["other"], "path": ["copy.png"], "marker": [0]}),
                      once.head(2).assign(subset="b"),  # a paired design lists an image once per subset
                      pd.DataFrame({"sample_id": ["gone"], "path": ["missing.png"], "marker": [0]})],
                     ignore_index=True)
    assert [list(g) for g in duplicate_images(rows, root, tmp_path / "cache")] == [[3, 5]]
    cropped = rows.assign(crop_left=np.where(rows.index == 5, 2, 0))  # other pixels of the same file
    assert duplicate_images(cropped, root, tmp_path / "cache") == []


def test_a_bad_policy_is_one_line_naming_the_key():
    from robustbench_fm.features.store import check_duplicates

    with pytest.raises(InvalidSetting, match=r"^extract.duplicates='skip': use refuse .*, drop .* or keep$"):
        check_duplicates("skip")


def _run(root, tmp_path, name, csv, *overrides):
    from robustbench_fm.cli import app
    from robustbench_fm.cli.main import CONFIG_DIR

    args = [f"paths.root={tmp_path}", "dataset=csv", f"dataset.manifest={root / csv}", f"dataset.root={root}",
            "encoder=planted_blur", "stage.params.n_boot=50", *overrides]
    with initialize_config_dir(config_dir=str(CONFIG_DIR), version_base="1.3"):
        cfg = compose("config", overrides=args)
    return app.run(cfg, tmp_path / name, args)


@pytest.mark.slow
def test_the_run_refuses_by_default_and_drop_equals_the_deduplicated_run(planted, tmp_path):
    root, _, _ = planted
    with pytest.raises(InvalidSetting, match=r"60 images listed under more than one sample_id"):
        _run(root, tmp_path, "refused", "twice.csv")
    dropped = _run(root, tmp_path, "drop", "twice.csv", "extract.duplicates=drop")
    clean = _run(root, tmp_path, "once", "once.csv")
    assert "duplicates: drop" in (tmp_path / "drop" / "config.yaml").read_text()  # recorded in the run
    value_columns = [c for c in clean.columns if clean[c].dtype.kind in "fiub"]
    pd.testing.assert_frame_equal(dropped[value_columns], clean[value_columns])
    kept = _run(root, tmp_path, "keep", "twice.csv", "extract.duplicates=keep")
    assert not np.allclose(kept["d"].to_numpy(float), clean["d"].to_numpy(float), equal_nan=True)
