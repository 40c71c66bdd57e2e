"""CANDOR (candor.md v4, candor_v1.md): chance-calibrated neighbourhood discordance.

* :mod:`.params`: the stage's parameters, one typed structure with the paper's defaults;
* :mod:`.stage`: D, D_all, margin AUROC per matched group, the severity-weighted chest pool, the
  controls and ablations ("Implementation", "Reporting", "Ablation Studies");
* :mod:`.tasks` (binary and one-vs-rest tasks, pools), :mod:`.sets` (consensus-blind sets,
  pairwise overlap tests), :mod:`.ranks` (rank associations), :mod:`.impurity`;
* :mod:`.retention`: erasure (occlusion) retention ("Occlusion Retention"; v1 Eq. 4);
* :mod:`.tables`, :mod:`.plots`: the paper's tables and figures.

The head-based analyses (Table 4, failure detection) live with the heads: :mod:`..heads`.
"""
from .. import Method, register
from .params import BoxVerifiedParams, CandorParams, LipschitzParams, RetentionParams

register(Method(
    "candor", "CANDOR discordance D, D_all and margin AUROC per matched group (chance = 0.5)",
    f"{__name__}.stage",
    console_columns=("encoder", "finding", "acq_group", "target", "n_queries", "bank_size", "d", "d_sd", "d_ci_low",
                     "d_ci_high", "d_all", "margin_auroc"),
    tables=f"{__name__}.tables", figures=f"{__name__}.plots:report_figures", params=CandorParams))
register(Method(
    "retention", "CANDOR erasure retention: re-embed positives with the expert box filled",
    f"{__name__}.retention",
    console_columns=("encoder", "dataset", "finding", "n", "retention", "retention_ci_low", "retention_ci_high",
                     "retention_std", "retention_control", "control_minus_box", "c"),
    tables=f"{__name__}.tables", params=RetentionParams,
    # the paper's chest retention: most datasets' findings have no boxes (RetentionParams)
    findings=("pneumothorax", "pneumonia")))
register(Method(
    "candor_box_verified", "CANDOR ablation (1): D of box-verified positives against a reference site's candidate sets",
    f"{__name__}.box_verified",
    console_columns=("encoder", "finding", "arm", "acq_group", "n_queries", "bank_size", "d", "d_ci_low", "d_ci_high"),
    # the ablation and control tables (box-verified, unmatched, label shuffle, equal size, ties)
    tables=f"{__name__}.controls", params=BoxVerifiedParams, findings=("pneumothorax", "pneumonia")))
register(Method(
    "candor_lipschitz", "candor_v1 synthetic class-overlap sweep: head margins against the Lipschitz bound (Prop. 1)",
    f"{__name__}.synthetic",
    console_columns=("separation", "head", "d", "error", "lipschitz", "mean_bound", "mean_margin", "n_pairs",
                     "violations"),
    tables=f"{__name__}.controls", tables_after_run=True, params=LipschitzParams, findings=("class_overlap",)))
