"""robustbench_fm.pipeline.plan: plan() is the one reader of a job's config. The Plan of a composed
config holds the typed values the config sets (and plans again to itself from the config.yaml it
writes); a bad setting is one line naming its key before any data is read."""
import dataclasses
from pathlib import Path

import pytest
from omegaconf import OmegaConf
from plan_fixtures import OVERRIDES, compose_job

from robustbench_fm.core.errors import InvalidSetting, MissingInput
from robustbench_fm.core.redact import redact_config, redacted_yaml
from robustbench_fm.methods.candor.params import CandorParams
from robustbench_fm.pipeline.plan import EncoderSettings, ExtractOptions, Paths, ReportOptions, plan


def test_the_plan_of_a_composed_config_holds_its_typed_values(tmp_path):
    cfg = compose_job(tmp_path)
    p = plan(cfg, OVERRIDES, multirun=True, experiment="demo")
    out = tmp_path / "outputs"
    assert (p.dataset, p.root, p.encoders, p.stage, p.findings, p.features_file) == (
        "planted", out / "demo_data" / "planted", ["planted_sharp"], "candor", ["marker"], None)
    assert (p.resolution, p.fixed_sample, p.seed, p.multirun, p.experiment) == (224, 5, 3, True, "demo")
    # the stage's typed parameters, parsed once from the config (issue 56: the object the stage receives)
    assert p.params == CandorParams.parse(OmegaConf.to_container(cfg.stage.params, resolve=True)) and p.params.k == 3
    assert p.dataset_options == {"n": 40, "size": 224, "seed": 0} and p.generate and p.verify_images
    assert p.paths == Paths(out / "cache" / "features", out / "cache" / "prepared")
    assert p.extract == ExtractOptions(batch_size=7, num_workers="auto", shard_size=1024, on_bad_image="skip",
                                       num_shards=1, shard=0, device="cpu", allow_remote_code=False)
    assert p.encoder == EncoderSettings("planted_sharp", batch_size=3)
    assert p.swept_encoders == ("planted_blur", "planted_sharp", "random_vit_s")  # configs/panel/demo.yaml
    assert p.report == ReportOptions((), scan=True) and p.cli_overrides == tuple(OVERRIDES) and p.manifest_file is None
    # config.yaml as it has always been written: the resolved config, secrets masked
    assert p.config == redact_config(cfg) and p.config_yaml == redacted_yaml(cfg)
    # re-planned from the config.yaml it writes (what a sweep's collect step does): the same plan
    # the parameters set through a top-level key, for error messages: only the composed config knows them
    assert p.param_overrides == {"seed": "seed", "device": "device"}
    again = plan(OmegaConf.create(p.config_yaml), OVERRIDES, multirun=True, experiment="demo")
    assert again.param_overrides == {} and dataclasses.replace(again, param_overrides=p.param_overrides) == p


def test_a_bring_your_own_features_plan_names_the_users_files(tmp_path):
    overrides = ["experiment=from_features", f"features_file={tmp_path / 'feats.parquet'}",
                 f"manifest_file={tmp_path / 'mine.csv'}", "stage.findings=[marker]"]
    p = plan(compose_job(tmp_path, overrides), overrides)
    assert (p.dataset, p.encoders, p.features_file, p.manifest_file) == (
        "mine", ["feats"], tmp_path / "feats.parquet", tmp_path / "mine.csv")
    assert p.root is None and p.findings == ["marker"]
    assert p.describe().splitlines()[1:2] == [  # the dry run's words
        f"  data     features {tmp_path / 'feats.parquet'}, manifest {tmp_path / 'mine.csv'}"]
    assert f"  cache    {tmp_path / 'outputs' / 'cache' / 'features'}" in p.describe().splitlines()


def test_a_missing_root_under_the_data_folder_names_paths_data_dir(tmp_path):
    overrides = ["dataset=chexpert", "encoder=planted_blur"]
    with pytest.raises(MissingInput) as err:
        plan(compose_job(tmp_path, overrides), overrides)
    assert str(err.value) == (
        f"dataset 'chexpert': root '{Path(tmp_path) / 'data' / 'CheXpert-v1.0-small'}' does not exist; set "
        "paths.data_dir=<folder holding CheXpert-v1.0-small> (where every dataset's folder is looked for) or "
        "dataset.root=<folder holding the dataset>")


@pytest.mark.parametrize("override, text", [
    ("extract.batch_size=0", "extract.batch_size=0: use a whole number >= 1"),
    ("extract.shard_size=abc", "extract.shard_size='abc': use a whole number >= 1"),
    ("extract.num_workers=-1", "extract.num_workers=-1: use a whole number >= 0"),
    ("extract.on_bad_image=maybe", "extract.on_bad_image='maybe': use error or skip"),
    ("extract.decode=fast", "extract.decode='fast': use scaled"),
    ("resolution=abc", "resolution='abc': use native"),
])
def test_a_bad_extraction_setting_is_the_users_error_named_by_its_key_before_any_data_is_read(tmp_path, override,
                                                                                              text):
    cfg = compose_job(tmp_path, ["experiment=demo", override])
    with pytest.raises(InvalidSetting) as err:  # a UserError: one line, not "a bug in robustbench_fm"
        plan(cfg, [override])
    assert str(err.value).startswith(text)
    assert not (tmp_path / "outputs" / "demo_data").exists()  # planned before the dataset is generated


def test_a_panel_naming_an_encoder_twice_is_refused_by_the_plan_naming_encoders(tmp_path):
    """Issue 54 item 14: ``encoders=[a,a]`` was refused only after the manifest was read, as the
    extraction's "extract_panel: encoder names repeat"."""
    overrides = ["experiment=demo", "encoders=[planted_sharp,planted_blur,planted_sharp]"]
    with pytest.raises(InvalidSetting) as err:
        plan(compose_job(tmp_path, overrides), overrides)
    assert str(err.value) == ("encoders=[planted_sharp,planted_blur,planted_sharp] names planted_sharp more than "
                              "once; list each encoder once: encoders=[planted_sharp,planted_blur]")
    assert not (tmp_path / "outputs" / "demo_data").exists()  # before the dataset is generated


def test_a_hub_code_entry_is_refused_by_the_plan_before_any_data_is_read(tmp_path):
    """Issue 54 item 8: an entry that runs its authors' hub code is refused by plan() (one line naming
    security.allow_remote_code), not after the dataset was read and the other encoders extracted."""
    from robustbench_fm.encoders import RemoteCodeRefused

    overrides = ["experiment=demo", "encoders=[planted_sharp,hibou_b]"]
    with pytest.raises(RemoteCodeRefused, match=r"^encoder 'hibou_b' runs its authors' code .* add "
                                                 r"security.allow_remote_code=true"):
        plan(compose_job(tmp_path, overrides), overrides)
    assert not (tmp_path / "outputs" / "demo_data").exists()  # before the dataset is generated
    allowed = [*overrides, "security.allow_remote_code=true"]
    assert plan(compose_job(tmp_path, allowed), allowed).encoders[-1] == "hibou_b"


@pytest.mark.parametrize("override, text", [
    ("seed=abc", "candor: seed=abc must be an integer (default: 42)"),  # the key typed, not stage.params.seed
    ("stage.params.seed=abc", "candor: stage.params.seed=abc must be an integer (default: 42)"),
])
def test_a_bad_stage_parameter_is_named_by_the_key_the_user_typed(tmp_path, override, text):
    """Issue 54 item 14: ``seed=abc`` was named ``stage.params.seed``, a key the user did not type."""
    with pytest.raises(InvalidSetting) as err:
        plan(compose_job(tmp_path, ["experiment=demo", override]), [override])
    assert str(err.value) == text


def test_the_saved_config_of_a_run_names_the_encoders_that_ran(tmp_path):
    """Issue 54 item 15: a run with ``encoder=planted_sharp`` saved (and its report showed) the
    demo panel's three encoders as its ``encoders``; a sweep's job keeps the panel it fans out."""
    overrides = ["experiment=demo", "encoder=planted_sharp"]
    cfg = compose_job(tmp_path, overrides)
    one = plan(cfg, overrides)
    assert one.encoders == one.config["encoders"] == ["planted_sharp"]
    assert OmegaConf.create(one.config_yaml).encoders == ["planted_sharp"]
    assert plan(OmegaConf.create(one.config_yaml)).encoders == ["planted_sharp"]  # a collect step's plan of it
    assert plan(cfg, overrides, multirun=True).config["encoders"] == ["planted_blur", "planted_sharp", "random_vit_s"]
    demo = plan(compose_job(tmp_path, ["experiment=demo"]), ["experiment=demo"])
    assert demo.config["encoders"] == demo.encoders == ["planted_blur", "planted_sharp", "random_vit_s"]
    generic = ["experiment=demo", "encoder=timm", "encoder.model=vit_tiny_patch16_224", "encoder.weights=random"]
    p = plan(compose_job(tmp_path, generic), generic)
    assert p.config["encoders"] == ["timm"]  # the entry, which plans again in a fresh process
    assert plan(OmegaConf.create(p.config_yaml)).encoders == p.encoders
