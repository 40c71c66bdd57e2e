"""The score helpers against independent references: sklearn's balanced accuracy (bit for bit),
croma 1.0.1's tail rule, and closed forms for the undefined-unit causes and the m-sweep summary."""
import numpy as np
import pytest
from croma.metrics.tail import compute_tail_metrics
from sklearn.metrics import balanced_accuracy_score

from robustbench_fm.methods.croma.scores import balanced_accuracy, distribution, sweep_summary, undefined_causes


@pytest.mark.parametrize("seed", range(5))
def test_balanced_accuracy_is_sklearns_to_the_bit(seed):
    rng = np.random.default_rng(seed)
    truth = rng.integers(0, 4, 57)
    truth[truth == 2] = 1  # class 2 absent from the truth, present in the predictions
    pred = rng.integers(0, 4, 57)
    with np.errstate(all="ignore"), pytest.warns(UserWarning):
        expected = balanced_accuracy_score(truth, pred)
    assert balanced_accuracy(truth, pred, np.bincount(truth, minlength=4)) == expected


def test_undefined_causes_closed_form():
    # four units, three slots: (SO), (SS, SS, OO), (OO, OO, SS), (SS, OO) and one without neighbours
    so = np.array([[1, 0, 0], [0, 0, 0], [0, 0, 0], [0, 0, 0], [0, 0, 0]], bool)
    os_ = np.zeros_like(so)
    ss = np.array([[0, 0, 0], [1, 1, 0], [0, 0, 1], [1, 0, 0], [0, 0, 0]], bool)
    oo = np.array([[0, 0, 0], [0, 0, 1], [1, 1, 0], [0, 1, 0], [0, 0, 0]], bool)
    np.testing.assert_array_equal(undefined_causes(so, os_, ss, oo), [0, 1, 2, 3, 3])


def test_distribution_follows_croma_tail_rule():
    values = np.array([np.nan, 0.2, 1.0, 0.5, 0.0, 1.0, np.nan, 0.75])
    tail = compute_tail_metrics(values[np.isfinite(values)], alpha=0.1)
    assert distribution(values, 0.1) == (np.median(values[np.isfinite(values)]), tail.q_alpha, tail.ltm_alpha)
    assert all(np.isnan(distribution(np.full(3, np.nan), 0.1)))


def test_sweep_summary_closed_form():
    # a straight line from 0.5 at m = 1 to 0.2 at m = 4: mean 0.35, minimum 0.2, delta -0.3
    auc, low, delta = sweep_summary([1, 2, 3, 4], [0.5, 0.4, 0.3, 0.2])
    assert auc == pytest.approx(0.35, abs=1e-15) and low == 0.2 and delta == pytest.approx(-0.3, abs=1e-15)
    assert sweep_summary([5], [0.3]) == (0.3, 0.3, 0.0)
