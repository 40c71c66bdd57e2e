"""Training loop of every SPAR configuration (spar.md Section 3.2): Adam (lr 1e-4), batch 16, at
most 50 epochs, early stopping on the validation loss with patience 20, the best-validation
weights restored at the end."""
from __future__ import annotations

import contextlib
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
    min_delta: float = SparParams.min_delta
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
        cfg: TrainConfig, device: torch.device, groups: np.ndarray | None = None,
        own: dict[int, str] | None = None) -> dict:
    """Train the parameters of ``model`` that require gradients; returns the epochs run and the
    best validation loss, with the best-validation weights loaded back into ``model``. ``groups``
    (per sample): batches of one group each (:func:`batches`), in training and validation.

    ``own`` (group -> the name prefix of the parameters only that group trains, e.g. Level 3's
    frozen ``{p: "head.heads.p."}``): the groups are independent models sharing one loop, and each
    is early-stopped on ITS OWN validation loss (spar.md Section 3.2: early stopping on the
    validation loss, patience 20; Section 3.1, Level 3: six heads, "cross-entropy loss per head"):
    a group whose loss has not improved for ``patience`` epochs stops training, each group gets
    back its own best-validation weights, and the result's ``by_group`` holds each group's best
    validation loss and epochs trained. A group without validation samples trains every epoch
    and keeps its last weights (its loss is reported as inf). Without ``own``, one early stop for
    the whole model on the summed loss (:func:`evaluate_loss`).

    ``cfg.min_delta`` (0 by default: any decrease counts, as spar.md Section 3.2 reads): an epoch
    resets the patience only when its validation loss falls more than ``min_delta`` below the loss of
    the last epoch that did (``min_delta`` of Keras' and Lightning's EarlyStopping). The weights kept
    are still those of the lowest validation loss. A head whose loss keeps creeping down by less (a
    planted head at accuracy 1.0, its cross-entropy shrinking by 1e-5 an epoch) then stops ``patience``
    epochs after its last real improvement instead of at ``max_epochs``."""
    params = [p for p in model.parameters() if p.requires_grad]
    opt = torch.optim.Adam(params, lr=cfg.lr)
    rng = np.random.default_rng(cfg.seed)
    keys = list(own) if own else [None]
    best = dict.fromkeys(keys, float("inf"))
    mark = dict.fromkeys(keys, float("inf"))  # the loss of the last epoch that reset the patience
    stale, trained, best_state = dict.fromkeys(keys, 0), dict.fromkeys(keys, 0), {}
    stopped: set = set()
    epochs = 0
    for epoch in range(cfg.max_epochs):
        model.train()
        for idx in batches(train_idx, cfg.batch_size, groups, rng):
            if own and int(np.asarray(groups)[idx[0]]) in stopped:
                continue
            x, q, target = batch(idx, rng)
            with _autocast(device):
                out = model(x, q)
            value = loss(out.float(), target)
            opt.zero_grad(set_to_none=True)
            value.backward()
            opt.step()
        epochs = epoch + 1
        if own:  # the groups still training
            live = val_idx[~np.isin(np.asarray(groups)[val_idx], list(stopped))]
            val = evaluate_losses(model, batch, loss, live, cfg.batch_size, device, groups)
        else:
            val = {None: evaluate_loss(model, batch, loss, val_idx, cfg.batch_size, device, groups)}
        for key in keys:
            if key in stopped:
                continue
            trained[key] = epochs
            if key not in val:
                continue  # no validation sample: trains on, keeps its last weights
            if val[key] < best[key]:
                best[key] = val[key]
                prefix = own[key] if own else ""
                best_state[key] = {k: v.detach().clone() for k, v in model.state_dict().items()
                                   if k.startswith(prefix)}
            if val[key] < mark[key] - cfg.min_delta:
                mark[key], stale[key] = val[key], 0
            else:
                stale[key] += 1
                if stale[key] >= cfg.patience:
                    stopped.add(key)
        if len(stopped) == len(keys):
            break
    for state in best_state.values():
        model.load_state_dict(state, strict=False)
    out = {"epochs": epochs, "val_loss": sum(best.values())}
    if own:
        out["by_group"] = {k: {"val_loss": best[k], "epochs": trained[k]} for k in keys}
    return out


@torch.no_grad()
def evaluate_losses(model, batch: BatchFn, loss: LossFn, idx: np.ndarray, batch_size: int,
                    device: torch.device, groups: np.ndarray | None = None) -> dict:
    """Mean loss over ``idx`` in eval mode, per group ({group: mean over its samples}; one key,
    None, without ``groups``); batches of one group each."""
    model.eval()
    total, count = {}, {}
    for part in batches(idx, batch_size, groups, None):
        x, q, target = batch(part, None)
        with _autocast(device):
            out = model(x, q)
        key = None if groups is None else int(np.asarray(groups)[part[0]])
        total[key] = total.get(key, 0.0) + float(loss(out.float(), target)) * len(part)
        count[key] = count.get(key, 0) + len(part)
    return {k: total[k] / count[k] for k in total}


def evaluate_loss(model, batch: BatchFn, loss: LossFn, idx: np.ndarray, batch_size: int,
                  device: torch.device, groups: np.ndarray | None = None) -> float:
    """Mean loss over ``idx`` (weighted by batch size) in eval mode. With ``groups`` (Level 3: the
    probe of each question), the SUM over groups of each group's mean loss: the six heads' own
    cross-entropies added (spar.md Section 3.1, Level 3: "cross-entropy loss per head"), so early
    stopping and the learning-rate search of a jointly trained model (ViT-Combined, finetuned
    backbones) weigh every probe alike however many questions it has."""
    return sum(evaluate_losses(model, batch, loss, idx, batch_size, device, groups).values())


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
