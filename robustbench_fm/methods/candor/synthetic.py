"""candor_v1.md's synthetic sweep of class overlap: Proposition 1 (irreducibility), Corollary 1
(the cap is geometric) and the heads' errors as the geometry closes ("Irreducible per encoder but
recoverable across the panel").

candor_v1.md: "Proposition 1 (Irreducibility). Let h be L-Lipschitz on S^{d-1} with decision rule
1[h(z) ≥ τ], and say h separates an opposite-label pair (z+, z−) with margin m > 0 if h(z+) ≥ τ + m
and h(z−) ≤ τ − m. Then ‖z+ − z−‖ ≥ 2m/L ⟺ ⟨z+, z−⟩ ≤ 1 − 2m²/L²." "Corollary 1 [...] every
L-Lipschitz head separating x from that z− with margin m obeys m/L ≤ ½ √(2 − 2c−(x))" (Eq. 3).
"On a synthetic sweep of class overlap the achieved joint margin never exceeds the bound on any
of 5,000 test pairs, while the bound itself stays between 4.9 and 7.1 [...]. Linear error rises
from 0.0 to 26.1 and the shallow network from 0.0 to 28.9, so the extra capacity never wins a
cell."

The paper does not define the sweep's data, pairs or units; our reading, stated where it is used:

* data: two classes on the unit sphere S^{d−1}, z = normalise(±(s/2)·e₁ + ε), ε ~ N(0, I/d); the
  sweep lowers the separation s (``separations``), so the classes overlap more at every level;
* heads: a linear head and a shallow network (one hidden layer of ``hidden`` ReLU units), both
  trained with Adam as candor_v1.md "Implementation" trains its heads (30 epochs, learning rate
  0.001, weight decay 10⁻⁴, batch 256), the logit h and τ = 0;
* L: the head's Lipschitz constant, exact for the linear head (‖w‖₂) and the product of the
  layers' spectral norms for the network (an upper bound, so Proposition 1 holds a fortiori);
* a test pair: a test positive and its nearest test negative (the discordant twin Corollary 1
  speaks of), ``pairs_per_level`` per level (10 × 500 = the paper's 5,000 pairs);
* the achieved joint margin of a pair: min(h(z+) − τ, τ − h(z−)) (negative when the head errs on
  either); the bound: L‖z+ − z−‖/2 (Proposition 1), in the logit's units, which is how we read the
  printed 4.9 to 7.1 (the unit is not stated); we report each level's mean bound;
* "the extra capacity never wins a cell": the levels at which the network's test error is below
  the linear head's.
"""
from __future__ import annotations

import numpy as np
import pandas as pd

from ...core.neighbors import l2_normalize
from ...core.results import Results
from .params import LipschitzParams


def overlap_features(separation: float, n: int, dim: int, rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray]:
    """``n`` unit vectors of two balanced classes whose means are ±(s/2)·e₁ before normalisation."""
    y = rng.permutation(np.arange(n) % 2)
    z = rng.normal(scale=1 / np.sqrt(dim), size=(n, dim))
    z[:, 0] += (2 * y - 1) * separation / 2
    return l2_normalize(z.astype(np.float32)), y


def train_head(z: np.ndarray, y: np.ndarray, hidden: int, epochs: int, lr: float, weight_decay: float,
               batch_size: int, seed: int):
    """A linear head (``hidden`` = 0) or a one-hidden-layer ReLU network, trained with Adam on the
    logistic loss (local generator: no global seeding)."""
    import torch  # lazy: the stage module is imported on first use only

    gen = torch.Generator().manual_seed(seed)
    dim = z.shape[1]
    layers = [torch.nn.Linear(dim, 1)] if hidden == 0 else [torch.nn.Linear(dim, hidden), torch.nn.ReLU(),
                                                               torch.nn.Linear(hidden, 1)]
    with torch.random.fork_rng(devices=[]):  # the layers' initialisation draws, without leaking
        torch.manual_seed(seed)
        head = torch.nn.Sequential(*layers)
    opt = torch.optim.Adam(head.parameters(), lr=lr, weight_decay=weight_decay)
    x, t = torch.as_tensor(z), torch.as_tensor(y, dtype=torch.float32)
    for _ in range(epochs):
        order = torch.randperm(len(x), generator=gen)
        for start in range(0, len(x), batch_size):
            at = order[start:start + batch_size]
            opt.zero_grad()
            torch.nn.functional.binary_cross_entropy_with_logits(head(x[at]).squeeze(1), t[at]).backward()
            opt.step()
    return head


def lipschitz_constant(head) -> float:
    """L of the logit: ‖w‖₂ for a linear head (exact); for a ReLU network the product of its
    linear layers' spectral norms (ReLU is 1-Lipschitz; an upper bound)."""
    import torch  # lazy: the stage module is imported on first use only

    out = 1.0
    for layer in head:
        if isinstance(layer, torch.nn.Linear):
            out *= float(torch.linalg.matrix_norm(layer.weight.detach().double(), ord=2))
    return out


def logits(head, z: np.ndarray) -> np.ndarray:
    import torch  # lazy: the stage module is imported on first use only

    with torch.no_grad():
        return head(torch.as_tensor(z)).squeeze(1).double().numpy()


def twin_pairs(z: np.ndarray, y: np.ndarray, n_pairs: int, rng: np.random.Generator) -> np.ndarray:
    """(positive, its nearest negative) index pairs for ``n_pairs`` random test positives."""
    pos, neg = np.flatnonzero(y == 1), np.flatnonzero(y == 0)
    chosen = rng.choice(pos, size=min(n_pairs, len(pos)), replace=False)
    nearest = neg[np.argmax(z[chosen] @ z[neg].T, axis=1)]
    return np.c_[chosen, nearest]


def discordance(z: np.ndarray, y: np.ndarray, k: int) -> float:
    """D of the test positives with all test positives (the query left out) and negatives as the
    candidate sets (balanced classes: sizes n/2 − 1 and n/2), Eq. 1–2."""
    sims = z @ z.T
    np.fill_diagonal(sims, -np.inf)
    pos, neg = y == 1, y == 0
    c_pos = -np.sort(-sims[pos][:, pos], axis=1)[:, :k].mean(axis=1)
    c_neg = -np.sort(-sims[pos][:, neg], axis=1)[:, :k].mean(axis=1)
    return float(((c_neg - c_pos) > 0).mean())


def lipschitz_sweep(**params) -> tuple[pd.DataFrame, pd.DataFrame]:
    """The sweep (module doc) with ``params`` (:class:`LipschitzParams`, the paper's defaults):
    one row per (level, head) with the test error, L, the mean bound and margin over the level's
    pairs and the pairs whose achieved margin exceeds the bound; and one row per (level, head,
    pair). Every level draws from its own child generator."""
    p = LipschitzParams.parse(params)
    separations, dim, n_train, n_test, pairs_per_level, hidden, epochs, lr, weight_decay, batch_size, k, seed = (
        p.separations, p.dim, p.n_train, p.n_test, p.pairs_per_level, p.hidden, p.epochs, p.lr, p.weight_decay,
        p.batch_size, p.k, p.seed)
    levels, pairs = [], []
    children = np.random.SeedSequence(seed).spawn(len(separations))
    for level, (s, child) in enumerate(zip(separations, children)):
        rng = np.random.default_rng(child)
        z_train, y_train = overlap_features(float(s), n_train, dim, rng)
        z_test, y_test = overlap_features(float(s), n_test, dim, rng)
        twins = twin_pairs(z_test, y_test, pairs_per_level, rng)
        gap = np.linalg.norm(z_test[twins[:, 0]].astype(np.float64) - z_test[twins[:, 1]], axis=1)
        d = discordance(z_test.astype(np.float64), y_test, k)
        for name, width in (("linear", 0), ("shallow", hidden)):
            head = train_head(z_train, y_train, width, epochs, lr, weight_decay, batch_size, seed + level)
            h = logits(head, z_test)
            lip = lipschitz_constant(head)
            margin = np.minimum(h[twins[:, 0]], -h[twins[:, 1]])  # τ = 0
            bound = lip * gap / 2
            error = float(((h > 0) != y_test).mean())
            levels.append(dict(level=level, separation=float(s), head=name, d=d, error=error,
                               lipschitz=lip, mean_bound=float(bound.mean()), mean_margin=float(margin.mean()),
                               n_pairs=len(twins), violations=int((margin > bound * (1 + 1e-9)).sum())))
            pairs.append(pd.DataFrame({"level": level, "head": name, "positive": twins[:, 0], "negative": twins[:, 1],
                                       "distance": gap, "margin": margin, "bound": bound,
                                       "normalized_margin": margin / lip}))
    return pd.DataFrame(levels), pd.concat(pairs, ignore_index=True)


# --- the stage: experiment=candor_v1_lipschitz --------------------------------------------------
#: the finding the sweep's results are saved under (``results/synthetic/<dataset>/candor_lipschitz/``)
FINDING = "class_overlap"
#: what the results record as the encoder: the features are synthetic, no encoder embeds anything
ENCODER = "synthetic"


PARAMS = LipschitzParams


def run_job(job) -> list[pd.DataFrame]:
    """The sweep with the job's parameters; the job's dataset and encoders are not read (the data
    are synthetic). Saves ``results/synthetic/<dataset>/candor_lipschitz/class_overlap/``:
    ``summary`` one row per (level, head), ``per_sample`` one row per (level, head, pair)."""
    p = PARAMS.parse(job.params)
    levels, pairs = lipschitz_sweep(**p.to_dict())
    summary = levels.assign(finding=FINDING, reason="")
    res = Results(summary=summary, per_sample=pairs.assign(finding=FINDING), params=p.to_dict())
    summary = summary.copy()
    summary.insert(0, "encoder", ENCODER)
    summary.insert(1, "dataset", job.dataset)
    res.summary = summary
    res.save(job.out_dir / "results" / ENCODER / str(job.dataset) / job.stage / FINDING)
    return [summary]
