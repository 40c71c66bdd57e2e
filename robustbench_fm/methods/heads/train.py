"""Linear and one-hidden-layer heads on frozen features (candor.md "Implementation";
candor_v1.md "Implementation": "a linear readout (primary) and a 256-unit hidden layer").

Each head is trained with Adam (learning rate 0.001, weight decay 10^-4 as Adam's L2 term) for 30
epochs with batch size 256 on the binary cross-entropy of its single logit. Features are
standardised with the training rows' mean and standard deviation (a constant column is left
centred). The initial weights come from ``torch.manual_seed(seed)`` on the CPU (the global RNG
is left untouched) and each epoch's shuffling from a CPU ``torch.Generator`` seeded with
``seed``, so a head trained on the GPU sees the same initial weights and batches as on the CPU
and agrees with it to float tolerance. The whole feature matrix sits on the device and each
batch is an index into it (no data loader).
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

from ...core.devices import resolve_device

HEADS = ("linear", "mlp")


@dataclass
class Standardizer:
    """x ↦ (x − mean) / std with the training rows' statistics (float32 on the head's device)."""

    mean: torch.Tensor
    std: torch.Tensor

    @classmethod
    def fit(cls, x: torch.Tensor) -> Standardizer:
        mean = x.mean(0)
        std = (x - mean).square_().mean(0).sqrt_()
        return cls(mean, torch.where(std > 0, std, torch.ones_like(std)))

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        return (x - self.mean) / self.std


def build_head(kind: str, dim: int, hidden: int = 256) -> torch.nn.Module:
    """``linear``: one logit from the features; ``mlp``: Linear(dim, hidden) → ReLU → Linear(hidden, 1)."""
    if kind == "linear":
        return torch.nn.Linear(dim, 1)
    if kind == "mlp":
        return torch.nn.Sequential(torch.nn.Linear(dim, hidden), torch.nn.ReLU(), torch.nn.Linear(hidden, 1))
    raise ValueError(f"head '{kind}' is not one of {', '.join(HEADS)}; set head=linear or head=mlp")


def _loss_grads(layers: list[torch.nn.Linear], xb: torch.Tensor, yb: torch.Tensor) -> list[torch.Tensor]:
    """Gradients of the mean binary cross-entropy with respect to each layer's (weight, bias), for a
    chain of linear layers with ReLU between them (the backward pass written out as matmuls)."""
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
    """torch.optim.Adam's update (L2 weight decay added to the gradient, bias-corrected moments,
    β = (0.9, 0.999), ε = 1e-8) applied in place to ``params``."""

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


@dataclass
class TrainedHead:
    """A trained head with the standardisation of its inputs; ``logits(x)`` scores raw features."""

    model: torch.nn.Module
    scaler: Standardizer
    device: torch.device

    @torch.no_grad()
    def logits(self, x: np.ndarray, block: int = 65536) -> np.ndarray:
        out = [self.model(self.scaler(torch.as_tensor(np.asarray(x[i:i + block], np.float32),
                                                      device=self.device))).squeeze(1)
               for i in range(0, len(x), block)]
        return torch.cat(out).double().cpu().numpy() if out else np.zeros(0)


@torch.no_grad()
def train_head(x: np.ndarray, y: np.ndarray, kind: str = "linear", seed: int = 42, epochs: int = 30,
               lr: float = 1e-3, weight_decay: float = 1e-4, batch_size: int = 256, hidden: int = 256,
               device="auto") -> TrainedHead:
    """Fit a ``kind`` head to binary labels ``y`` (0/1) of the rows ``x`` (module doc).

    The backward pass and Adam are written out as tensor operations (no autograd, no data loader);
    they reproduce ``torch.optim.Adam`` on the autograd gradients (tests/heads/test_train.py)."""
    device = resolve_device(device)
    feats = torch.as_tensor(np.asarray(x, np.float32), device=device)
    scaler = Standardizer.fit(feats)
    feats = scaler(feats)
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        model = build_head(kind, x.shape[1], hidden)
    model = model.to(device)
    layers = [m for m in model.modules() if isinstance(m, torch.nn.Linear)]
    opt = Adam([p for layer in layers for p in (layer.weight, layer.bias)], lr, weight_decay)
    target = torch.as_tensor(np.asarray(y, np.float32), device=device)
    gen = torch.Generator().manual_seed(seed)
    for _ in range(epochs):
        order = torch.randperm(len(feats), generator=gen).to(device)
        for start in range(0, len(order), batch_size):
            idx = order[start:start + batch_size]
            opt.step(_loss_grads(layers, feats.index_select(0, idx), target.index_select(0, idx)))
    model.eval()
    return TrainedHead(model, scaler, device)
