"""Dataset cards: every adapter of this family has one that agrees with its registry entry, and
check() warns once per count that a manifest misses."""
import inspect

import pandas as pd
import pytest
from omegaconf import OmegaConf

from robustbench_fm import data
from robustbench_fm.data.cards import CONFIG_DIR, check, load_card

NAMES = ("nct_crc", "pcam", "cub", "fgvc_aircraft", "fairvision", "aptos", "messidor2", "idrid",
         "fitzpatrick17k", "isic2019", "ddi", "vindr_mammo")


@pytest.mark.parametrize("name", NAMES)
def test_card_matches_the_adapter(name):
    cfg = OmegaConf.load(CONFIG_DIR / "dataset" / f"{name}.yaml")
    adapter = data.get(name)
    # natural datasets have no 0/1 finding: their task is the class-name column (CANDOR one-vs-family)
    tasks = list(adapter.findings) or (["bio_label"] if name in ("cub", "fgvc_aircraft") else [])
    assert cfg.name == name and list(cfg.findings) == tasks
    assert OmegaConf.to_container(cfg, resolve=False)["root"] == "${paths.data_dir}/" + name
    card = load_card(name)
    assert (card["access"], card["licence"], card["citation"]) == (adapter.access, adapter.licence, adapter.citation)
    assert set(card["expected"]) == {"images", "patients", "positives"} and card["source"]
    assert set(card["expected"]["positives"]) <= set(adapter.findings)
    assert set(cfg.options) <= set(inspect.signature(adapter.build).parameters) - {"root"}


def manifest():
    return pd.DataFrame({"sample_id": list("abcd"), "patient_id": ["p1", "p1", "p2", "p3"],
                         "tumour": [1.0, 0.0, 1.0, float("nan")]})


def test_check_is_silent_when_every_count_matches():
    card = {"expected": {"images": 4, "patients": 3, "positives": {"tumour": 2}}, "source": "paper"}
    assert check(manifest(), card, "nct_crc@/data") == []


def test_check_warns_once_per_mismatch_and_skips_nulls():
    card = {"expected": {"images": 5, "patients": 3, "positives": {"tumour": 3, "glaucoma": 1, "edema": None}},
            "source": "Kather 2019"}
    warnings = check(manifest(), card, "nct_crc@/data")
    assert len(warnings) == 3
    assert warnings[0].startswith("nct_crc@/data: the number of images is 4 but the dataset card expects 5 "
                                  "(Kather 2019)")
    assert "'tumour' positives is 2 but the dataset card expects 3" in warnings[1]
    assert "finding column 'glaucoma' missing" in warnings[2]
    assert check(manifest(), {"expected": {"images": None, "patients": 2}}, "x") == [
        "x: the number of patients is 3 but the dataset card expects 2 (no source given); check that the "
        "download is complete and the options select the whole dataset"]


def test_load_card_names_the_missing_file():
    with pytest.raises(FileNotFoundError, match="configs/dataset/no_such_set.yaml"):
        load_card("no_such_set")


def test_card_errors_are_user_error_subclasses():
    from robustbench_fm.core.errors import MissingInput, UnknownName
    from robustbench_fm.data.cards import card_field

    with pytest.raises(MissingInput) as err:
        load_card("no_such_set")
    assert isinstance(err.value, FileNotFoundError) and "add configs/dataset/no_such_set.yaml" in str(err.value)
    with pytest.raises(UnknownName) as err:
        card_field("nct_crc", "licens")
    assert str(err.value) == "'licens' is not a card text field; one of access, licence, citation"
