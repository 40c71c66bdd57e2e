"""What the numbers of the CRoMa stages mean, for a report's "How to read this" (each stage's
``Method(guide=...)`` names its text here). croma.md §2.5 (CRoMa, RI, MaRI) and §2.7 (APD, nIPD).
"""

CROMA = """
CRoMa of a sample is (d_OS − d_SO)/(d_OS + d_SO), with d_SO its mean distance to the 5 nearest samples of the
same label but another confounder value (e.g. another site) and d_OS to the 5 nearest of another label but the
same confounder value: from −1 to 1, above 0 the biology dominates the neighbourhood, below 0 the confounder.
croma is the median over samples (higher is better), f0 the share below 0, ltm the mean of the worst 10%; RI
and MaRI are the share of biological matches among the nearest cross-confounder neighbours (0 to 1, higher is
better); support is the share of samples that have such a neighbour, and the *_undefined_frac columns say why the
others have none (ss: mostly same label and confounder, oo: mostly other label and confounder, mixed).
croma_auc, croma_min and croma_delta summarise croma over m = 1 to m_sweep nearest samples (its mean, lowest value
and change; m_range is the range swept, n_undefined_m1 the samples left out at m = 1 because their nearest
matches are copies of them).
"""

SHORTCUT = """
A linear probe of the biological label is trained on splits whose centre × class composition walks from
balanced to fully confounded, and scored on balanced test sets (column test_set: in-domain centres, or unseen
ones). apd is the probe's accuracy relative to the balanced split's, averaged over the confounded splits, minus
1: near 0 the probe generalises whatever its training composition, more negative means it took the centre as a
shortcut (higher is better). nipd integrates the accuracy's fall over Cramér's V from 0 to 1 in units of the
balanced split's margin over chance: −0.5 is a linear fall to chance (higher is better).
"""
