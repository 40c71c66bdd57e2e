"""Each stage's parameters are one typed structure (methods/<paper>/params.py): the command line's
stage configs are generated from it and equal the YAML files they replaced, every call parses it
once with one-line errors, it round-trips, and the ablations and tables read its defaults."""
import dataclasses
import json
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
from hydra import compose, initialize_config_dir
from omegaconf import OmegaConf

from robustbench_fm import methods
from robustbench_fm.cli.main import CONFIG_DIR
from robustbench_fm.methods.candor import stage as candor_stage
from robustbench_fm.methods.candor.params import CandorParams
from robustbench_fm.methods.croma.params import CromaParams
from robustbench_fm.methods.heads.params import CandorHeadsParams, ErrorDetectionParams, HeadParams, LogmeParams
from robustbench_fm.methods.params import StageParams, config_node, field_docs
from robustbench_fm.pipeline import configstore

ROOT = Path(__file__).resolve().parents[2]
#: the hand-written configs/stage/*.yaml as they were at 5fcc8da, the last revision that had them
OLD_YAMLS = ROOT / "tests" / "fixtures" / "stage_yaml_5fcc8da"
STAGES = methods.names()


def old_yaml(name: str) -> dict:
    """configs/stage/<name>.yaml as it was before the stage configs were generated."""
    return OmegaConf.to_container(OmegaConf.load(OLD_YAMLS / f"{name}.yaml"))


#: parameters added after 5fcc8da, by stage: {name: default}, appended in this order
ADDED = {"croma": {"on_incomplete": "error",  # refuse incomplete 2x2 subsets as croma 1.0.1 does
                   "m_sweep": 20},  # the m sweep croma reports (croma_auc, croma_min, croma_delta)
         "spar": {"lr_selection": "fixed",  # spar.md's one learning rate for all models (params.py)
                  "min_delta": 0.0},  # early stopping's least improvement (0: the paper's rule)
         # the cross-site failure-detection study
         "error_detection": {"train_on": None, "site_col": "dataset", "view_col": "view"}}


#: entries added to a mapping parameter after 5fcc8da: {stage: {parameter: {entry: value}}}
ADDED_ENTRIES = {"spar": {"labels": {"spar_canonical": "Canonical"}}}  # the planted canonical backbone (issue 42)


@pytest.mark.parametrize("name", [n for n in STAGES if (OLD_YAMLS / f"{n}.yaml").exists()])  # stages older than 5fcc8da
def test_the_generated_stage_config_equals_the_yaml_it_replaced(name):
    old = old_yaml(name)
    new = OmegaConf.to_container(OmegaConf.create(configstore.nodes("stage")[name]))
    params = new.get("params", {})
    for key, default in ADDED.get(name, {}).items():
        assert params.pop(key) == default, key
    for key, entries in ADDED_ENTRIES.get(name, {}).items():
        for entry, value in entries.items():
            assert params[key].pop(entry) == value, (key, entry)
    # the same keys in the same order, the same values of the same types (10.0 is not 10)
    assert json.dumps(new) == json.dumps(old)


def test_every_stage_has_a_parameter_class_in_the_registry_and_its_module():
    for name in STAGES:
        cls = methods.method(name).params
        assert issubclass(cls, StageParams) and cls.STAGE == name
        assert dataclasses.is_dataclass(cls) and cls.__dataclass_params__.frozen
        assert issubclass(cls, methods.get(name).PARAMS)  # mlp_head: a subclass of heads.stage's HeadParams


@pytest.mark.parametrize("name", STAGES)
def test_python_defaults_are_the_command_lines(name):
    """A stage composed on the command line parses to the class's defaults, except the fields
    its config sets through an interpolation (${seed}, ${device}, the spar transfer cohorts)."""
    cls = methods.method(name).params
    with initialize_config_dir(config_dir=str(CONFIG_DIR), version_base="1.3"):
        cfg = compose("config", overrides=[f"stage={name}", "paths.root=/nonexistent"])
    parsed = cls.parse(OmegaConf.to_container(cfg.stage.params, resolve=True))
    interpolated = {f.name for f in dataclasses.fields(cls) if "config" in f.metadata}
    python_only = {f.name for f in dataclasses.fields(cls) if not f.metadata.get("cli", True)}
    assert set(OmegaConf.to_container(cfg.stage.params)) == set(cls.names()) - python_only
    assert dataclasses.replace(parsed, **{n: getattr(cls(), n) for n in interpolated}) == cls()
    assert {"seed": 42, "device": "auto"}.items() >= {n: getattr(parsed, n) for n in interpolated
                                                      if n in ("seed", "device")}.items()


@pytest.mark.parametrize("name", STAGES)
def test_parse_round_trips(name):
    cls = methods.method(name).params
    p = cls()
    assert cls.parse(p.to_dict()) == p
    assert cls.parse(p) is p
    changed = {f.name: (not v if isinstance(v, bool) else v + 1 if isinstance(v, int) else v)
               for f in dataclasses.fields(cls) for v in [getattr(p, f.name)]
               if isinstance(v, int) and f.name in ("seed", "n_boot", "max_train", "epochs", "iterations", "n_pairs",
                                                     "k", "m", "batch_size", "shuffle_labels")}
    q = cls.parse(changed)
    assert q != p and cls.parse(q.to_dict()) == q and all(getattr(q, n) == v for n, v in changed.items())


@pytest.mark.parametrize("call, message", [
    (lambda: CandorParams.parse({"kk": 3}), "candor: unknown parameter stage.params.kk; did you mean k?"),
    (lambda: CromaParams.parse({"k_gird": [5]}), "croma: unknown parameter stage.params.k_gird; did you mean k_grid?"),
    (lambda: LogmeParams.parse({"zzz": 1}), "logme: unknown parameter stage.params.zzz; known: max_train, seed, "
                                            "cluster_col, val_fraction, test_fraction"),
    (lambda: CandorParams.parse({"k": "abc"}), "candor: stage.params.k=abc must be an integer (default: 5)"),
    (lambda: CandorParams.parse({"k": True}), "candor: stage.params.k=true must be an integer (default: 5)"),
    (lambda: CandorParams.parse({"k": None}), "candor: stage.params.k=null must be an integer (default: 5)"),
    (lambda: CromaParams.parse({"k": 2.5}), "croma: stage.params.k=2.5 must be an integer or null (default: null)"),
    (lambda: CromaParams.parse({"k_grid": 5}), "croma: stage.params.k_grid=5 must be a list, e.g. [1,2] "
                                               "(default: [1,3,5,7,9,11,21,31,41,51,61,71,81,91])"),
    (lambda: HeadParams.parse({"lr": "fast"}), "linear_head: stage.params.lr=fast must be a number (default: 0.001)"),
    (lambda: ErrorDetectionParams.parse({"stratify_col": 3}),
     "error_detection: stage.params.stratify_col=3 must be a string or null (default: null)"),
    (lambda: methods.check("mlp_head", {"shuffle": True}),
     "mlp_head: unknown parameter stage.params.shuffle; known: head, max_train, max_test, epochs, lr, weight_decay, "
     "batch_size, hidden, sensitivity, seed, cluster_col, n_boot, val_fraction, test_fraction, device"),
    (lambda: candor_stage.run(np.zeros((2, 2)), pd.DataFrame(), "x", kk=3),
     "candor: unknown parameter stage.params.kk; did you mean k?"),
    (lambda: methods.check("spar", {"seeds": "42"}),
     "spar: stage.params.seeds=42 must be a list, e.g. [1,2] (default: [42,123,1234])"),
    (lambda: methods.check("spar", {"by_encoder": {"spar_oracle": {"lr_x": 1}}}),
     "stage.params.by_encoder.spar_oracle: unknown ['lr_x']; use batch_size, max_epochs, patience, min_delta, lr, "
     "lr_search, hidden, d_model, head_layers"),
])
def test_an_unknown_or_mistyped_parameter_is_one_line(call, message):
    with pytest.raises(ValueError) as err:
        call()
    assert str(err.value) == message


def test_values_are_checked_once_by_the_class():
    with pytest.raises(ValueError, match=r"^candor: bank_size=5 must exceed k=5"):
        methods.check("candor", {"bank_size": 5})
    # a stage that shares parameters runs the checks of the stages it shares them with
    with pytest.raises(ValueError, match=r"^heads: sensitivity=1.5 must be in \(0, 1\]$"):
        methods.check("error_detection", {"sensitivity": 1.5})
    with pytest.raises(ValueError, match=r"^error_detection: knn_k=0 must be at least 1$"):
        methods.check("error_detection", {"knn_k": 0})
    with pytest.raises(ValueError, match=r"^candor: k=0 must be at least 1$"):
        methods.check("candor_heads", {"k": 0})
    # what Python callers pass: numpy integers and numbers, a config's ListConfig, an array
    assert CandorParams.parse({"k": np.int64(7)}).k == 7
    assert CromaParams.parse({"alpha": np.float32(0.25)}).alpha == np.float32(0.25)
    assert list(CromaParams.parse({"k_grid": OmegaConf.create([5, 11])}).k_grid) == [5, 11]
    assert list(CromaParams.parse({"k_grid": np.array([5, 11])}).k_grid) == [5, 11]
    with pytest.raises(ValueError, match=r"^croma: stage.params.k_grid=5,11 must be a list"):
        CromaParams.parse({"k_grid": "5,11"})


def test_shared_parameters_have_one_home():
    """error_detection / candor_heads / logme declare the heads' and CANDOR's parameters by
    reference: same default, same interpolation, same docstring (unless they say more)."""
    for cls in (ErrorDetectionParams, CandorHeadsParams, LogmeParams):
        for f in dataclasses.fields(cls):
            source = f.metadata.get("shared_from")
            if source is None:
                continue
            own = {g.name: g for g in dataclasses.fields(source)}[f.name]
            assert (f.default, f.metadata.get("config")) == (own.default, own.metadata.get("config")), f.name
            assert field_docs(cls)[f.name]
    assert field_docs(CandorHeadsParams)["max_train"] == field_docs(HeadParams)["max_train"]
    assert field_docs(ErrorDetectionParams)["k"] != field_docs(CandorParams)["k"]  # its own, more precise
    assert CandorHeadsParams().candor_params() == CandorParams(seed=42, device="auto")
    assert ErrorDetectionParams(lr=0.5).head_params() == HeadParams(lr=0.5)
    assert list(config_node(ErrorDetectionParams))[:3] == ["head", "n_members", "knn_k"]  # its own order


def test_tables_read_the_structure():
    from robustbench_fm.methods.candor.tables import ABLATION_SETTINGS
    from robustbench_fm.methods.croma.rescore import _default_params
    from robustbench_fm.methods.spar.run import Setup
    from robustbench_fm.methods.spar.train import TrainConfig

    # the paper's values (candor.md "Implementation", "Ablation Studies"), in the sweep's order
    assert ABLATION_SETTINGS == {
        "stage.params.k": 5, "stage.params.bank_size": 4000, "stage.params.seed": 42,
        "stage.params.exclude_patient": False, "stage.params.unmatched": False, "encoder.embedding": "cls",
        "ablation.image_size": 224, "stage.params.isolated": False, "stage.params.box_verified": False,
        "stage.params.queries": "positive"}
    assert list(ABLATION_SETTINGS)[:3] == ["stage.params.k", "stage.params.bank_size", "stage.params.seed"]
    # what the croma tables re-score with, as the old run() signature gave it (croma.md §2.3-2.7)
    assert json.dumps(_default_params()) == json.dumps({
        "confounder_col": "site", "exclude_col": "slide_id", "m": 5, "alpha": 0.1, "m_sweep": 20,
        "k_grid": [1, 3, 5, 7, 9, 11, 21, 31, 41, 51, 61, 71, 81, 91], "k": None, "tau": None, "design": "all",
        "subset_col": "subset", "on_short": "error", "on_incomplete": "error", "device": "auto", "block_size": 4096})
    # SPAR's training setup (spar.md Section 3.2)
    assert (TrainConfig().lr, TrainConfig().batch_size, TrainConfig().max_epochs, TrainConfig().patience) == \
        (1e-4, 16, 50, 20)
    assert (Setup().seeds, Setup().sinkhorn_tau, Setup().sinkhorn_iters, Setup().smoothing, Setup().sdr_px) == \
        ((42, 123, 1234), 0.3, 20, 0.1, 10.0)
