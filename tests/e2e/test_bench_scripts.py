"""The benchmark scripts keep working (they use the engine's internals): a miniature run."""
import importlib.util
import json
from pathlib import Path

import pytest

SCRIPTS = Path(__file__).resolve().parents[2] / "scripts"


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
    assert abs(result["ratio_extract_over_forward"] - ratio) < 0.01 * ratio + 2e-3  # both sides are rounded


def test_bench_candor_writes_its_figures(tmp_path):
    out = tmp_path / "candor.json"
    result = load("bench_candor").main(["--groups", "2", "--group-size", "400", "--dim", "32", "--bank-size", "200",
                                        "--max-group-sample", "200", "--n-boot", "50", "--out", str(out)])
    assert json.loads(out.read_text()) == result
    assert result["n_images"] == 800 and result["bank_size"] == 200 and result["n_findings"] == 12
    assert 180 <= result["queries_per_finding"] <= 220  # half of each group's 200-image sample, 2 groups
    # the ratio depends on the CPU's vector units: the JSON names them (torch's own report)
    import torch

    assert result["machine"]["cpu_capability"] == torch.backends.cpu.get_cpu_capability()
    assert result["machine"]["cpu"].strip()


def test_bench_candor_measures_each_shape_with_its_floor(tmp_path):
    """Issue 44 item 4: the prevalence and single-finding cohorts, each timed with its own floor in
    one run; the single finding over the largest groups takes the exact path."""
    out = tmp_path / "candor.json"
    result = load("bench_candor").main(["--shapes", "prevalence,single", "--groups", "2", "--group-size", "400",
                                        "--dim", "16", "--bank-size", "100", "--max-group-sample", "200",
                                        "--n-boot", "10", "--out", str(out)])
    assert json.loads(out.read_text()) == result
    prevalence, single = result["shapes"]["prevalence"], result["shapes"]["single"]
    assert prevalence["floor"] == "group_pass" and single["floor"] == "images_x_banks"
    assert prevalence["prevalences"][0] == 0.02 and prevalence["prevalences"][-1] == 0.3
    assert prevalence["n_findings"] == 12 and single["n_findings"] == 1 and single["n_images"] == 800
    assert single["neighbour_paths"] == {"exact": 2}
    for shape in (prevalence, single):  # the JSON rounds seconds to 1 ms, floors to 1 µs, the ratio to 0.01
        seconds, floor = shape["seconds"], shape["similarity_floor_seconds"]
        ratio = seconds / floor
        rounding = ratio * (5e-4 / seconds + 5e-7 / floor) + 0.005
        assert abs(shape["ratio_over_similarity_floor"] - ratio) <= rounding + 1e-9
        # issue 57: the floor's CPU time beside the stage's, and their ratio (robust to other jobs' load)
        assert shape["similarity_floor_cpu_seconds"] >= 0 and "cpu_ratio_over_similarity_floor" in shape


def test_estimate_cost_counts_flops_and_schedules_longest_first():
    cost = load("estimate_cost")
    gflops, how = cost.gflops_per_image("random_vit_s")
    # ViT-S/16 at 224 px: 4.6 GMACs = 9.2 GFLOPs (timm's published figure)
    assert how == "counted" and abs(gflops - 9.2) < 0.2
    assert cost.schedule([3, 3, 2, 2], 2) == 5 and cost.schedule([3, 3, 2, 2, 2], 2) == 7  # LPT, not optimal
    assert cost.schedule([5, 1, 1], 4) == 5


def test_bench_panel_checks_entries_and_writes_ratios(tmp_path):
    out = tmp_path / "panel.json"
    result = load("bench_panel").main(["--n", "6", "--size", "128", "--batch-size", "4", "--num-workers", "0",
                                       "--out", str(out)])
    assert json.loads(out.read_text()) == json.loads(json.dumps(result))
    assert result["entries_byte_identical"] == {m: True for m in result["models"]} and len(result["models"]) == 5
    sec, ratios = result["seconds"], result["ratios"]
    floor = sec["decode_pass"] + sec["forward_sum"]
    # the seconds are rounded to 1 ms and a toy run's decode pass takes tens of ms
    assert abs(ratios["panel_over_decode_plus_forwards"] - sec["panel"] / floor) <= 0.1 * sec["panel"] / floor
    assert result["meets_goal"] == (ratios["panel_over_decode_plus_forwards"] <= 1.3)


def test_bench_candor_prints_its_similarity_floor(tmp_path):
    result = load("bench_candor").main(["--groups", "2", "--group-size", "400", "--dim", "32", "--bank-size", "200",
                                        "--max-group-sample", "200", "--n-boot", "20", "--out",
                                        str(tmp_path / "c.json")])
    ratio = result["seconds"] / result["similarity_floor_seconds"]
    assert result["similarity_floor_seconds"] > 0 and result["ratio_goal"] == 2.0
    assert abs(result["ratio_over_similarity_floor"] - ratio) <= 0.01 * ratio + 0.01


@pytest.mark.slow  # ~20 s: every section of the GPU script end to end
def test_bench_gpu_paths_new_sections_run_at_toy_size_on_cpu(tmp_path):
    """The issue-21 sections of the one GPU script, at toy sizes on the CPU (their code paths; the
    numbers come from a GPU machine)."""
    out = tmp_path / "gpu.json"
    sections = "device_transform,extract_vs_forward,panel,candor_floor,croma_floor"
    result = load("bench_gpu_paths").main(["--smoke", "--allow-cpu", "--sections", sections, "--out", str(out)])
    assert json.loads(out.read_text()) == json.loads(json.dumps(result, default=str))
    for name in sections.split(","):
        assert "error" not in result[name], result[name]
    assert result["device_transform"]["fp32"]["min_cosine_device_vs_host_transform"] >= 0.9999
    assert result["device_transform"]["meets_goal"] is True
    assert set(result["extract_vs_forward"]["models"]) == {"vit_s"}
    assert result["panel"]["entries_byte_identical"] == {m: True for m in result["panel"]["models"]}
    for name in ("candor_floor", "croma_floor"):
        assert result[name]["ratio_over_similarity_floor"] > 0 and result[name]["profile_top"]


def test_bench_compare_counts_every_pair_metric_and_row(tmp_path):
    out = tmp_path / "compare.json"
    result = load("bench_compare").main(["--encoders", "4", "--queries", "400", "--n-boot", "50", "--out", str(out)])
    assert json.loads(out.read_text()) == result
    assert result["pairs"] == 6 * 2 * 3  # 6 pairs x (D, D_all; the margin AUROC is not compared) x (2 groups + pooled)
    assert result["verdict_lines"] == 1 and result["cpu"]


def test_bench_influence_times_both_stages_with_and_without_the_banks_role(tmp_path):
    out = tmp_path / "influence.json"
    result = load("bench_influence").main(["--quick", "--out", str(out)])
    assert json.loads(out.read_text()) == result
    assert result["candor"]["queries"] == 4000 and result["croma"]["tiles"] == 2400
    for stage in ("candor", "croma"):
        r = result[stage]
        # the seconds are rounded to 0.01 s, the ratio is not
        assert r["ratio_with_influence"] == pytest.approx(r["stage_seconds"] / r["stage_seconds_without_influence"],
                                                          rel=0.1)
    assert result["candor"]["influence_calls"] == 2  # one per group: the banks hold every image, D_all is D


def test_power_compare_tallies_both_roles_and_the_query_role_alone(tmp_path):
    out = tmp_path / "power.json"
    result = load("power_compare").main(["--cohorts", "2", "--designs", "C", "--n-boot", "100", "--out", str(out)])
    assert json.loads(out.read_text()) == result
    rows = {(s["metric"], s["row_type"], s["roles"]): s for s in result["summary"]}
    assert set(rows) == {(m, r, roles) for m in ("d", "d_all") for r in ("pooled", "group")
                         for roles in ("both", "queries only")}
    # 2 cohorts x the worse encoder's 2 pairs (x 2 groups for the group rows)
    assert rows[("d", "pooled", "both")]["n_pairs"] == 4 and rows[("d", "group", "both")]["n_pairs"] == 8
    both, alone = rows[("d", "pooled", "both")], rows[("d", "pooled", "queries only")]
    assert both["mean_difference"] == alone["mean_difference"] > 0  # the same estimates; enc0 is worse
    assert "| C | d | pooled |" in result["markdown"]
