"""candor_v1.md's synthetic sweep (methods/candor/synthetic.py): Proposition 1's bound and its
equality case, Corollary 1's cap on the normalised margin of a discordant twin, the Lipschitz
constants, and the sweep's heads as the classes overlap; the experiment end to end."""

import cli_process
import numpy as np
import pandas as pd
import pytest
import torch

from robustbench_fm.methods.candor import synthetic as syn


def test_the_bound_is_attained_by_the_max_margin_linear_head():
    """Proposition 1: h(z) = a⟨z+ − z−, z − (z+ + z−)/2⟩ separates the pair with margin
    a‖z+ − z−‖²/2 = L‖z+ − z−‖/2 exactly (L = a‖z+ − z−‖): the bound is tight."""
    rng = np.random.default_rng(0)
    z = rng.normal(size=(2, 8))
    z /= np.linalg.norm(z, axis=1, keepdims=True)  # on the unit sphere in float64
    a = 3.7
    head = torch.nn.Sequential(torch.nn.Linear(8, 1)).double()
    with torch.no_grad():
        head[0].weight.copy_(torch.as_tensor(a * (z[0] - z[1]))[None])
        head[0].bias.fill_(float(-a * (z[0] - z[1]) @ (z[0] + z[1]) / 2))
    h = head(torch.as_tensor(z)).detach().squeeze(1).numpy()
    lip = syn.lipschitz_constant(head)
    gap = np.linalg.norm(z[0] - z[1])
    assert lip == pytest.approx(a * gap, rel=1e-12)
    assert min(h[0], -h[1]) == pytest.approx(lip * gap / 2, rel=1e-12)
    # the inner-product form: <z+, z-> <= 1 - 2 m^2 / L^2, with equality here
    assert z[0] @ z[1] == pytest.approx(1 - 2 * (min(h[0], -h[1]) / lip) ** 2, abs=1e-12)


def test_the_network_constant_bounds_every_difference_quotient():
    rng = np.random.default_rng(1)
    z, y = syn.overlap_features(0.5, 300, 8, rng)
    head = syn.train_head(z, y, 32, 3, 1e-2, 0.0, 64, seed=0)
    lip = syn.lipschitz_constant(head)
    a, b = rng.normal(size=(2, 2000, 8)).astype(np.float32)
    quotient = np.abs(syn.logits(head, a) - syn.logits(head, b)) / np.linalg.norm(a - b, axis=1)
    assert quotient.max() <= lip
    linear = syn.train_head(z, y, 0, 3, 1e-2, 0.0, 64, seed=0)
    assert syn.lipschitz_constant(linear) == pytest.approx(float(np.linalg.norm(linear[0].weight.detach().numpy())))


def test_sweep_never_exceeds_the_bound_and_errors_rise_as_the_classes_overlap():
    levels, pairs = syn.lipschitz_sweep(separations=[2.0, 0.8, 0.1], dim=8, n_train=600, n_test=400,
                                        pairs_per_level=100, hidden=32, epochs=20, lr=0.05, seed=3)
    assert (levels["violations"] == 0).all() and (pairs["margin"] <= pairs["bound"] + 1e-9).all()
    assert len(pairs) == 3 * 2 * 100
    for head, part in levels.groupby("head"):
        errors = part.sort_values("level")["error"].to_numpy()
        assert errors[0] <= 0.01 and errors[-1] > 0.3, head  # separated: (almost) no error; 0.1 apart: near chance
    d = levels[levels["head"] == "linear"].sort_values("level")["d"].to_numpy()
    assert d[0] < 0.05 and 0.35 < d[-1]  # the geometry closes: D moves from 0 towards its chance level
    # Corollary 1: for a pair with the positive's nearest negative, m/L <= ||z+ - z-||/2 = sqrt(2 - 2<z+,z->)/2
    assert (pairs["normalized_margin"] <= pairs["distance"] / 2 + 1e-9).all()


@pytest.mark.slow  # a command-line subprocess: the full suite runs it
def test_lipschitz_experiment_runs_and_writes_its_table(tmp_path):
    out = tmp_path / "run"
    cmd = ["-m", "robustbench_fm", "experiment=candor_v1_lipschitz", f"paths.root={tmp_path}",
           "stage.params.separations=[2.0,0.1]", "stage.params.n_train=400", "stage.params.n_test=300",
           "stage.params.pairs_per_level=50", "stage.params.hidden=16", "stage.params.epochs=5", "device=cpu",
           f"hydra.run.dir={out}"]
    proc = cli_process.run(cmd, timeout=600, cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr[-3000:]
    summary = pd.read_parquet(next(out.glob("results/synthetic/*/candor_lipschitz/class_overlap/summary.parquet")))
    table = pd.read_csv(out / "tables" / "candor_v1_lipschitz.csv")
    assert table["Separation"].tolist() == [2.0, 0.1]
    lin = summary[summary["head"] == "linear"].sort_values("level")
    assert table["Linear error"].tolist() == pytest.approx(lin["error"].tolist())
    assert table["Linear mean bound"].tolist() == pytest.approx(lin["mean_bound"].tolist())
    pub = pd.read_csv(out / "tables" / "candor_v1_lipschitz_published.csv").set_index("Quantity")
    assert pub.loc["test pairs per head", ["Ours", "Published"]].tolist() == [100, 5000]
    assert pub.loc["pairs whose achieved margin exceeds the bound", "Ours"] == 0
    assert pub.loc["mean bound of the shallow head, lowest level", "Published"] == 4.9
    assert pub.loc["mean bound of the linear head, highest level", "Ours"] == pytest.approx(lin["mean_bound"].max())
    assert pub.loc["linear head error, highest level", "Published"] == 0.261
