"""Small synthetic features and manifests for the heads tests."""
import numpy as np
import pandas as pd


def synthetic(n=600, d=16, signal=0.0, seed=0, prevalence=0.3, split=True, groups=("a", "b")):
    """Features with ``signal`` added along the first 4 dims of the positives, and a manifest with
    patients of two images, matched groups and (optionally) a train/val/test split."""
    rng = np.random.default_rng(seed)
    y = (rng.random(n) < prevalence).astype(float)
    x = rng.normal(size=(n, d)).astype(np.float32)
    x[:, :4] += signal * y[:, None]
    m = pd.DataFrame({"sample_id": [f"s{i:05d}" for i in range(n)], "patient_id": [f"p{i // 2}" for i in range(n)],
                      "acq_group": np.array(groups)[np.arange(n) % len(groups)], "f": y})
    if split:
        u = np.arange(n) // 2 % 10
        m["split"] = np.where(u < 6, "train", np.where(u < 8, "val", "test"))
    return x, m
