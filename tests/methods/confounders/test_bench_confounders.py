"""scripts/bench_confounders.py in miniature: it writes the JSON it returns, times each encoder's whole scan
and the first one's graph and floor, and its planted encoders score the columns they were built from."""
import importlib.util
import json
from pathlib import Path

import torch

SCRIPT = Path(__file__).resolve().parents[3] / "scripts" / "bench_confounders.py"


def test_bench_confounders_writes_its_figures(tmp_path):
    spec = importlib.util.spec_from_file_location("bench_confounders", SCRIPT)
    bench = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(bench)
    out = tmp_path / "confounders.json"
    result = bench.main(["--n", "600", "--dim", "32", "--encoders", "2", "--n-boot", "50", "--out", str(out)])
    assert json.loads(out.read_text()) == result
    assert result["n_images"] == 600 and result["n_columns"] == 10 and result["encoders"] == ["enc_site", "enc_scanner"]
    assert set(result["scores"]["enc_site"]) == set(bench.COLUMNS)
    assert result["total_wall_s"] == round(sum(e["wall_s"] for e in result["per_encoder"].values()), 3)
    assert result["graph_first_encoder"]["wall_s"] >= 0 and result["similarity_floor"]["wall_s"] >= 0  # ms-rounded
    assert abs(result["idle_2_core_wall_s_at_least"] - result["total_cpu_s"] / 2) <= 0.06  # both rounded
    site, scanner = result["scores"]["enc_site"], result["scores"]["enc_scanner"]
    assert site["site"] > scanner["site"] and scanner["scanner"] > site["scanner"]
    assert result["machine"]["cpu_capability"] == torch.backends.cpu.get_cpu_capability()
