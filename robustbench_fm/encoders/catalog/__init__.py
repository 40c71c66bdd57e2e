"""Registry entries of every encoder the three papers evaluate, one module per panel.

Sources: ``shared/reference/catalog.md`` Part 2 and ``croma_conventions.md`` E; the model cards and
configs shipped in timm / open_clip / transformers win where they disagree (noted per entry).
``params_m`` is the image-tower count from instantiating the architecture on the meta device
(timm 1.0.31 / open_clip 3.3.0 / transformers 5.24 / torchxrayvision 1.5.7), or the paper's count
where no stock library builds it. Nothing here touches the network.
"""
from . import chest, derm_fundus, general, packaged, pathology, slides, spar, synthetic  # noqa: F401  (register the entries)
