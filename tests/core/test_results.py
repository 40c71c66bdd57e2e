"""Summary helpers of :mod:`robustbench_fm.core.results`."""
import pandas as pd

from robustbench_fm.core.results import without_single_group_pools
from robustbench_fm.pipeline.job import console_table


def _summary():
    rows = [("a", "marker", "planted", 0.4), ("a", "marker", "__pooled__", 0.4),        # one group: a copy
            ("b", "marker", "PA", 0.2), ("b", "marker", "AP", 0.6), ("b", "marker", "__pooled__", 0.4)]
    return pd.DataFrame(rows, columns=["encoder", "finding", "acq_group", "d"]).assign(target="marker")


def test_a_pool_of_one_group_is_dropped_and_a_real_pool_kept():
    got = without_single_group_pools(_summary())
    assert list(zip(got["encoder"], got["acq_group"])) == [("a", "planted"), ("b", "PA"), ("b", "AP"),
                                                           ("b", "__pooled__")]


def test_console_table_shows_no_copy_of_a_single_group():
    table = console_table(_summary(), "candor")
    assert table.count("__pooled__") == 1 and "| a | marker | planted | marker |" in table


def test_frames_without_groups_pass_unchanged():
    frame = pd.DataFrame({"encoder": ["a"], "auroc": [0.9]})
    assert without_single_group_pools(frame) is frame
