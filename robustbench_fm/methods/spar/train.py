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


def batches(idx: np.ndarray, size: int, groups: np.ndarray | None, rng: np.random.Generator | None) -> list:
    """Batches of ``idx`` (shuffled when ``rng`` is given). With ``groups`` (one label per sample,
    indexed by sample), every batch holds samples of ONE group: each group's samples are chunked
    on their own and the batches' order is shuffled. Level 3 uses it with the probe as the group,
    so each step trains the one head that the batch routes to (six heads, "cross-entropy loss per
    head", spar.md Section 3.1) instead of running all six heads on slivers of every batch."""
    order = rng.permutation(idx) if rng is not None else np.asarray(idx)
    if groups is None:
        return list(_chunks(order, size))
    g = np.asarray(groups)[order]
    out = [part for value in np.unique(g) for part in _chunks(order[g == value], size)]
    if rng is not None:
        out = [out[i] for i in rng.permutation(len(out))]
    return out


def fit(model: torch.nn.Module, batch: BatchFn, loss: LossFn, train_idx: np.ndarray, val_idx: np.ndarray,
        cfg: TrainConfig, device: torch.device, groups: np.ndarray | None = None) -> dict:
    """Train the parameters of ``model`` that require gradients; returns the epochs run and the
    best validation loss, with the best-validation weights loaded back into ``model``. ``groups``
    (per sample): batches of one group each (:func:`batches`), in training and validation."""
    params = [p for p in model.parameters() if p.requires_grad]
    opt = torch.optim.Adam(params, lr=cfg.lr)
    rng = np.random.default_rng(cfg.seed)
    best, best_state, stale, epochs = float("inf"), None, 0, 0
    for epoch in range(cfg.max_epochs):
        model.train()
        for idx in batches(train_idx, cfg.batch_size, groups, rng):
            x, q, target = batch(idx, rng)
            with _autocast(device):
                out = model(x, q)
            value = loss(out.float(), target)
            opt.zero_grad(set_to_none=True)
            value.backward()
            opt.step()
        epochs = epoch + 1
        val = evaluate_loss(model, batch, loss, val_idx, cfg.batch_size, device, groups)
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
                  device: torch.device, groups: np.ndarray | None = None) -> float:
    """Mean loss over ``idx`` (weighted by batch size) in eval mode; batches of one group each
    when ``groups`` is given (then, for Level 3, the mean cross-entropy over the samples)."""
    model.eval()
    total, count = 0.0, 0
    for part in batches(idx, batch_size, groups, None):
        x, q, target = batch(part, None)
        with _autocast(device):
            out = model(x, q)
        total += float(loss(out.float(), target)) * len(part)
        count += len(part)
    return total / max(count, 1)


@torch.no_grad()
def predict(model, batch: BatchFn, idx: np.ndarray, batch_size: int, device: torch.device,
            groups: np.ndarray | None = None) -> np.ndarray:
    """Model outputs for ``idx`` in ``idx`` order (eval mode), float32 on the CPU; computed in
    batches of one group each when ``groups`` is given."""
    model.eval()
    idx = np.asarray(idx)
    parts = batches(np.arange(len(idx)), batch_size, None if groups is None else np.asarray(groups)[idx], None)
    outs = []
    for part in parts:
        x, q, _ = batch(idx[part], None)
        with _autocast(device):
            outs.append(model(x, q).float().cpu())
    out = torch.cat(outs).numpy()
    result = np.empty_like(out)
    result[np.concatenate(parts)] = out
    return result
