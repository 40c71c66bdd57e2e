"""Linear and one-hidden-layer heads on frozen features (candor.md "Implementation";
candor_v1.md "Implementation": "a linear readout (primary) and a 256-unit hidden layer").

Each head is trained with ``torch.optim.Adam`` (learning rate 0.001, weight decay 10^-4 as Adam's
coupled L2 term, wd·θ added to the gradient before the moments, not AdamW's decoupled decay) for
30 epochs with batch size 256 on the mean binary cross-entropy of its single logit, gradients by
autograd. Features are standardised with the training rows' mean and standard deviation (a
constant column is left centred). The initial weights are PyTorch's default ``nn.Linear``
initialisation drawn from a local CPU ``torch.Generator`` seeded with ``seed`` (the values
``torch.manual_seed(seed)`` and constructing the layers would give; the global RNG is neither
read nor seeded) and each epoch's shuffling comes from a second CPU ``torch.Generator`` seeded
with ``seed``, so a head trained on the GPU sees the same initial weights and batches as on the CPU
and agrees with it to float tolerance. The whole feature matrix sits on the device and each batch
is an index into it (no data loader).
"""
from __future__ import annotations

import math
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


def _linear(dim_in: int, dim_out: int, generator: torch.Generator | None) -> torch.nn.Linear:
    """``nn.Linear(dim_in, dim_out)`` with its default initialisation (``reset_parameters``: weight
    by kaiming_uniform with a = √5, i.e. U(±1/√dim_in), then bias U(±1/√dim_in)) drawn from
    ``generator`` (the global RNG when None)."""
    if generator is None:
        return torch.nn.Linear(dim_in, dim_out)
    layer = torch.nn.utils.skip_init(torch.nn.Linear, dim_in, dim_out)  # no draw from the global RNG
    with torch.no_grad():
        torch.nn.init.kaiming_uniform_(layer.weight, a=math.sqrt(5), generator=generator)
        bound = 1 / math.sqrt(dim_in) if dim_in > 0 else 0
        torch.nn.init.uniform_(layer.bias, -bound, bound, generator=generator)
    return layer


def build_head(kind: str, dim: int, hidden: int = 256, generator: torch.Generator | None = None) -> torch.nn.Module:
    """``linear``: one logit from the features; ``mlp``: Linear(dim, hidden) → ReLU → Linear(hidden, 1).
    The layers are initialised in that order from ``generator`` (the global RNG when None)."""
    if kind == "linear":
        return _linear(dim, 1, generator)
    if kind == "mlp":
        first = _linear(dim, hidden, generator)
        return torch.nn.Sequential(first, torch.nn.ReLU(), _linear(hidden, 1, generator))
    raise ValueError(f"head '{kind}' is not one of {', '.join(HEADS)}; set head=linear or head=mlp")


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


def train_head(x: np.ndarray, y: np.ndarray, kind: str = "linear", seed: int = 42, epochs: int = 30,
               lr: float = 1e-3, weight_decay: float = 1e-4, batch_size: int = 256, hidden: int = 256,
               device="auto") -> TrainedHead:
    """Fit a ``kind`` head to binary labels ``y`` (0/1) of the rows ``x`` (module doc): autograd
    gradients of the mean binary cross-entropy, ``torch.optim.Adam(lr, weight_decay)`` steps."""
    device = resolve_device(device)
    with torch.no_grad():
        feats = torch.as_tensor(np.asarray(x, np.float32), device=device)
        scaler = Standardizer.fit(feats)
        feats = scaler(feats)
        target = torch.as_tensor(np.asarray(y, np.float32), device=device)
    model = build_head(kind, x.shape[1], hidden, generator=torch.Generator().manual_seed(seed)).to(device)
    opt = torch.optim.Adam(model.parameters(), lr=lr, weight_decay=weight_decay)
    order_gen = torch.Generator().manual_seed(seed)
    with torch.enable_grad():
        for _ in range(epochs):
            order = torch.randperm(len(feats), generator=order_gen).to(device)
            for start in range(0, len(order), batch_size):
                idx = order[start:start + batch_size]
                logit = model(feats.index_select(0, idx)).squeeze(1)
                loss = torch.nn.functional.binary_cross_entropy_with_logits(logit, target.index_select(0, idx))
                opt.zero_grad(set_to_none=True)
                loss.backward()
                opt.step()
    model.eval()
    return TrainedHead(model, scaler, device)
