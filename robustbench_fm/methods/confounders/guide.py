"""What the confounder scan's numbers mean, for a report's "How to read this" (its ``Method(guide=...)``
names the text here; docs/methods/confounders.md says more)."""

SCAN = """
For every scanned column (a site, scanner, view, sex, age bins, and each finding beside them) and encoder: of
each image's k = {k} nearest images (cosine, images of its own patient left out), the share that has the
image's value of the column (observed), against the share random neighbours would have (chance, from how often
each value occurs). score = (observed − chance) / (1 − chance): 0 = the neighbourhoods ignore the column, 1 =
every neighbour shares the value; the interval is the 95% patient-clustered bootstrap of {n_boot:,} resamples,
which holds the neighbour graph fixed: on columns of random values it covered 0 in 79–94% of draws, not 95%, so
read a score within a few hundredths of 0 as chance.

Read the scores against each other: an encoder whose neighbourhoods follow the site or the scanner more than the
finding groups images by how they were acquired, and a nearest-neighbour or linear read-out of its features can
take that as a shortcut. A high score for a finding is what you want, a high score for an acquisition column is
a confounder the encoder carries. A numeric column with many values is binned into quantile bins (the row's
binning says which). Scores are not compared between encoders with p-values: each image's share depends on all
the other images through the neighbour graph, which the bootstrap holds fixed.
"""
