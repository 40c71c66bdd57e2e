"""The collect step's re-scoring of the CRoMa panel (methods/croma/rescore.py) apart from the tables'
layouts (methods/croma/tables.py), which read the panel it saves."""
from robustbench_fm.methods.croma import labels, rescore
from robustbench_fm.methods.croma import tables as tc


def test_the_tables_format_the_panel_that_rescore_computes():
    """Issue 56 item 5: the re-scoring from stored features (the k policy, the two passes over the
    jobs' entries, the saved panel folder, Table 12's typed ranks) is rescore's; tables keeps the
    layouts and reads the panel through the same functions; both name the encoders by labels."""
    for name in ("_score_benchmark", "operating_ks", "KPolicy", "sweep_jobs", "_croma_params", "_features",
                 "_m_sweep", "_jobs", "_groups", "_manifest", "ALPHAS", "PROTOCOLS"):
        assert not hasattr(tc, name), name
    for name in ("_score_benchmark", "operating_ks", "KPolicy", "sweep_jobs", "benchmark_groups", "panel_manifest"):
        assert getattr(rescore, name).__module__ == rescore.__name__, name
    assert tc.croma_panel is rescore.croma_panel and tc.Panel is rescore.Panel
    assert tc.typed_rank_medians is rescore.typed_rank_medians and tc.PANEL_DIR == rescore.PANEL_DIR
    assert tc.label is rescore.label is labels.label and tc.BENCHMARKS is labels.BENCHMARKS
    assert labels.label("uni2_h") == "UNI2-h" and labels.label("titan", slide=True) == "TITAN"
    assert labels.label("not_in_the_paper") == "not_in_the_paper"
