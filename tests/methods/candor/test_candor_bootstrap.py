"""CANDOR's patient bootstrap (methods/candor/bootstrap.py): the resamples a group takes for its rows
are the bootstrap's own, written out pair by pair."""
import numpy as np

from robustbench_fm.core import stats
from robustbench_fm.methods.candor import bootstrap


def test_group_aurocs_are_the_bootstraps_own_resamples():
    """The AUROC resamples a group takes for its rows (stored in each part under its patient set) are the
    values the bootstrap draws for that set, part by part, whatever the parts beside it."""
    rng = np.random.default_rng(31)
    clusters = np.repeat(np.arange(60), 2)
    parts = []
    for task in range(3):
        images = np.sort(rng.choice(120, 100, replace=False))
        labels = (rng.random(100) < 0.3) * 1.0
        parts.append(dict(task=task, row={"margin_auroc": 0.5}, queries=images[:10], images=images,
                          margin=rng.normal(size=100) + labels, labels=labels))
    bootstrap.group_aurocs(parts, clusters, 50, 7, stats.ResampledAUROC)
    for part in parts:
        [(key, values)] = part["aurocs"].items()
        patients = np.frombuffer(key, np.int64)
        np.testing.assert_array_equal(patients, np.unique(clusters[part["images"]]))
        alone = bootstrap.resampled_aurocs([part], patients, clusters, 50, 7, stats.ResampledAUROC)[:, 0]
        np.testing.assert_array_equal(values, alone)
        set_rng = bootstrap.patient_set_rng(7, patients)
        counts = np.concatenate(list(stats.cluster_count_chunks(len(patients), 50, set_rng,
                                                                max(bootstrap.BOOT_CHUNK, 64 * len(patients)))))
        want = per_unit_aurocs(part, patients, clusters, counts)
        np.testing.assert_array_equal(values, want)


def per_unit_aurocs(part, patients, clusters, counts):
    """The weighted Mann-Whitney AUROC of each resample written out pair by pair (ties ½)."""
    w = counts[:, np.searchsorted(patients, clusters[part["images"]])].astype(np.int64)
    pos, neg = part["labels"] == 1, part["labels"] == 0
    s = part["margin"]
    wins = (s[pos][:, None] > s[neg][None, :]) * 2 + (s[pos][:, None] == s[neg][None, :])
    return np.array([int(r[pos] @ wins @ r[neg]) / (2.0 * int(r[pos].sum()) * int(r[neg].sum())) for r in w])
