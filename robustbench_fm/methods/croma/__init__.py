"""CRoMa (croma.md): the centre-robustness metric with RI and MaRI, and PathoROB's shortcut probe.

* :mod:`.params`: the two stages' parameters, one typed structure each with the paper's defaults;
* :mod:`.stage`: RI, MaRI, CRoMa with its F(0) / Q_alpha / LTM tail (§2.3-2.7), :mod:`.scores`;
* :mod:`.panel`: the panel median-k protocol and the m / alpha sweeps (the collect step's k policy
  and roster refusal live in :mod:`.rescore`);
* :mod:`.shortcut`, :mod:`.shortcut_metrics`: the confounder-biased linear probe (APD, nIPD);
* :mod:`.rescore`: the collect step's panel, every benchmark re-scored from the jobs' stored features;
* :mod:`.tables`, :mod:`.plots`: the paper's tables and figures (row labels: :mod:`.labels`);
* :mod:`.guide`: what each stage's numbers mean (a report's "How to read this").
"""
from .. import Method, Paired, Pairing, register
from .params import CromaParams, ShortcutParams

#: why RI and MaRI are not compared between encoders (docs/comparisons.md "What is compared")
KNN_NOT_COMPARED = ("each anchor's counts come from a kNN graph over the other slides' tiles, which the slide "
                    "bootstrap holds fixed: under a null of equal encoders p < 0.05 came out in 0.16-0.17 of pairs, "
                    "so no verdict rests on it (docs/comparisons.md)")

register(Method(
    "croma", "CRoMa, RI and MaRI: is local geometry organised by biology or by the centre?",
    f"{__name__}.stage", display_name="CRoMa",
    headline=(("croma", "higher"), ("f0", "lower"), ("ltm", "higher"), ("ri", "higher"), ("mari", "higher")),
    guide=f"{__name__}.guide:CROMA", param_columns=("k", "tau", "m_sweep", "n_subsets", "n_short", "n_floor",
                                                   "n_undefined_m1"),
    integer_columns=("support", "k", "selected_k_confounder", "m_sweep", "n_undefined_m1"),
    console_columns=("encoder", "dataset", "finding", "bio_knn_bacc", "conf_knn_bacc", "ri", "mari", "croma", "f0",
                     "ltm", "support", "k"),
    tables=f"{__name__}.tables", figures=f"{__name__}.plots:report_figures", params=CromaParams,
    findings=("bio_label",),  # the column holding the biological label
    # the anchors are the same tiles for every encoder: RI, MaRI (pooled ratios) and CRoMa (the median) compared
    # paired, resampling slides (the exclude_col groups)
    pairing=Pairing(metrics=(Paired("ri", "ratio", "n_so", "n_typed", better="higher", not_compared=KNN_NOT_COMPARED),
                             Paired("mari", "ratio", "so_weight", "typed_weight", better="higher",
                                    not_compared=KNN_NOT_COMPARED),
                             Paired("croma", "median", "croma", better="higher", bank="croma_bank")), rows=("finding",),
                    unit="slides")))
register(Method(
    "shortcut", "PathoROB's confounder-biased linear probe: APD and nIPD", f"{__name__}.shortcut",
    display_name="shortcut test", headline=(("apd", "higher"), ("nipd", "higher")), guide=f"{__name__}.guide:SHORTCUT",
    # one row per test set (in-domain, out-of-domain); the schedule's settings apart from metrics
    group_columns=("test_set",), param_columns=("chance", "n_splits", "iterations"), count_column="n_test",
    console_columns=("encoder", "benchmark", "test_set", "apd", "nipd", "acc_balanced", "acc_confounded"),
    tables=f"{__name__}.tables", params=ShortcutParams,
    findings=("bio_label",)))  # the column holding the biological class the probe predicts
