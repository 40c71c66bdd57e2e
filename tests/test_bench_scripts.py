"""The benchmark scripts keep working (they use the engine's internals): a miniature run."""
import importlib.util
import json
from pathlib import Path

SCRIPTS = Path(__file__).resolve().parent.parent / "scripts"


def load(name):
    spec = importlib.util.spec_from_file_location(name, SCRIPTS / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_bench_extract_writes_its_figures(tmp_path):
    out = tmp_path / "extract.json"
    load("bench_extract").main(["--models", "random_vit_s", "--n", "8", "--batch-size", "4", "--size", "64",
                                "--out", str(out)])
    result = json.loads(out.read_text())["models"]["random_vit_s"]
    assert result["n_forward_batches"] == 2 and result["embed_dim"] == 384
    ratio = result["extract_images_per_s"] / result["forward_images_per_s"]
    assert abs(result["ratio_extract_over_forward"] - ratio) < 2e-3  # both sides are rounded
