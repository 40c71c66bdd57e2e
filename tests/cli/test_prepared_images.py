"""A CANDOR job through the app goes through the prepared-image stage (issue 18 item 5; candor.md
"Scope": "Every image is stored at 224x224 pixels. The image processor of each encoder then resizes
it"): CheXpert's released layout, two planted encoders, ``experiment=chest_candor``."""
import dataclasses
import json
import shutil
import sys
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
from hydra import compose, initialize_config_dir
from PIL import Image

from robustbench_fm.cli import app
from robustbench_fm.cli.main import CONFIG_DIR
from robustbench_fm.data import prepared
from robustbench_fm.features.load import load_features
from robustbench_fm.pipeline.job import job_manifest, load_manifest
from robustbench_fm.pipeline.plan import plan

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "methods" / "candor"))
import cli_process
from test_chest_candor_e2e import write_chexpert  # noqa: E402

ENCODERS = ["planted_blur", "planted_sharp"]


def _cfg(tmp_path: Path, root: Path, *overrides: str):
    with initialize_config_dir(config_dir=str(CONFIG_DIR), version_base="1.3"):
        return compose("config", overrides=[f"paths.root={tmp_path}", "experiment=chest_candor", "dataset=chexpert",
                                            f"dataset.root={root}", f"encoders=[{','.join(ENCODERS)}]",
                                            "stage=candor", "stage.params.n_boot=20", "device=cpu",
                                            "extract.num_workers=0", *overrides])


def _entries(out: Path) -> dict[str, Path]:
    return {e["encoder"]: Path(e["entry"]) for e in json.loads((out / "entries.json").read_text())["entries"]}


def test_plan_names_the_stored_size_and_native_opts_out(tmp_path):
    cfg = _cfg(tmp_path, tmp_path)
    assert cfg.resolution == 224 and plan(cfg).resolution == 224
    assert f"stored at 224 x 224 px once in {tmp_path / 'outputs' / 'cache' / 'prepared'}" in \
        plan(cfg).describe()
    native = _cfg(tmp_path, tmp_path, "resolution=native")
    assert plan(native).resolution is None and "native (the files as shipped)" in plan(native).describe()
    with pytest.raises(ValueError, match="resolution='224px'"):
        plan(_cfg(tmp_path, tmp_path, "resolution=224px"))
    with pytest.raises(ValueError, match="fixed_sample='many'"):
        plan(_cfg(tmp_path, tmp_path, "fixed_sample=many"))


def test_which_experiments_store_their_images_at_224(tmp_path):
    def composed(*overrides):
        with initialize_config_dir(config_dir=str(CONFIG_DIR), version_base="1.3"):
            return compose("config", overrides=[f"paths.root={tmp_path}", *overrides])

    for exp in ("chest_candor", "candor_domains", "candor_heads", "candor_ablation_k", "candor_ablation_pooling"):
        cfg = composed(f"experiment={exp}")
        assert (cfg.resolution, cfg.fixed_sample) == (224, None), exp
    for exp in ("demo", "candor_calibration", "croma_camelyon", "spar_word"):
        assert composed(f"experiment={exp}").resolution == "native", exp
    for size in (224, 512):
        cfg = composed("experiment=candor_ablation_resolution", f"ablation.image_size={size}")
        assert (cfg.resolution, cfg.fixed_sample, cfg.dataset.root) == (size, 500, str(tmp_path / "data" /
                                                                                      "mimic-cxr-jpg" / "2.1.0"))
        assert cfg.get("manifest_file") is None  # the adapter's manifest, not a hand-prepared copy


@pytest.mark.slow
def test_chest_candor_job_reads_images_stored_once_at_224(tmp_path, monkeypatch):
    root = tmp_path / "data" / "CheXpert-v1.0-small"
    write_chexpert(root, np.random.default_rng(0))
    calls = []
    real = prepared.read_image
    monkeypatch.setattr(prepared, "read_image",
                        lambda r, row, need=None: calls.append(row["path"]) or real(r, row, need))

    summary = app.run(_cfg(tmp_path, root), tmp_path / "run224")
    manifest = job_manifest(_cfg(tmp_path, root))
    assert len(calls) == len(manifest) == 44  # every image read once for the two encoders
    entries = _entries(tmp_path / "run224")
    stores = sorted((tmp_path / "outputs" / "cache" / "prepared" / "224px").glob("*/meta.json"))
    assert len(stores) == 1  # both encoders read the same store
    store = stores[0].parent
    meta = json.loads((store / "meta.json").read_text())
    assert (meta["status"], meta["n_images"], meta["fields"]["size"]) == ("complete", 44, 224)

    # the same job on copies resized by hand (Pillow bicubic to 224, PNG bytes under the .jpg names)
    # read natively gives the same features and the same table
    by_hand = tmp_path / "by_hand"
    shutil.copytree(root, by_hand, ignore=shutil.ignore_patterns("*.jpg"))
    for rel in manifest["path"]:
        with Image.open(root / rel) as im:
            (by_hand / rel).parent.mkdir(parents=True, exist_ok=True)
            im.resize((224, 224), Image.Resampling.BICUBIC).save(by_hand / rel, format="PNG")
    calls.clear()
    hand = app.run(_cfg(tmp_path, by_hand, "resolution=native"), tmp_path / "by_hand_run")
    assert calls == []  # native: no store
    hand_entries = _entries(tmp_path / "by_hand_run")
    for enc in ENCODERS:
        np.testing.assert_array_equal(load_features(entries[enc], manifest)[1],
                                      load_features(hand_entries[enc], manifest)[1])
    pd.testing.assert_frame_equal(summary.drop(columns=["seconds"], errors="ignore"),
                                  hand.drop(columns=["seconds"], errors="ignore"))

    # resolution=native on the originals: other feature-cache entries, and the store is not read
    app.run(_cfg(tmp_path, root, "resolution=native"), tmp_path / "native")
    assert calls == []
    native = _entries(tmp_path / "native")
    assert all(native[e].name != entries[e].name for e in ENCODERS)
    for e in ENCODERS:  # the native images are other images than their 224-px copies: other store rows
        ids = (pd.read_parquet(native[e] / "view.parquet")["image_id"], pd.read_parquet(entries[e] / "view.parquet")
               ["image_id"])
        assert not set(ids[0]) & set(ids[1])
    # a second 224 run finds everything: nothing decoded, nothing embedded
    app.run(_cfg(tmp_path, root), tmp_path / "again")
    assert calls == [] and _entries(tmp_path / "again") == entries


@pytest.mark.slow
def test_resolution_ablation_stores_its_fixed_sample_at_224_and_512(tmp_path):
    """experiment=candor_ablation_resolution as a user runs it (one site here): each size's jobs
    read their own store of the same fixed sample, and the collect step writes the ablation table."""

    from robustbench_fm.data.sample import fixed_sample

    root = tmp_path / "data" / "CheXpert-v1.0-small"
    write_chexpert(root, np.random.default_rng(0))
    sweep = tmp_path / "sweep"
    cmd = ["-m", "robustbench_fm", "-m", "experiment=candor_ablation_resolution",
           f"paths.root={tmp_path}", "dataset=chexpert", f"encoders=[{','.join(ENCODERS)}]", "fixed_sample=6",
           "stage.params.n_boot=20", "device=cpu", "extract.num_workers=0", f"hydra.sweep.dir={sweep}"]
    proc = cli_process.run(cmd, timeout=600, cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert (sweep / "missing.txt").read_text() == ""
    cfg = _cfg(tmp_path, root, "fixed_sample=6")
    full = load_manifest(dataclasses.replace(plan(cfg), fixed_sample=None))  # every image, before the sample
    sample = fixed_sample(full, list(cfg.stage.findings), 6)
    rows = pd.concat(pd.read_parquet(f) for f in sweep.glob("*/summary.parquet"))
    rows = rows[rows["acq_group"] != "__pooled__"]
    assert len(rows) == 4 * 2 * 12  # jobs x matched groups x findings
    for r in rows.itertuples():  # each task sees at most 6 positives and 6 negatives: all of a smaller class
        labels = full.loc[full["acq_group"] == r.acq_group, r.finding]
        assert (r.n_pos, r.n_neg) == (min(6, (labels == 1).sum()), min(6, (labels == 0).sum()))
    for size in (224, 512):
        stores = list((tmp_path / "outputs" / "cache" / "prepared" / f"{size}px").glob("*/meta.json"))
        assert len(stores) == 1  # one store per size, shared by both encoders
        meta = json.loads(stores[0].read_text())
        assert (meta["n_images"], meta["fields"]["size"]) == (len(sample), size)
    per = pd.concat(pd.read_parquet(f) for f in sweep.glob("*/results/planted_sharp/*/candor/edema/per_sample.parquet"))
    assert per["sample_id"].isin(sample["sample_id"]).all()
    table = pd.read_csv(sweep / "tables" / "candor_ablation_image_size.csv")
    assert list(table.columns) == ["Encoder", "image_size=224", "image_size=512"]
    assert sorted(table["Encoder"]) == ENCODERS and table[["image_size=224", "image_size=512"]].notna().all().all()
