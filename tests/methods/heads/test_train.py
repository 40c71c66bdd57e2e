"""Heads, operating point and AUROC intervals (robustbench_fm/methods/heads/train.py,
operating_point.py, stage.py; the bootstrap in robustbench_fm/core/stats.py)."""
import numpy as np
import pytest
import torch
from heads_data import synthetic
from sklearn.metrics import roc_auc_score

from robustbench_fm import evaluate
from robustbench_fm.core.stats import ResampledAUROC, cluster_codes, cluster_count_chunks
from robustbench_fm.methods.heads.operating_point import threshold_at_sensitivity
from robustbench_fm.methods.heads.train import Standardizer, build_head, train_head


def _loss_grads(layers: list[torch.nn.Linear], xb: torch.Tensor, yb: torch.Tensor) -> list[torch.Tensor]:
    """Reference: gradients of the mean binary cross-entropy with respect to each layer's (weight,
    bias), for a chain of linear layers with ReLU between them (the backward pass written out as
    matmuls; the heads' training before it moved to autograd)."""
    acts = [xb]
    for layer in layers[:-1]:
        acts.append(torch.relu(acts[-1] @ layer.weight.T + layer.bias))
    logit = acts[-1] @ layers[-1].weight.T + layers[-1].bias
    delta = (torch.sigmoid(logit) - yb[:, None]) / len(yb)
    grads = []
    for i in range(len(layers) - 1, -1, -1):
        grads[:0] = [delta.T @ acts[i], delta.sum(0)]
        if i:
            delta = (delta @ layers[i].weight) * (acts[i] > 0)
    return grads


class Adam:
    """Reference: Adam written out (L2 weight decay added to the gradient, bias-corrected moments,
    β = (0.9, 0.999), ε = 1e-8; Kingma & Ba 2015, Algorithm 1) applied in place to ``params``."""

    def __init__(self, params: list[torch.Tensor], lr: float, weight_decay: float,
                 betas=(0.9, 0.999), eps: float = 1e-8):
        self.params, self.lr, self.wd, self.betas, self.eps, self.t = params, lr, weight_decay, betas, eps, 0
        self.m = [torch.zeros_like(p) for p in params]
        self.v = [torch.zeros_like(p) for p in params]

    def step(self, grads: list[torch.Tensor]) -> None:
        self.t += 1
        b1, b2 = self.betas
        for p, g, m, v in zip(self.params, grads, self.m, self.v):
            g = g + self.wd * p
            m.lerp_(g, 1 - b1)
            v.mul_(b2).addcmul_(g, g, value=1 - b2)
            denom = (v.sqrt() / (1 - b2 ** self.t) ** 0.5).add_(self.eps)
            p.addcdiv_(m, denom, value=-self.lr / (1 - b1 ** self.t))


@torch.no_grad()
def written_out_head(x, y, kind, seed, epochs=30, lr=1e-3, weight_decay=1e-4, batch_size=256, hidden=256):
    """Reference: the heads' training with the written-out backward pass and Adam, the layers
    initialised under ``torch.manual_seed(seed)`` (global RNG restored) and the batches shuffled
    by a CPU generator seeded with ``seed``."""
    feats = torch.as_tensor(np.asarray(x, np.float32))
    scaler = Standardizer.fit(feats)
    feats = scaler(feats)
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        model = build_head(kind, x.shape[1], hidden)
    layers = [m for m in model.modules() if isinstance(m, torch.nn.Linear)]
    opt = Adam([p for layer in layers for p in (layer.weight, layer.bias)], lr, weight_decay)
    target = torch.as_tensor(np.asarray(y, np.float32))
    gen = torch.Generator().manual_seed(seed)
    for _ in range(epochs):
        order = torch.randperm(len(feats), generator=gen)
        for start in range(0, len(order), batch_size):
            idx = order[start:start + batch_size]
            opt.step(_loss_grads(layers, feats.index_select(0, idx), target.index_select(0, idx)))
    return model, scaler


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
    codes = cluster_codes(np.arange(60) // 3)
    counts = next(cluster_count_chunks(int(codes.max()) + 1, 4, rng))
    for row, value in zip(counts, ResampledAUROC(s, y, codes)(counts)):
        rep = np.repeat(np.arange(60), row[codes])
        assert value == pytest.approx(roc_auc_score(y[rep], s[rep]), abs=1e-12)


@pytest.mark.parametrize("kind", ["linear", "mlp"])
def test_local_generator_gives_the_default_initialisation(kind):
    """build_head from a generator seeded s = the layers built after torch.manual_seed(s), exactly;
    the global RNG is neither read nor advanced."""
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(7)
        ref = build_head(kind, 9, hidden=6)
    state = torch.get_rng_state()
    ours = build_head(kind, 9, hidden=6, generator=torch.Generator().manual_seed(7))
    assert torch.equal(state, torch.get_rng_state())
    assert [n for n, _ in ours.named_parameters()] == [n for n, _ in ref.named_parameters()]
    for a, b in zip(ours.parameters(), ref.parameters()):
        assert torch.equal(a, b)
    bound = 1 / np.sqrt(9)
    first = next(ours.parameters())
    assert first.abs().max() <= bound and first.abs().max() > 0.5 * bound  # U(±1/√fan_in)


@pytest.mark.parametrize("kind", ["linear", "mlp"])
def test_autograd_training_matches_the_written_out_reference(kind):
    """train_head (autograd, torch.optim.Adam with coupled L2 decay) reproduces the written-out
    backward pass and Adam over 30 epochs of shuffled batches: same weights to float tolerance, the
    same test AUROC, and the global RNG untouched."""
    x, m = synthetic(n=1200, d=16, signal=0.7, seed=3)
    train, test = (m["split"] == s for s in ("train", "test"))
    y = m["f"].to_numpy()
    state = torch.get_rng_state()
    head = train_head(x[train], y[train], kind=kind, seed=5, hidden=32, device="cpu")
    assert torch.equal(state, torch.get_rng_state())
    ref, scaler = written_out_head(x[train], y[train], kind, seed=5, hidden=32)
    for a, b in zip(head.model.parameters(), ref.parameters()):
        torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-5)
    with torch.no_grad():
        ref_logit = ref(scaler(torch.as_tensor(x[test]))).squeeze(1).double().numpy()
    logit = head.logits(x[test])
    np.testing.assert_allclose(logit, ref_logit, rtol=1e-4, atol=1e-5)
    assert roc_auc_score(y[test], logit) == roc_auc_score(y[test], ref_logit)
    trained_away = [not torch.equal(a, b) for a, b in zip(head.model.parameters(),
                                                          build_head(kind, 16, 32, torch.Generator().manual_seed(5))
                                                          .parameters())]
    assert all(trained_away)
