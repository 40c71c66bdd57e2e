"""SPAR-Bench (spar.md): spatial anatomical reasoning probes over multi-organ abdominal CT.

Data half: ``volumes`` (NIfTI in RAS), ``ct_datasets`` (WORD / LiTS / TotalSegmentator layouts),
``samples`` (slice selection, organ tiles, cached sample tables), ``probes`` (probe labels) and
``phantoms`` (synthetic CT in the real layouts).
"""
