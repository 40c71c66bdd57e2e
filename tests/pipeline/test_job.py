"""robustbench_fm.pipeline.job: plan() is the one reader of a job's config. The Plan of a composed
config holds the typed values the config sets (and plans again to itself from the config.yaml it
writes), and no step after plan() takes the config."""
import dataclasses
import inspect
from pathlib import Path

from hydra import compose, initialize_config_dir
from omegaconf import DictConfig, OmegaConf

from robustbench_fm.cli.main import CONFIG_DIR
from robustbench_fm.core.redact import redact_config, redacted_yaml
from robustbench_fm.pipeline import job
from robustbench_fm.pipeline.job import EncoderSettings, ExtractOptions, Paths, Plan, ReportOptions

OVERRIDES = ["experiment=demo", "encoder=planted_sharp", "encoder.batch_size=3", "dataset.options.n=40",
             "stage.params.k=3", "resolution=224", "fixed_sample=5", "seed=3", "extract.batch_size=7",
             "extract.on_bad_image=skip", "device=cpu", "security.allow_remote_code=false"]


def _compose(tmp_path, overrides=OVERRIDES) -> DictConfig:
    with initialize_config_dir(config_dir=str(CONFIG_DIR), version_base="1.3"):
        return compose("config", overrides=[f"paths.root={tmp_path}", *overrides])


def test_the_plan_of_a_composed_config_holds_its_typed_values(tmp_path):
    cfg = _compose(tmp_path)
    p = job.plan(cfg, OVERRIDES, multirun=True, experiment="demo")
    out = tmp_path / "outputs"
    assert (p.dataset, p.root, p.encoders, p.stage, p.findings, p.features_file) == (
        "planted", out / "demo_data" / "planted", ["planted_sharp"], "candor", ["marker"], None)
    assert (p.resolution, p.fixed_sample, p.seed, p.multirun, p.experiment) == (224, 5, 3, True, "demo")
    assert p.params == OmegaConf.to_container(cfg.stage.params, resolve=True) and p.params["k"] == 3
    assert p.dataset_options == {"n": 40, "size": 224, "seed": 0} and p.generate and p.verify_images
    assert p.paths == Paths(out / "cache" / "features", out / "cache" / "prepared")
    assert p.extract == ExtractOptions(batch_size=7, num_workers="auto", shard_size=1024, on_bad_image="skip",
                                       num_shards=1, shard=0, device="cpu", allow_remote_code=False)
    assert p.encoder == EncoderSettings("planted_sharp", batch_size=3)
    assert p.swept_encoders == ("planted_blur", "planted_sharp", "random_vit_s")  # configs/panel/demo.yaml
    assert p.report == ReportOptions(()) and p.cli_overrides == tuple(OVERRIDES) and p.manifest_file is None
    # config.yaml as it has always been written: the resolved config, secrets masked
    assert p.config == redact_config(cfg) and p.config_yaml == redacted_yaml(cfg)
    # re-planned from the config.yaml it writes (what a sweep's collect step does): the same plan
    # the parameters set through a top-level key, for error messages: only the composed config knows them
    assert p.param_overrides == {"seed": "seed", "device": "device"}
    again = job.plan(OmegaConf.create(p.config_yaml), OVERRIDES, multirun=True, experiment="demo")
    assert again.param_overrides == {} and dataclasses.replace(again, param_overrides=p.param_overrides) == p


def test_the_extraction_service_and_the_stage_context_are_built_from_the_plan_alone(tmp_path):
    p = job.plan(_compose(tmp_path), OVERRIDES)
    service = job.embedder(p)
    assert (service.cache_dir, service.device, service.batch_size, service.on_bad_image) == (
        p.paths.cache_dir, "cpu", 7, "skip")
    assert (service.resolution, service.prepared_dir, service.allow_remote_code) == (224, p.paths.prepared_dir, False)
    assert service.batch_size_of("planted_sharp") == 3 and service.batch_size_of("planted_blur") == 7
    assert job.encoder_options(p)[0] == "planted_sharp"
    assert service.decode == p.extract.decode == "scaled"  # configs/config.yaml: extract.decode
    exact = job.plan(_compose(tmp_path, [*OVERRIDES, "extract.decode=exact"]), OVERRIDES)
    assert exact.extract.decode == job.embedder(exact).decode == "exact"


def test_a_bring_your_own_features_plan_names_the_users_files(tmp_path):
    overrides = ["experiment=from_features", f"features_file={tmp_path / 'feats.parquet'}",
                 f"manifest_file={tmp_path / 'mine.csv'}", "stage.findings=[marker]"]
    p = job.plan(_compose(tmp_path, overrides), overrides)
    assert (p.dataset, p.encoders, p.features_file, p.manifest_file) == (
        "mine", ["feats"], tmp_path / "feats.parquet", tmp_path / "mine.csv")
    assert p.root is None and p.findings == ["marker"]
    assert p.describe().splitlines()[1:2] == [  # the dry run's words
        f"  data     features {tmp_path / 'feats.parquet'}, manifest {tmp_path / 'mine.csv'}"]
    assert f"  cache    {tmp_path / 'outputs' / 'cache' / 'features'}" in p.describe().splitlines()


def _functions_after_plan() -> list:
    line = job.plan.__code__.co_firstlineno
    return sorted((f for _, f in inspect.getmembers(job, inspect.isfunction)
                   if f.__module__ == job.__name__ and f.__code__.co_firstlineno > line),
                  key=lambda f: f.__code__.co_firstlineno)


def test_no_step_after_plan_takes_the_config():
    """Every function defined after plan() in pipeline/job.py (the manifest, the extraction
    service, the stage, the results, the report) takes the Plan, never a DictConfig; so do the
    Plan's own methods. The config readers plan() calls and the two entry points that hand a
    config to plan() (run, job_manifest) come before it."""
    after = _functions_after_plan()
    names = {f.__name__ for f in after}
    assert {"embedder", "encoder_options", "_extract_panel", "load_manifest", "job_context", "run_planned",
            "run_stage_on_entries", "_write_report", "_record_part"} <= names
    assert not names & {"run", "job_manifest", "panel", "resolution", "fixed_sample_size", "resolved_prepared_dir"}
    for f in [*after, Plan.describe]:
        for p in inspect.signature(f).parameters.values():
            assert p.name != "cfg" and "DictConfig" not in str(p.annotation), f"{f.__name__}({p.name}: {p.annotation})"
    for name in ("embedder", "encoder_options", "_extract_panel", "load_manifest", "run_planned", "job_context"):
        first = next(iter(inspect.signature(getattr(job, name)).parameters.values()))
        assert first.annotation in ("Plan", Plan), name


def test_a_missing_root_under_the_data_folder_names_paths_data_dir(tmp_path):
    import pytest

    from robustbench_fm.core.errors import MissingInput

    overrides = ["dataset=chexpert", "encoder=planted_blur"]
    with pytest.raises(MissingInput) as err:
        job.plan(_compose(tmp_path, overrides), overrides)
    assert str(err.value) == (
        f"dataset 'chexpert': root '{Path(tmp_path) / 'data' / 'CheXpert-v1.0-small'}' does not exist; set "
        "paths.data_dir=<folder holding CheXpert-v1.0-small> (where every dataset's folder is looked for) or "
        "dataset.root=<folder holding the dataset>")


import pytest  # noqa: E402

from robustbench_fm.core.errors import InvalidSetting  # noqa: E402


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
    cfg = _compose(tmp_path, ["experiment=demo", override])
    with pytest.raises(InvalidSetting) as err:  # a UserError: one line, not "a bug in robustbench_fm"
        job.plan(cfg, [override])
    assert str(err.value).startswith(text)
    assert not (tmp_path / "outputs" / "demo_data").exists()  # planned before the dataset is generated


def test_a_row_scored_in_part_is_not_refused_as_blank():
    """Every row carries a reason: refused when the headline metrics are blank too (CANDOR's
    unscored rows), kept when some headline metric is scored (CRoMa refused on a collapsed
    embedding, its RI and MaRI reported; issue 42 item 3)."""
    import math

    import pandas as pd
    import pytest

    from robustbench_fm.core.errors import InvalidSetting

    reason = "CRoMa not computed (RI and MaRI are): 80/80 units have a zero margin denominator"
    partial = pd.DataFrame([dict(finding="bio_label", ri=0.5, mari=0.5, croma=math.nan, f0=math.nan,
                                 ltm=math.nan, reason=reason)])
    job._refuse_all_blank("croma", partial)  # no error
    blank = partial.assign(ri=math.nan, mari=math.nan)
    with pytest.raises(InvalidSetting, match="none of the 1 result rows could be scored.*CRoMa not computed"):
        job._refuse_all_blank("croma", blank)
