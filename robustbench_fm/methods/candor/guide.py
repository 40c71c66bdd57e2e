"""What the numbers of the CANDOR stages mean, for a report's "How to read this" (each stage's
``Method(guide=...)`` names its text here; ``{k}`` and ``{n_boot:,}`` are the run's parameters).

candor.md "The Discordance Rate and Its Chance Level", "Unequal Candidate Sets", "Reporting",
"Occlusion Retention", "Ablation Studies" (1); candor_v1.md Proposition 1 and Corollary 1.
"""

CANDOR = """
D (discordance rate) is the share of positive queries whose k = {k} nearest positives are on average less
similar to them than their k nearest negatives, both drawn from the query's matched group (images acquired the
same way). With positive and negative candidate sets of equal size, D = 0.5 (chance) by construction for
features that carry no information about the label; lower is better: D = 0 means every positive is nearer to
positives, D above 0.5 that positives are nearer to negatives than to each other.

D_all takes every positive and negative of the group as candidates, so with more negatives than positives it
lies above 0.5 even for uninformative features (compare encoders on D); the margin AUROC ranks every image by
c+ − c− (higher is better). Its chance level is 0.5 only for large banks: an image scored against the bank
holding it meets one image of its own class fewer, so uninformative features score below 0.5, at least
margin_chance_low = 0.5 − k/n+ − k/n− (n± the group's positives and negatives held in the banks; e.g. 0.42 in
simulation at 12 vs 12 with k = 5, where the bound itself is 0). Read a margin AUROC against margin_chance_low
where it lies well below 0.5, i.e. in small groups. [low, high] is the 95% interval of {n_boot:,} bootstrap resamples
clustered by patient, with the candidate sets held fixed.
"""

RETENTION = """
Retention is the cosine similarity between an image's features and those of the same image with the finding's
box filled in; it has no fixed reference level, and lower means the features moved more when the evidence was
removed. retention_std = (retention − c)/(1 − c) removes the encoder's similarity c of random image pairs; the
control fills a box of the same size elsewhere (control_minus_box > 0: the expert box mattered more).
"""

BOX_VERIFIED = """
d is CANDOR's D (chance 0.5, lower is better) of the positives of one arm (column arm) that carry an expert box,
against the reference site's candidate sets of the matched group with the query's view, k = {k}; the arm named
after the reference site holds all its own positives against the same sets. candor.md finds every encoder at or
below 0.5 on the boxed pneumothorax positives; an arm whose queries come from outside the pool meets the sets
across a domain shift, so its D can lie higher (candor_v1.md). [low, high] is the 95% interval of {n_boot:,}
bootstrap resamples clustered by patient.
"""

LIPSCHITZ = """
A synthetic sweep (candor_v1.md Proposition 1): two classes on the unit sphere whose separation (column
separation) falls level by level, a linear and a shallow head (column head) trained at each level. error is the
head's test error (lower is better) and d CANDOR's D of the test positives (chance 0.5). mean_margin is the
mean achieved joint margin of a test positive and its nearest test negative, mean_bound the mean of the
proposition's bound L‖z+ − z−‖/2 on it (lipschitz is the head's L); violations counts the pairs whose margin
exceeds the bound, 0 by the proposition. As the separation falls both heads' errors rise: the shallow head's
extra capacity does not recover what the geometry lost.
"""
