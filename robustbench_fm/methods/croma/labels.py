"""The CRoMa paper's names: the row label of every encoder of its panels and the name of every
benchmark (croma_table2_models.csv; Tables 3-14). The tables print them
(:mod:`~robustbench_fm.methods.croma.tables`); the collect step's re-scoring takes the paper's
panel and Table 14's published k* by them (:mod:`~robustbench_fm.methods.croma.rescore`).
"""
from __future__ import annotations

#: registry name -> the row label of Tables 3-5, 12, 13 (croma_table2_models.csv)
TILE_LABELS = {"virchow2": "Virchow2", "virchow": "Virchow", "uni2_h": "UNI2-h", "uni": "UNI",
               "conch_v1_5": "CONCHv1.5", "conch": "CONCH", "h_optimus_1": "H-optimus-1",
               "h_optimus_0": "H-optimus-0", "h0_mini": "H0-mini", "prov_gigapath": "Prov-GigaPath",
               "midnight_12k": "Midnight-12k", "prost40m": "Prost40M", "phikon": "Phikon", "phikon_v2": "Phikon-v2",
               "hibou_l": "Hibou-L", "hibou_b": "Hibou-B", "mstar": "mSTAR", "gpfm": "GPFM", "musk": "MUSK",
               "genbio_pathfm": "GenBio-PathFM", "dinov2_b": "DINOv2-B"}
#: registry name -> the row label of Table 14
SLIDE_LABELS = {"prism": "PRISM", "titan": "TITAN", "gigapath_slide": "Prov-GigaPath", "moozy": "MOOZY"}
BENCHMARKS = {"pathorob_camelyon": "Camelyon", "pathorob_tcga4x4": "TCGA-4x4", "pathorob_tcga2x2": "TCGA-2x2",
              "pathorob_tolkach": "Tolkach-ESCA", "pcabiop-binary": "PCaBiop", "pcabiop-isup": "PCaBiop-ISUP"}


def label(encoder: str, slide: bool = False) -> str:
    """The published row label of a registry name (the name itself when the paper has none)."""
    return (SLIDE_LABELS if slide else TILE_LABELS).get(encoder, encoder)
