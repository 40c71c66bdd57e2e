"""Heads, operating point and AUROC intervals (robustbench_fm/heads/train.py, operating_point.py,
bootstrap.py, stages/heads.py)."""
import numpy as np
import pytest
import torch
from heads_data import synthetic
from sklearn.metrics import roc_auc_score

from robustbench_fm import evaluate
from robustbench_fm.methods.heads.bootstrap import resample_weights, weighted_auroc
from robustbench_fm.methods.heads.operating_point import threshold_at_sensitivity
from robustbench_fm.methods.heads.train import Adam, _loss_grads, build_head


@pytest.mark.parametrize("kind", ["linear", "mlp"])
def test_written_out_backward_and_adam_match_autograd_and_torch_adam(kind):
    torch.manual_seed(0)
    ours, ref = build_head(kind, 8, hidden=5), build_head(kind, 8, hidden=5)
    ref.load_state_dict(ours.state_dict())
    layers = [m for m in ours.modules() if isinstance(m, torch.nn.Linear)]
    opt = Adam([p for layer in layers for p in (layer.weight, layer.bias)], 1e-2, 1e-4)
    ref_opt = torch.optim.Adam(ref.parameters(), 1e-2, weight_decay=1e-4)
    for step in range(5):
        x, y = torch.randn(16, 8), (torch.rand(16) > 0.5).float()
        with torch.no_grad():
            opt.step(_loss_grads(layers, x, y))
        ref_opt.zero_grad()
        torch.nn.functional.binary_cross_entropy_with_logits(ref(x).squeeze(1), y).backward()
        ref_opt.step()
    for a, b in zip(ours.parameters(), ref.parameters()):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-6)


def test_linear_head_separates_separable_features():
    x, m = synthetic(n=1000, d=4, signal=8.0)  # every dimension separates the classes
    res = evaluate("linear_head", x, m, finding="f", n_boot=50, lr=0.02)
    row = res.summary.iloc[0]
    assert row["auroc"] == 1.0 and row["test_specificity"] > 0.9
    assert row["n"] == (m["split"] == "test").sum() and row["n_train"] == (m["split"] == "train").sum()
    per = res.per_sample
    assert set(per["split"]) == {"val", "test"} and (per["pred"] == (per["logit"] >= row["threshold_logit"])).all()
    np.testing.assert_allclose(per["prob"], 1 / (1 + np.exp(-per["logit"])))


def test_label_independent_features_have_a_ci_around_chance_and_runs_repeat():
    x, m = synthetic(n=800, signal=0.0, seed=1)
    first = evaluate("linear_head", x, m, finding="f", n_boot=200, epochs=5).summary.iloc[0]
    assert first["auroc_ci_low"] <= 0.5 <= first["auroc_ci_high"]
    again = evaluate("linear_head", x, m, finding="f", n_boot=200, epochs=5).summary.iloc[0]
    assert first["auroc"] == again["auroc"] and first["threshold"] == again["threshold"]


def test_operating_point_is_the_largest_threshold_meeting_the_sensitivity():
    rng = np.random.default_rng(0)
    for n_pos in (1, 5, 10, 37):
        labels = np.r_[np.ones(n_pos), np.zeros(30)]
        scores = np.round(rng.normal(size=len(labels)), 1)  # ties on purpose
        t = threshold_at_sensitivity(labels, scores, 0.8)
        sens = (scores[labels == 1] >= t).mean()
        above = scores[labels == 1][scores[labels == 1] > t]
        assert sens >= 0.8
        if len(above):  # the next candidate threshold up loses the target
            assert (scores[labels == 1] >= above.min()).mean() < 0.8


def test_weighted_auroc_matches_sklearn_on_replicated_rows():
    rng = np.random.default_rng(0)
    y, s = rng.integers(0, 2, 60), np.round(rng.normal(size=60), 1)
    w = resample_weights(np.arange(60) // 3, 4, rng)
    for row in w:
        rep = np.repeat(np.arange(60), row.astype(int))
        assert weighted_auroc(y, s, row[None])[0] == pytest.approx(roc_auc_score(y[rep], s[rep]), abs=1e-12)
