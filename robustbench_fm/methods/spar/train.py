"""Training loop of every SPAR configuration (spar.md Section 3.2): Adam (lr 1e-4), batch 16, at
most 50 epochs, early stopping on the validation loss with patience 20, the best-validation
weights restored at the end."""
from __future__ import annotations

import contextlib
import copy
from dataclasses import dataclass
from typing import Callable

import numpy as np
import torch

from .params import SparParams

#: ``batch(idx, rng)`` -> (inputs, question or None, target); ``rng`` is None for evaluation.
BatchFn = Callable[[np.ndarray, np.random.Generator | None], tuple[torch.Tensor, torch.Tensor | None, object]]
LossFn = Callable[[torch.Tensor, object], torch.Tensor]


@dataclass(frozen=True)
class TrainConfig:
    """Adam and early stopping (spar.md Section 3.2; defaults of
    :class:`~robustbench_fm.methods.spar.params.SparParams`)."""

    lr: float = SparParams.lr
    batch_size: int = SparParams.batch_size
    max_epochs: int = SparParams.max_epochs
    patience: int = SparParams.patience
    seed: int = 42


def _autocast(device: torch.device):
    return torch.autocast("cuda", dtype=torch.bfloat16) if device.type == "cuda" else contextlib.nullcontext()


def _chunks(idx: np.ndarray, size: int):
    return (idx[i:i + size] for i in range(0, len(idx), size))


def fit(model: torch.nn.Module, batch: BatchFn, loss: LossFn, train_idx: np.ndarray, val_idx: np.ndarray,
        cfg: TrainConfig, device: torch.device) -> dict:
    """Train the parameters of ``model`` that require gradients; returns the epochs run and the
    best validation loss, with the best-validation weights loaded back into ``model``."""
    params = [p for p in model.parameters() if p.requires_grad]
    opt = torch.optim.Adam(params, lr=cfg.lr)
    rng = np.random.default_rng(cfg.seed)
    best, best_state, stale, epochs = float("inf"), None, 0, 0
    for epoch in range(cfg.max_epochs):
        model.train()
        for idx in _chunks(rng.permutation(train_idx), cfg.batch_size):
            x, q, target = batch(idx, rng)
            with _autocast(device):
                out = model(x, q)
            value = loss(out.float(), target)
            opt.zero_grad(set_to_none=True)
            value.backward()
            opt.step()
        epochs = epoch + 1
        val = evaluate_loss(model, batch, loss, val_idx, cfg.batch_size, device)
        if val < best:
            best, stale = val, 0
            best_state = copy.deepcopy({k: v.detach().clone() for k, v in model.state_dict().items()})
        else:
            stale += 1
            if stale >= cfg.patience:
                break
    if best_state is not None:
        model.load_state_dict(best_state)
    return {"epochs": epochs, "val_loss": best}


@torch.no_grad()
def evaluate_loss(model, batch: BatchFn, loss: LossFn, idx: np.ndarray, batch_size: int,
                  device: torch.device) -> float:
    """Mean loss over ``idx`` (weighted by batch size) in eval mode."""
    model.eval()
    total, count = 0.0, 0
    for part in _chunks(idx, batch_size):
        x, q, target = batch(part, None)
        with _autocast(device):
            out = model(x, q)
        total += float(loss(out.float(), target)) * len(part)
        count += len(part)
    return total / max(count, 1)


@torch.no_grad()
def predict(model, batch: BatchFn, idx: np.ndarray, batch_size: int, device: torch.device) -> np.ndarray:
    """Model outputs for ``idx`` (eval mode), float32 on the CPU."""
    model.eval()
    outs = []
    for part in _chunks(idx, batch_size):
        x, q, _ = batch(part, None)
        with _autocast(device):
            outs.append(model(x, q).float().cpu())
    return torch.cat(outs).numpy()
