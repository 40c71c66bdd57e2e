"""Every shipped config composes, every group option is a registered name, and the plan of each
experiment resolves (the dry run) without touching data or models."""
from pathlib import Path

import pytest
from hydra import compose, initialize_config_dir
from hydra.core.config_store import ConfigStore
from hydra.core.global_hydra import GlobalHydra
from omegaconf import OmegaConf

from robustbench_fm import data, encoders
from robustbench_fm import methods as stages
from robustbench_fm.cli.main import CONFIG_DIR, listing
from robustbench_fm.methods.params import config_node, field_docs
from robustbench_fm.pipeline import configstore
from robustbench_fm.pipeline.job import load_manifest
from robustbench_fm.pipeline.plan import plan

EXPERIMENTS = sorted(p.stem for p in (CONFIG_DIR / "experiment").glob("*.yaml"))
REQUIRED = {"from_features": ["features_file=f.parquet", "manifest_file=m.csv", "stage.findings=[marker]"]}


def compose_cfg(overrides, tmp_path):
    with initialize_config_dir(config_dir=str(CONFIG_DIR), version_base="1.3"):
        return compose("config", overrides=[f"paths.root={tmp_path}", *overrides])


@pytest.mark.parametrize("experiment", EXPERIMENTS)
def test_every_experiment_composes_and_plans(experiment, tmp_path):
    cfg = compose_cfg([f"experiment={experiment}", f"dataset.root={tmp_path}", *REQUIRED.get(experiment, [])],
                      tmp_path)
    OmegaConf.to_yaml(cfg, resolve=True)
    hub_code = [n for n in cfg.get("encoders") or [cfg.encoder.name] if encoders.get(str(n)).trust_remote_code]
    if hub_code:  # a panel holding hub-code entries (the CRoMa panels) plans only with the user's consent
        with pytest.raises(encoders.RemoteCodeRefused, match="security.allow_remote_code=true"):
            plan(cfg)
        cfg = compose_cfg([f"experiment={experiment}", f"dataset.root={tmp_path}", *REQUIRED.get(experiment, []),
                           "security.allow_remote_code=true"], tmp_path)
    job = plan(cfg)
    assert job.stage in stages.names()
    assert job.findings


def test_group_options_match_the_registries():
    # the encoder options are generated from the registry (robustbench_fm/pipeline/configstore.py): what
    # Hydra offers for `encoder=` is the registry, and each option names its own entry
    with initialize_config_dir(config_dir=str(CONFIG_DIR), version_base="1.3"):
        options = GlobalHydra.instance().config_loader().get_group_options("encoder")
    # plus the generic entries, a model id instead of a registry entry (encoders/generic.py)
    assert sorted(options) == sorted([*encoders.names(), "hf", "open_clip", "timm"])
    for name in options:
        assert ConfigStore.instance().load(f"encoder/{name}.yaml").node.name == name
    for p in (CONFIG_DIR / "dataset").glob("*.yaml"):
        assert OmegaConf.load(p).name in data.names()
    assert sorted(configstore.nodes("stage")) == stages.names()


def test_stage_configs_are_generated_from_the_registry():
    """Every registered stage has a generated ``stage/<name>`` node (no YAML file): its name, the
    method's findings default and the parameter class's config node; every parameter is documented."""
    assert not (CONFIG_DIR / "stage").exists()
    nodes = configstore.nodes("stage")
    assert list(nodes) == stages.names()
    for name, node in nodes.items():
        method = stages.method(name)
        assert issubclass(method.params, stages.get(name).PARAMS)  # mlp_head: a subclass of the linear head's
        assert list(node) == ["name", "findings", "params"] and node["name"] == name
        assert node["findings"] == (method.findings if isinstance(method.findings, str) else list(method.findings))
        assert node["params"] == config_node(method.params)
        docs = field_docs(method.params)
        assert all(len(doc) > 10 for doc in docs.values()), [n for n, d in docs.items() if len(d) <= 10]
    with initialize_config_dir(config_dir=str(CONFIG_DIR), version_base="1.3"):
        for name in stages.names():
            cfg = compose("config", overrides=[f"stage={name}"])
            assert OmegaConf.to_container(cfg.stage) == nodes[name]


def test_demo_is_the_default_and_explicit_encoder_wins(tmp_path):
    cfg = compose_cfg([], tmp_path)
    assert plan(cfg).encoders == ["planted_blur", "planted_sharp", "random_vit_s"]
    override = ["dataset=planted", "encoder=planted_sharp", "stage=candor"]
    cfg = compose_cfg(override, tmp_path)
    assert plan(cfg, override).encoders == ["planted_sharp"]
    assert Path(cfg.dataset.root) == tmp_path / "outputs" / "demo_data" / "planted"


def test_unknown_names_fail_with_a_suggestion(tmp_path):
    cfg = compose_cfg(["encoders=[planted_blurr]"], tmp_path)
    with pytest.raises(KeyError, match="did you mean planted_blur"):
        plan(cfg)


def test_listing_names_every_registry():
    text = listing()
    for name in encoders.names() + data.names() + stages.names() + EXPERIMENTS:
        assert name in text


@pytest.mark.parametrize("launcher, target", [
    ("local", "BasicLauncher"), ("joblib", "JoblibLauncher"), ("slurm", "SlurmLauncher"),
    ("submitit_local", "LocalLauncher")])
def test_every_launcher_composes_with_its_plugin(launcher, target, tmp_path):
    with initialize_config_dir(config_dir=str(CONFIG_DIR), version_base="1.3"):
        cfg = compose("config", overrides=[f"paths.root={tmp_path}", f"launcher={launcher}"],
                      return_hydra_config=True)
    assert cfg.hydra.launcher._target_.endswith(target)
    assert cfg.hydra.callbacks.collect._target_ == "robustbench_fm.cli.sweeps.CollectCallback"
    if launcher == "slurm":
        assert cfg.hydra.launcher.gpus_per_node == 1 and cfg.hydra.launcher.array_parallelism == 32


def test_experiments_pick_their_panel_and_a_panel_override_wins(tmp_path):
    chest = OmegaConf.load(CONFIG_DIR / "panel" / "candor_chest.yaml").encoders
    cfg = compose_cfg(["experiment=chest_candor", f"dataset.root={tmp_path}"], tmp_path)
    assert plan(cfg).encoders == list(chest)
    cfg = compose_cfg(["panel=candor_chest"], tmp_path)  # on the default (demo) experiment
    assert plan(cfg).encoders == list(chest)


def test_paths_resolve_to_the_launch_folder_without_a_hydra_job(tmp_path, monkeypatch):
    """paths.root is the folder the command runs from, also where no Hydra job config is set: the
    sweep folder of a multirun (built before any job) and configs composed with the compose API."""
    monkeypatch.chdir(tmp_path)
    with initialize_config_dir(config_dir=str(CONFIG_DIR), version_base="1.3"):
        cfg = compose("config", return_hydra_config=True)
    assert cfg.paths.root == str(tmp_path)
    assert cfg.paths.cache_dir == str(tmp_path / "outputs" / "cache" / "features")
    assert Path(cfg.hydra.sweep.dir).parent.parent == tmp_path / "outputs" / "multirun"
    assert Path(cfg.hydra.run.dir).parent.parent == tmp_path / "outputs" / "runs"


def test_a_dataset_with_empty_options_builds_its_manifest(tmp_path):
    """`options: {}` (CUB's card) is an empty DictConfig; it once failed as 'Input cfg is not an
    OmegaConf config object' before any image was read."""

    from fixtures_natural import CUB_CLASSES, write_cub

    write_cub(tmp_path / "cub", per_class=3)
    cfg = compose_cfg(["dataset=cub", f"dataset.root={tmp_path / 'cub'}", "encoder=planted_blur"], tmp_path)
    assert OmegaConf.to_container(cfg.dataset.options) == {}
    manifest = load_manifest(plan(cfg, ["encoder=planted_blur"]))
    assert len(manifest) == 3 * len(CUB_CLASSES)


@pytest.mark.parametrize("override, message", [
    ("+stage.params.kk=3", "candor: unknown parameter stage.params.kk; did you mean k?"),
    ("stage.params.k=0", "candor: k=0 must be at least 1"),
])
def test_the_plan_parses_the_stage_parameters_once_in_one_line(override, message, tmp_path):
    cfg = compose_cfg([override], tmp_path)
    with pytest.raises(ValueError) as err:
        plan(cfg, [override])
    assert str(err.value) == message


def test_a_stage_override_is_checked_against_the_generated_options():
    from robustbench_fm.cli.main import check_overrides

    assert check_overrides(["stage=candr"]) == "unknown stage 'candr'; did you mean candor? (in override 'stage=candr')"
    assert check_overrides(["stage=croma", "stage.params.k=3"]) is None
    assert check_overrides(["bank_size=10"]) == (
        "there is no setting 'bank_size' (in override 'bank_size=10'); did you mean stage.params.bank_size=10?")


def test_the_spar_sample_options_override_as_the_docs_write_them(tmp_path):
    """``dataset.options.distance_rule=...`` (docs/methods/spar.md) composes without ``+`` on every
    SPAR cohort's card and on the demo's zero-shot cohort, and each card's sample options are those
    ``build_samples`` accepts, at its defaults: the paper's distance rule (``varying``, issue 42 item
    4) on WORD and TotalSegmentator, in every paper experiment and the command line's zero-shot cohort;
    ``random`` only on the demo's phantoms (its card and its zero-shot cohort)."""
    from robustbench_fm.data.ct.layouts import SAMPLE_OPTIONS, sample_options

    assert SAMPLE_OPTIONS["distance_rule"] == "varying"
    for dataset, rule in (("word", "varying"), ("totalsegmentator", "varying"), ("spar_phantom_word", "random")):
        cfg = compose_cfg([f"dataset={dataset}", "dataset.options.distance_rule=random",
                           "dataset.options.distance_questions=4"], tmp_path)
        assert (cfg.dataset.options.distance_rule, cfg.dataset.options.distance_questions) == ("random", 4)
        card = dict(compose_cfg([f"dataset={dataset}"], tmp_path).dataset.options)
        opts = sample_options(dataset, card)
        assert (opts["distance_questions"], opts["distance_rule"]) == (SAMPLE_OPTIONS["distance_questions"], rule)
    for experiment in ("spar_word", "spar_vqa", "spar_ablation_pooled_tokens"):
        cfg = compose_cfg([f"experiment={experiment}"], tmp_path)
        assert sample_options("word", dict(cfg.dataset.options))["distance_rule"] == "varying"
        for spec in (cfg.stage.params.get("transfer") or {}).values():
            assert sample_options(spec.dataset, dict(spec.options or {}))["distance_rule"] == "varying"
    cfg = compose_cfg(["experiment=spar_demo", "dataset.options.distance_rule=varying",
                       "stage.params.transfer.totalsegmentator.options.distance_rule=varying"], tmp_path)
    assert cfg.dataset.options.distance_rule == "varying" and cfg.dataset.options.distance_questions == 8
    assert cfg.stage.params.transfer.totalsegmentator.options.distance_rule == "varying"
