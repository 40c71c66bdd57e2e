"""Issue 41 items 7 and 12: SPAR sample builds that fail on the user's volumes are one-line user
errors (no "this is a bug"), and leave no .tmp-<pid> folder in the cache."""
import pytest

from robustbench_fm.core.errors import UserError
from robustbench_fm.data.ct import phantoms
from robustbench_fm.methods.spar.samples import build_samples


def _no_tmp(cache):
    return [p.name for p in (cache / "spar").glob("*.tmp-*")] if (cache / "spar").is_dir() else []


def test_no_slice_with_enough_organs_is_a_user_error_and_leaves_no_tmp_folder(tmp_path):
    root = phantoms.write_phantoms(tmp_path / "word", "word", n_subjects=1, seed=0)
    with pytest.raises(UserError) as err:
        build_samples("word", root, tmp_path / "cache", size=16, n_lits=0, min_organs=9)
    text = str(err.value)
    assert text.startswith(f"dataset 'word' under '{root}': no slice holds min_organs=9 present organs (the most "
                           "on any slice: 8)") and "dataset.options.min_organs" in text and "\n" not in text
    assert _no_tmp(tmp_path / "cache") == []  # before: word-<key>.tmp-<pid> stayed behind


def test_a_missing_totalsegmentator_class_file_is_a_user_error_naming_it(tmp_path):
    root = phantoms.write_phantoms(tmp_path / "ts", "totalsegmentator", n_subjects=1, seed=0)
    gone = next((root).glob("*/segmentations/*.nii.gz"))
    gone.unlink()
    with pytest.raises(UserError) as err:  # a bare FileNotFoundError from stat() before: "a bug"
        build_samples("totalsegmentator", root, tmp_path / "cache", size=16)
    assert f"'{gone}' not found (the volume needs each class file of its segmentations folder)" in str(err.value)
    assert _no_tmp(tmp_path / "cache") == []


def test_a_missing_zero_shot_cohort_names_the_override_that_removes_it(tmp_path):
    """Issue 41 item 12: the fix printed before, stage.params.transfer={}, kept the cohort (Hydra
    merges a mapping); the '~' deletion the message now gives removes it."""
    from hydra import compose, initialize_config_dir

    from robustbench_fm.cli.main import CONFIG_DIR
    from robustbench_fm.core.errors import MissingInput
    from robustbench_fm.methods.spar.stage import _transfer_samples
    from robustbench_fm.pipeline.plan import plan

    spec = {"totalsegmentator": {"dataset": "totalsegmentator", "root": str(tmp_path / "none"), "options": {}}}
    with pytest.raises(MissingInput) as err:
        _transfer_samples(spec, tmp_path / "cache", 42)
    fix = "'~stage.params.transfer.totalsegmentator'"
    assert fix in str(err.value) and "transfer={}" not in str(err.value)
    base = [f"paths.root={tmp_path}", "stage=spar", "encoder=planted_blur"]
    with initialize_config_dir(config_dir=str(CONFIG_DIR), version_base="1.3"):
        kept = compose("config", overrides=[*base, "stage.params.transfer={}"])
        removed = compose("config", overrides=[*base, fix.strip("'")])
    assert "totalsegmentator" in kept.stage.params.transfer  # what the old advice did
    assert plan(removed, [*base, fix.strip("'")]).params.transfer == {}
