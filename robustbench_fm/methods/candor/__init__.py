"""CANDOR (candor.md v4, candor_v1.md): chance-calibrated neighbourhood discordance.

* :mod:`.params`: the stage's parameters, one typed structure with the paper's defaults;
* :mod:`.stage`: D, D_all, margin AUROC per matched group, the severity-weighted chest pool, the
  controls and ablations ("Implementation", "Reporting", "Ablation Studies");
* :mod:`.shortlist`: one pass answers a matched group's neighbour questions; :mod:`.bootstrap`: the
  patient bootstrap of every row's ± and interval ("Reporting");
* :mod:`.tasks` (binary and one-vs-rest tasks, pools), :mod:`.sets` (consensus-blind sets,
  pairwise overlap tests), :mod:`.ranks` (rank associations), :mod:`.impurity`;
* :mod:`.retention`: erasure (occlusion) retention ("Occlusion Retention"; v1 Eq. 4);
* :mod:`.tables`, :mod:`.plots`: the paper's tables and figures;
* :mod:`.guide`: what each stage's numbers mean (a report's "How to read this").

The head-based analyses (Table 4, failure detection) live with the heads: :mod:`..heads`.
"""
from .. import Method, Paired, Pairing, register
from .params import BoxVerifiedParams, CandorParams, LipschitzParams, RetentionParams

#: why the margin AUROC is not compared between encoders (docs/comparisons.md "What is compared")
MARGIN_NOT_COMPARED = ("every image's margin is scored against banks that hold the other images, which the patient "
                       "bootstrap holds fixed: under a null of equal encoders p < 0.05 came out in 0.09-0.12 of pairs, "
                       "so no verdict rests on it (docs/comparisons.md)")

register(Method(
    "candor", "CANDOR discordance D, D_all and margin AUROC per matched group (chance = 0.5)",
    f"{__name__}.stage", display_name="CANDOR",
    headline=(("d", "lower"), ("d_all", "lower"), ("margin_auroc", "higher")), guide=f"{__name__}.guide:CANDOR",
    group_columns=("acq_group", "target"), param_columns=("bank_size", "k"), count_column="n_queries",
    integer_columns=("bank_size", "k"), multi_finding=True, overwrites_features=True,
    console_columns=("encoder", "finding", "acq_group", "target", "n_queries", "bank_size", "d", "d_sd", "d_ci_low",
                     "d_ci_high", "d_all", "margin_auroc"),
    tables=f"{__name__}.tables", figures=f"{__name__}.plots:report_figures", params=CandorParams,
    # queries and banks are the same images for every encoder: D, D_all and the margin AUROC compared paired,
    # resampling patients with the banks fixed, as the stage's own intervals do ("Reporting")
    pairing=Pairing(metrics=(Paired("d", "mean", "discordant", where="query", better="lower",
                                    bank="discordant_bank"),
                             Paired("d_all", "mean", "discordant_all", where="query", better="lower",
                                    bank="discordant_all_bank"),
                             Paired("margin_auroc", "auroc", "margin", "label", pool_weight="query",
                                    better="higher", not_compared=MARGIN_NOT_COMPARED)),
                    rows=("finding", "target", "acq_group"), pool="acq_group", table="items",
                    mean_over="target")))
register(Method(
    "retention", "CANDOR erasure retention: re-embed positives with the expert box filled",
    f"{__name__}.retention", display_name="occlusion retention",
    headline=(("retention", "lower"), ("retention_std", "lower"), ("control_minus_box", "higher")),
    guide=f"{__name__}.guide:RETENTION", multi_finding=True,
    console_columns=("encoder", "dataset", "finding", "n", "retention", "retention_ci_low", "retention_ci_high",
                     "retention_std", "retention_control", "control_minus_box", "c"),
    tables=f"{__name__}.tables", params=RetentionParams,
    # the paper's chest retention: most datasets' findings have no boxes (RetentionParams)
    findings=("pneumothorax", "pneumonia")))
register(Method(
    "candor_box_verified", "CANDOR ablation (1): D of box-verified positives against a reference site's candidate sets",
    f"{__name__}.box_verified", display_name="CANDOR on box-verified positives",
    headline=(("d", "lower"),), guide=f"{__name__}.guide:BOX_VERIFIED", group_columns=("acq_group", "arm"),
    count_column="n_queries", integer_columns=("bank_size",), multi_finding=True,
    console_columns=("encoder", "finding", "arm", "acq_group", "n_queries", "bank_size", "d", "d_ci_low", "d_ci_high"),
    # the ablation and control tables (box-verified, unmatched, label shuffle, equal size, ties)
    tables=f"{__name__}.controls", params=BoxVerifiedParams, findings=("pneumothorax", "pneumonia")))
register(Method(
    "candor_lipschitz", "candor_v1 synthetic class-overlap sweep: head margins against the Lipschitz bound (Prop. 1)",
    f"{__name__}.synthetic", display_name="CANDOR's Lipschitz sweep",
    headline=(("error", "lower"), ("violations", "lower")), guide=f"{__name__}.guide:LIPSCHITZ",
    # one row per (overlap level, head); ``level`` indexes the separation
    group_columns=("separation", "head"), param_columns=("level",), count_column="n_pairs",
    integer_columns=("violations",),
    console_columns=("separation", "head", "d", "error", "lipschitz", "mean_bound", "mean_margin", "n_pairs",
                     "violations"),
    tables=f"{__name__}.controls", tables_after_run=True, params=LipschitzParams, findings=("class_overlap",)))
