"""on_bad_image=skip through the app: an unreadable image is dropped for every encoder, so the
encoders stay paired on identical rows; the default stops naming the file (reliability 2)."""
import pandas as pd
import pytest
from hydra import compose, initialize_config_dir

from robustbench_fm import data
from robustbench_fm.cli import app
from robustbench_fm.cli.main import CONFIG_DIR
from robustbench_fm.features import ImageReadError


def config(tmp_path, *overrides):
    with initialize_config_dir(config_dir=str(CONFIG_DIR), version_base="1.3"):
        return compose("config", overrides=[f"paths.root={tmp_path}", "encoders=[planted_blur,planted_sharp]",
                                            "stage.params.n_boot=50", *overrides])


def test_an_unreadable_image_is_dropped_for_every_encoder(tmp_path):
    root = data.get("planted").generate(tmp_path / "outputs" / "demo_data" / "planted")
    manifest = data.build_manifest("planted", root)
    victim = manifest[manifest["marker"] == 1].iloc[3]
    (root / victim["path"]).write_bytes(b"\x89PNG\r\n\x1a\n truncated")
    with pytest.raises(ImageReadError, match=victim["path"]):
        app.run(config(tmp_path), tmp_path / "strict")
    app.run(config(tmp_path, "extract.on_bad_image=skip"), tmp_path / "skip")
    skipped = pd.read_csv(tmp_path / "skip" / "skipped.csv")
    assert skipped["sample_id"].tolist() == [victim["sample_id"]]
    per = {enc: pd.read_parquet(tmp_path / "skip" / "results" / enc / "planted" / "candor" / "marker"
                                / "per_sample.parquet") for enc in ("planted_blur", "planted_sharp")}
    assert len(per["planted_blur"]) == 99
    assert per["planted_blur"]["sample_id"].tolist() == per["planted_sharp"]["sample_id"].tolist()
    assert victim["sample_id"] not in set(per["planted_blur"]["sample_id"])
