"""Synthetic CRoMa cohorts (label × confounder cells of slides of tiles) and the reference
package's view of them (its manifest wants ``label``, ``group_id``, ``image_path``)."""
import numpy as np
import pandas as pd


def cohort(n_labels=2, n_confs=2, slides_per_cell=4, tiles_per_slide=20, dim=24, label_shift=0.5,
           conf_shift=0.4, slide_shift=0.3, noise=1.0, seed=0, dtype=np.float32, shuffle=True):
    """Features = label, confounder and slide offsets along random unit directions + Gaussian noise
    (norm ≈ ``noise``). Returns (features, canonical manifest)."""
    rng = np.random.default_rng(seed)
    cells = [(lab, con) for lab in range(n_labels) for con in range(n_confs)]
    lab, con, slide = [], [], []
    for c, (la, co) in enumerate(cells):
        for s in range(slides_per_cell):
            lab += [la] * tiles_per_slide
            con += [co] * tiles_per_slide
            slide += [c * slides_per_cell + s] * tiles_per_slide
    lab, con, slide = np.array(lab), np.array(con), np.array(slide)

    def directions(n):
        v = rng.standard_normal((n, dim))
        return v / np.linalg.norm(v, axis=1, keepdims=True)

    x = (label_shift * directions(n_labels)[lab] + conf_shift * directions(n_confs)[con]
         + slide_shift * directions(slide.max() + 1)[slide]
         + noise * rng.standard_normal((len(lab), dim)) / np.sqrt(dim))
    manifest = pd.DataFrame({"sample_id": [f"t{i:05d}" for i in range(len(lab))],
                             "bio_label": np.array([f"class{v}" for v in range(n_labels)])[lab],
                             "site": np.array([f"centre{v}" for v in range(n_confs)])[con],
                             "slide_id": [f"slide{v:03d}" for v in slide]})
    if shuffle:
        order = rng.permutation(len(lab))
        x, manifest = x[order], manifest.iloc[order].reset_index(drop=True)
    return x.astype(dtype), manifest


def quartets(n_subsets=3, tiles_per_cell=25, dim=24, seed=0, dtype=np.float32, reuse=True):
    """A paired 2×2 design: subset s holds labels {a, a+1} × centres {a, a+1}, one slide per cell
    (a = s with ``reuse``, so consecutive subsets share the cell (s+1, s+1) and its tiles appear in
    two subsets as repeated rows with the same sample_id; a = 2s without)."""
    rng = np.random.default_rng(seed)
    n = n_subsets + 1 if reuse else 2 * n_subsets
    x, man = cohort(n_labels=n, n_confs=n, slides_per_cell=1, tiles_per_slide=tiles_per_cell, dim=dim,
                    seed=seed, dtype=dtype, shuffle=False)
    rows, subsets = [], []
    for s in range(n_subsets):
        a = s if reuse else 2 * s
        pick = np.flatnonzero(man["bio_label"].isin([f"class{a}", f"class{a + 1}"])
                              & man["site"].isin([f"centre{a}", f"centre{a + 1}"]))
        rows.append(pick)
        subsets += [f"q{s:02d}"] * len(pick)
    rows = np.concatenate(rows)
    order = rng.permutation(len(rows))
    manifest = man.iloc[rows[order]].reset_index(drop=True)
    manifest["subset"] = np.array(subsets)[order]
    return x[rows[order]], manifest


def reference_manifest(manifest, label_col="bio_label", group_col="slide_id"):
    """The same rows in the reference package's schema (confounder column kept as is)."""
    out = manifest.copy()
    out["label"] = out[label_col]
    out["group_id"] = out[group_col]
    out["image_path"] = out["sample_id"] + ".png"
    return out
