"""The pool adapter (data/pool.py): the five chest sites in their real layouts as one manifest."""
from __future__ import annotations

import numpy as np
import pandas as pd
import pytest
from chest_fixtures import write_chexpert, write_mimic_cxr, write_padchest, write_vindr_cxr, write_vindr_pcxr
from omegaconf import OmegaConf

from robustbench_fm.data import build_manifest
from robustbench_fm.data.cards import CONFIG_DIR
from robustbench_fm.data.images import read_image
from robustbench_fm.data.pool import PoolError

SITES = {"mimic_cxr": ("mimic-cxr-jpg/2.1.0", write_mimic_cxr), "chexpert": ("CheXpert-v1.0-small", write_chexpert),
         "padchest": ("padchest", write_padchest), "vindr_cxr": ("vindr-cxr/1.0.0", write_vindr_cxr),
         "vindr_pcxr": ("vindr-pcxr/1.0.0", write_vindr_pcxr)}


@pytest.fixture(scope="module")
def data_dir(tmp_path_factory):
    root = tmp_path_factory.mktemp("data")
    for folder, write in SITES.values():
        write(root / folder)
    return root


def _chest_pool_members() -> list[dict]:
    """The members of the shipped configs/dataset/chest_pool.yaml."""
    return OmegaConf.to_container(OmegaConf.load(CONFIG_DIR / "dataset" / "chest_pool.yaml").options.members)


def test_chest_pool_is_the_union_of_the_five_sites(data_dir):
    members = _chest_pool_members()
    assert [m["dataset"] for m in members] == list(SITES)
    pooled = build_manifest("pool", data_dir, members=members)
    singles = {m["dataset"]: build_manifest(m["dataset"], data_dir / m["root"], **m["options"]) for m in members}
    assert len(pooled) == sum(len(s) for s in singles.values())
    for name, single in singles.items():
        part = pooled[pooled["dataset"] == name].reset_index(drop=True)
        assert list(part["sample_id"]) == [f"{name}/{s}" for s in single["sample_id"]]
        assert list(part["patient_id"]) == [f"{name}/{p}" for p in single["patient_id"]]
        assert list(part["acq_group"]) == list(single["acq_group"])  # site x view: matched groups stay per site
        assert list(part["site"]) == list(single["site"])
        # every pooled path reads the same pixels as the member's own path under its root
        pooled_px = np.asarray(read_image(data_dir, part.iloc[0].to_dict()))
        own_px = np.asarray(read_image(data_dir / SITES[name][0], single.iloc[0].to_dict()))
        assert np.array_equal(pooled_px, own_px)
    assert pooled["sample_id"].is_unique
    assert set(pooled["acq_group"]) == set().union(*(set(s["acq_group"]) for s in singles.values()))


def test_member_outside_the_pool_root_is_refused(data_dir, tmp_path):
    with pytest.raises(PoolError, match=r"member chexpert's root .* is not under the pool's root") as err:
        build_manifest("pool", tmp_path,
                       members=[{"dataset": "chexpert", "root": str(data_dir / "CheXpert-v1.0-small")}])
    assert "dataset.root" in str(err.value) and "\n" not in str(err.value)


@pytest.mark.parametrize("members, message", [
    ([], "no members"),
    ([{"dataset": "chexpert", "root": "CheXpert-v1.0-small"}, {"dataset": "chexpert", "root": "x"}], "listed twice"),
    ([{"dataset": "chexpert", "folder": "x"}], "unknown key(s) ['folder']"),
    ([{"dataset": "chexpert", "root": "nowhere"}], "member chexpert's root"),
])
def test_bad_members_fail_in_one_line(data_dir, members, message):
    with pytest.raises((PoolError, FileNotFoundError)) as err:
        build_manifest("pool", data_dir, members=members)
    assert message in str(err.value) and "\n" not in str(err.value)


def test_pool_columns_union_keeps_missing_findings_unlabelled(data_dir):
    members = _chest_pool_members()[:2]
    pooled = build_manifest("pool", data_dir, members=members)
    assert isinstance(pooled, pd.DataFrame) and set(pooled["dataset"]) == {"mimic_cxr", "chexpert"}


def test_a_missing_member_root_is_a_user_error_naming_the_option(data_dir):
    from robustbench_fm.core.errors import UserError
    from robustbench_fm.data.files import DatasetFileMissing

    with pytest.raises(DatasetFileMissing) as err:
        build_manifest("pool", data_dir, members=[{"dataset": "chexpert", "root": "nowhere"}])
    assert isinstance(err.value, (UserError, FileNotFoundError))
    assert str(err.value) == (f"dataset pool: member chexpert's root '{data_dir / 'nowhere'}' does not exist; "
                              "set its root in dataset.options.members")
