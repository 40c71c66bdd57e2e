"""One home for each kind of config (issue 17): the ``encoder`` options are generated from the
encoder registry (robustbench_fm/pipeline/configstore.py), a dataset's access/licence/citation live in
its card (configs/dataset/<name>.yaml) and the adapters read them from there, the eight CANDOR
ablations on MIMIC-CXR + CheXpert share configs/candor_ablation_base.yaml (the box-verified and
unmatched ones are one job over a pool of sites), and experiments choose their encoders only
through the ``panel`` group."""
import pytest
import yaml
from hydra import compose, initialize_config_dir
from omegaconf import OmegaConf

from robustbench_fm import data, encoders
from robustbench_fm.cli.main import CONFIG_DIR, listing
from robustbench_fm.data.cards import CARD_FIELDS
from robustbench_fm.pipeline.plan import plan

EXPERIMENTS = sorted(p.stem for p in (CONFIG_DIR / "experiment").glob("*.yaml"))


def panel_file(name: str) -> list[str]:
    return list(OmegaConf.load(CONFIG_DIR / "panel" / f"{name}.yaml").encoders)


# ----------------------------------------------------------------------------- encoder options

def test_every_encoder_option_is_what_its_yaml_held(tmp_path):
    """Each generated option composes to exactly what configs/encoder/<name>.yaml held before the
    YAMLs were removed (44 of the 48 files were this template; the other 4 differed in a comment
    only), keys in the same order: the run config, the sweep folders (``hydra.runtime.choices``)
    and the feature-cache key (which reads ``encoder.weights`` and the registry entry) are unchanged."""
    with initialize_config_dir(config_dir=str(CONFIG_DIR), version_base="1.3"):
        for name in encoders.names():
            cfg = compose("config", overrides=[f"paths.root={tmp_path}", f"encoder={name}"])
            assert list(cfg.encoder) == ["name", "weights", "batch_size"], name
            assert OmegaConf.to_container(cfg.encoder) == {"name": name, "weights": None, "batch_size": None}
        cfg = compose("config", overrides=[f"paths.root={tmp_path}", "encoder=uni", f"encoder.weights={tmp_path}",
                                           "encoder.batch_size=8"])
        assert OmegaConf.to_container(cfg.encoder) == {"name": "uni", "weights": str(tmp_path), "batch_size": 8}
        cfg = compose("config", overrides=[f"paths.root={tmp_path}", "encoders=[uni,phikon]"],
                      return_hydra_config=True)
        assert plan(cfg).encoders == ["uni", "phikon"]
        assert cfg.hydra.sweeper.params.encoder == "uni,phikon"


def test_the_command_line_checks_know_the_generated_options():
    from robustbench_fm.cli.main import check_overrides

    assert check_overrides(["encoder=planted_sharpp"]) == ("unknown encoder 'planted_sharpp'; did you mean "
                                                           "planted_sharp, planted_blur? (in override "
                                                           "'encoder=planted_sharpp')")
    assert check_overrides(["weights=/w"]) == ("there is no setting 'weights' (in override 'weights=/w'); "
                                               "did you mean encoder.weights=/w?")
    assert check_overrides(["-m", "encoder=uni,phikon", "encoder.weights=/w", "encoder.batch_size=4"]) is None


def test_no_encoder_yaml_copies_the_registry():
    assert not (CONFIG_DIR / "encoder").exists()


def test_the_four_slide_comments_are_registry_fields():
    """gigapath_slide.yaml, moozy.yaml, prism.yaml and titan.yaml differed from the template only in
    their comment, "slide-level aggregator of '<tile encoder>' tile embeddings": the registry's
    ``tile_encoder``."""
    slides = {n: encoders.get(n).tile_encoder for n in encoders.names() if encoders.get(n).is_slide}
    assert slides == {"gigapath_slide": "prov_gigapath", "moozy": "lunit_dino_s8", "prism": "virchow",
                      "titan": "conch_v1_5"}


# ----------------------------------------------------------------------------- dataset cards

@pytest.mark.parametrize("name", data.names())
def test_adapter_card_texts_are_read_from_the_card(name):
    adapter = data.get(name)
    path = CONFIG_DIR / "dataset" / f"{name}.yaml"
    card = OmegaConf.to_container(OmegaConf.load(path)).get("card") if path.is_file() else None
    expected = {k: card[k] for k in CARD_FIELDS} if card else dict.fromkeys(CARD_FIELDS, "")
    assert {k: getattr(adapter, k) for k in CARD_FIELDS} == expected
    # no shipped adapter keeps a second copy in Python
    assert all(adapter.__dict__.get(f"_{k}") is None for k in CARD_FIELDS)


def test_every_real_dataset_card_is_complete():
    for path in sorted((CONFIG_DIR / "dataset").glob("*.yaml")):
        cfg = OmegaConf.load(path)
        if cfg.get("generate") and cfg.get("card") is None:  # planted: generated, no card
            continue
        if path.stem == "csv":  # the user's own data (dataset=csv): nothing to cite or count
            assert cfg.get("card") is None
            continue
        card = cfg.card
        assert all(card.get(k) for k in (*CARD_FIELDS, "source")), path.name
        assert set(card.expected) == {"images", "patients", "positives"}, path.name


def test_list_datasets_shows_the_card_and_an_explicit_value_still_wins():
    text = listing("datasets")
    chexpert = OmegaConf.load(CONFIG_DIR / "dataset" / "chexpert.yaml").card.access
    assert any(line.split()[0] == "chexpert" and line.endswith(f"  {chexpert}") for line in text.splitlines()[2:])
    mine = data.Adapter(name="chexpert", build=lambda root: None, access="my copy")
    assert (mine.access, mine.licence) == ("my copy", data.get("chexpert").licence)


# ----------------------------------------------------------------------------- CANDOR ablations

#: each ablation's sweep (besides the panel's encoders): what it varied before the base existed
ABLATIONS = {
    "bank_size": {"dataset": "mimic_cxr,chexpert", "++stage.params.bank_size": "250,500,1000,2000,4000"},
    "isolated": {"dataset": "mimic_cxr,chexpert", "++stage.params.isolated": "false,true"},
    "k": {"dataset": "mimic_cxr,chexpert", "++stage.params.k": "1,3,5,10,20"},
    "negative": {"dataset": "mimic_cxr,chexpert", "++stage.params.queries": "positive,negative"},
    "patient": {"dataset": "mimic_cxr,chexpert", "++stage.params.exclude_patient": "false,true"},
    "pooling": {"dataset": "mimic_cxr,chexpert", "++encoder.embedding": "cls,patch_mean"},
    "resolution": {"dataset": "mimic_cxr,chexpert", "++ablation.image_size": "224,512"},
    "seed": {"dataset": "mimic_cxr,chexpert", "++stage.params.seed": "range(42,52)"},
}
#: the ablations whose one job spans several datasets (a pool, robustbench_fm/data/pool.py; issue 18):
#: (dataset, stage, findings, sweep besides the encoders, table)
POOL_ABLATIONS = {
    "box_verified": ("pool", "candor_box_verified", ["pneumothorax", "pneumonia"], {}, "candor_box_verified"),
    "unmatched": ("chest_pool", "candor", ["atelectasis", "cardiomegaly"], {"++stage.params.unmatched": "false,true"},
                  "candor_unmatched"),
}


def test_the_ablations_are_the_shipped_ones():
    assert sorted(e.removeprefix("candor_ablation_") for e in EXPERIMENTS if e.startswith("candor_ablation_")) \
        == sorted([*ABLATIONS, *POOL_ABLATIONS])


@pytest.mark.parametrize("setting", sorted(POOL_ABLATIONS))
def test_the_pool_ablations_span_their_sites_in_one_job(setting, tmp_path):
    dataset, stage, findings, sweep, table = POOL_ABLATIONS[setting]
    with initialize_config_dir(config_dir=str(CONFIG_DIR), version_base="1.3"):
        cfg = compose("config", overrides=[f"paths.root={tmp_path}", f"experiment=candor_ablation_{setting}"],
                      return_hydra_config=True)
    params = OmegaConf.to_container(cfg.hydra.sweeper.params, resolve=False)
    assert params.pop("encoder") == "${sweep_values:${encoders},${encoder.name}}"
    assert params == sweep
    assert (cfg.dataset.name, cfg.stage.name, list(cfg.stage.findings)) == ("pool", stage, findings)
    assert list(cfg.report.tables) == [table] and list(cfg.encoders) == panel_file("candor_chest")
    members = [m["dataset"] for m in cfg.dataset.options.members]
    assert members == (["mimic_cxr", "ms_cxr", "rsna_pneumonia"] if setting == "box_verified" else
                       ["mimic_cxr", "chexpert", "padchest", "vindr_cxr", "vindr_pcxr"])


@pytest.mark.parametrize("setting", sorted(ABLATIONS))
def test_each_ablation_is_the_base_plus_its_sweep(setting, tmp_path):
    raw = yaml.safe_load((CONFIG_DIR / "experiment" / f"candor_ablation_{setting}.yaml").read_text())
    assert raw["defaults"] == ["/candor_ablation_base"]
    swept = raw["hydra"]["sweeper"].pop("params")
    assert {k: str(v).lower() if isinstance(v, bool) else v for k, v in swept.items()}.items() \
        <= ABLATIONS[setting].items()
    if setting != "resolution":  # the seven that differ only in their sweep line
        assert raw == {"defaults": ["/candor_ablation_base"], "hydra": {"sweeper": {}}}
    with initialize_config_dir(config_dir=str(CONFIG_DIR), version_base="1.3"):
        cfg = compose("config", overrides=[f"paths.root={tmp_path}", f"experiment=candor_ablation_{setting}"],
                      return_hydra_config=True)
    params = OmegaConf.to_container(cfg.hydra.sweeper.params, resolve=False)
    assert params.pop("encoder") == "${sweep_values:${encoders},${encoder.name}}"
    assert params == ABLATIONS[setting]  # in this order: the jobs' order
    assert list(cfg.encoders) == panel_file("candor_chest")
    assert (cfg.dataset.name, cfg.stage.name) == ("mimic_cxr", "candor")
    assert list(cfg.dataset.options.views) == ["PA", "AP", "LATERAL"]
    assert list(cfg.report.tables) == ["candor_ablation"]
    assert list(cfg.stage.findings) == list(cfg.dataset.findings)


# ----------------------------------------------------------------------------- panels

@pytest.mark.parametrize("experiment", EXPERIMENTS)
def test_experiments_choose_encoders_only_through_the_panel_group(experiment):
    raw = yaml.safe_load((CONFIG_DIR / "experiment" / f"{experiment}.yaml").read_text()) or {}
    assert "encoders" not in raw
    for entry in raw.get("defaults", []):
        assert not (isinstance(entry, str) and entry.lstrip("/").startswith("panel")), entry


@pytest.mark.parametrize("experiment, panel", [("heads", "demo"), ("candor_calibration", "demo"),
                                               ("spar_demo", "spar_demo"), ("croma_camelyon", "croma_tiles")])
def test_an_experiments_panel_and_a_panel_override(experiment, panel, tmp_path):
    with initialize_config_dir(config_dir=str(CONFIG_DIR), version_base="1.3"):
        cfg = compose("config", overrides=[f"paths.root={tmp_path}", f"experiment={experiment}"],
                      return_hydra_config=True)
        assert cfg.hydra.runtime.choices.panel == panel
        assert list(cfg.encoders) == panel_file(panel)
        cfg = compose("config", overrides=[f"paths.root={tmp_path}", f"experiment={experiment}", "panel=croma_slides"])
        assert list(cfg.encoders) == panel_file("croma_slides")
