"""Your encoder, your data (issue 22, items 3-5), through the command line's job: the planted-data
CANDOR job runs with ``encoder=timm|hf|open_clip encoder.weights=random`` offline, each in its own
cache entry (apart from each other and from the registry's random ViT-S); ``dataset=csv`` runs on a
CSV + image folder and refuses a CSV without a needed column in one line; and
``robustbench_fm.embed`` returns exactly the matrix of the command line's cache entry."""
import json

import numpy as np
import pandas as pd
import pytest
import torch
from hydra import compose, initialize_config_dir

import robustbench_fm
from robustbench_fm.cli import app
from robustbench_fm.cli.main import CONFIG_DIR, check_overrides
from robustbench_fm.data.manifest import ManifestError
from robustbench_fm.data.synthetic import generate_planted
from robustbench_fm.features.load import load_features

pytestmark = pytest.mark.slow  # command-line jobs: the full suite runs them

N = 40


@pytest.fixture(scope="module")
def tiny_vit_folder(tmp_path_factory):
    from transformers import ViTConfig, ViTImageProcessor, ViTModel

    folder = tmp_path_factory.mktemp("hf") / "tiny-vit"
    config = ViTConfig(hidden_size=32, num_hidden_layers=2, num_attention_heads=2, intermediate_size=64,
                       image_size=64, patch_size=16)
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(1)
        ViTModel(config).save_pretrained(folder)
    ViTImageProcessor(size={"height": 64, "width": 64}, image_mean=[0.5] * 3,
                      image_std=[0.5] * 3).save_pretrained(folder)
    return folder


@pytest.fixture(scope="module")
def own_data(tmp_path_factory):
    """A user's layout: images/ and labels.csv (path + marker + a non-finding column)."""
    root = tmp_path_factory.mktemp("own")
    planted = generate_planted(root / "planted", n=N, size=64, seed=0)
    labels = pd.read_csv(planted / "labels.csv")
    pd.DataFrame({"path": [f"planted/images/{f}" for f in labels["image"]], "marker": labels["marker"],
                  "age": np.arange(N) + 20}).to_csv(root / "labels.csv", index=False)
    return root


def _run(tmp_path, name, overrides):
    overrides = [f"paths.root={tmp_path}", "stage.params.n_boot=50", *overrides]
    with initialize_config_dir(config_dir=str(CONFIG_DIR), version_base="1.3"):
        cfg = compose("config", overrides=overrides)
    out = tmp_path / name
    summary = app.run(cfg, out, overrides)
    entries = json.loads((out / "entries.json").read_text())["entries"]
    return cfg, summary, entries


def test_generic_encoders_run_the_planted_job_offline_each_in_its_own_entry(tmp_path, tiny_vit_folder):
    planted = ["dataset=planted", f"dataset.options.n={N}", "dataset.options.size=64"]
    runs = {"timm": ["encoder=timm", "encoder.model=vit_tiny_patch16_224", "encoder.weights=random"],
            "hf": ["encoder=hf", f"encoder.model={tiny_vit_folder}", "encoder.weights=random"],
            "open_clip": ["encoder=open_clip", "encoder.model=ViT-S-32", "encoder.weights=random"],
            "registry": ["encoder=random_vit_s"]}
    entries = {}
    for kind, overrides in runs.items():
        assert check_overrides(overrides) is None
        _, summary, (entry,) = _run(tmp_path, kind, planted + overrides)
        row = summary[(summary["finding"] == "marker") & (summary["acq_group"] == "planted")].iloc[0]
        assert row["n_queries"] == N // 2 and 0.0 <= row["d"] <= 1.0  # every positive scored
        entries[kind] = entry
    assert [entries[k]["encoder"] for k in runs] == ["timm-vit_tiny_patch16_224", "hf-tiny-vit", "open_clip-ViT-S-32",
                                                     "random_vit_s"]
    keys = {k: e["entry"].rsplit("/", 1)[-1] for k, e in entries.items()}
    assert len(set(keys.values())) == 4, keys
    dims = {k: load_features(e["entry"])[1].shape[1] for k, e in entries.items()}
    assert dims == {"timm": 192, "hf": 32, "open_clip": 384, "registry": 384}


def test_csv_dataset_runs_and_embed_returns_the_cli_entry(tmp_path, own_data):
    csv = own_data / "labels.csv"
    overrides = ["dataset=csv", f"dataset.manifest={csv}", "stage=candor", "encoder=timm",
                 "encoder.model=vit_tiny_patch16_224", "encoder.weights=random", "encoder.embedding=patch_mean"]
    cfg, summary, (entry,) = _run(tmp_path, "csv", overrides)
    assert list(cfg.dataset.findings) == ["marker"] and cfg.dataset.root == str(own_data)  # from the CSV
    row = summary[(summary["finding"] == "marker") & (summary["acq_group"] == "all")].iloc[0]
    assert row["n_queries"] == N // 2
    cli_ids, cli_matrix = load_features(entry["entry"])
    feats = robustbench_fm.embed(csv, "timm", model="vit_tiny_patch16_224", weights="random", embedding="patch_mean",
                                 cache_dir=cfg.paths.cache_dir, device="cpu")
    assert str(feats.path) == entry["entry"] and feats.n_forward == 0  # the same entry, read back
    assert np.array_equal(feats.embeddings, cli_matrix) and list(feats.sample_ids) == list(cli_ids)
    fresh = robustbench_fm.embed(csv, "timm", model="vit_tiny_patch16_224", weights="random",
                                 embedding="patch_mean", cache_dir=tmp_path / "other_cache", device="cpu")
    assert fresh.n_forward > 0 and np.allclose(fresh.embeddings, cli_matrix, atol=1e-5)  # recomputed: same numbers


def test_csv_dataset_refuses_a_bad_csv_in_one_line(tmp_path, own_data):
    bad = tmp_path / "bad.csv"
    pd.read_csv(own_data / "labels.csv").drop(columns="path").to_csv(bad, index=False)
    with pytest.raises(ManifestError) as err:
        _run(tmp_path, "bad", ["dataset=csv", f"dataset.manifest={bad}", f"dataset.root={own_data}",
                               "dataset.findings=[marker]", "encoder=planted_sharp"])
    text = str(err.value)
    assert text.startswith(f"{bad}: column 'path' missing; add a 'path' column") and "\n" not in text
    with pytest.raises(ManifestError, match=r"column 'effusion' missing for finding 'effusion'"):
        _run(tmp_path, "unknown", ["dataset=csv", f"dataset.manifest={own_data / 'labels.csv'}",
                                   "dataset.findings=[effusion]", "encoder=planted_sharp"])


def test_user_config_folder_options_pass_the_command_line_checks(tmp_path):
    (tmp_path / "encoder").mkdir()
    (tmp_path / "encoder" / "my_vit.yaml").write_text("name: timm\nmodel: vit_tiny_patch16_224\n")
    assert check_overrides(["encoder=my_vit"]).startswith("unknown encoder 'my_vit'")
    assert check_overrides([f"hydra.searchpath=[file://{tmp_path}]", "encoder=my_vit"]) is None
    assert check_overrides(["--config-dir", str(tmp_path), "encoder=my_vit"]) is None
