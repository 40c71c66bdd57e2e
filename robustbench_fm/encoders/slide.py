"""Slide-level aggregators: a bag of cached tile embeddings -> one slide embedding.

CRoMa evaluates 4 whole-slide encoders that "aggregate tile-level information into a single slide
embedding" (croma.md 2.6, Table 2): PRISM (Virchow tiles), TITAN (CONCH v1.5 tiles), Prov-GigaPath
slide (Prov-GigaPath tiles) and MOOZY (Lunit DINO ViT-S/8 tiles). Each entry names its tile
encoder (``spec.tile_encoder``); the tiles are embedded and cached with that encoder first, and
:class:`SlideEncoder` only ever sees their embeddings [N, D_tile] and level-0 coordinates [N, 2].
Every aggregator calls the authors' own code (hub remote code or package; optional extras).
"""
from __future__ import annotations

import os
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

import torch

from ..core.errors import InvalidSetting, MissingInput
from .loaders.extras import require
from .loaders.hub import hub_call, offline, trust_remote_code
from .loaders.package_loaders import hub_or_local
from .registry import get, register_loader
from .spec import ALLOW_REMOTE_CODE, EncoderSpec


@dataclass
class SlideEncoder:
    """A frozen slide encoder: ``aggregate(tiles [N, D_tile], coords [N, 2] | None, **kw) -> [D]``.
    ``tile_dim`` is the width of its tile embeddings (None: the registered tile encoder's)."""

    spec: EncoderSpec
    model: torch.nn.Module
    aggregate: Callable[..., torch.Tensor]
    weights_id: str
    device: torch.device
    tile_dim: int | None = None

    def __post_init__(self):
        self.model.eval().requires_grad_(False).to(self.device)

    @torch.inference_mode()
    def embed_slide(self, tiles: torch.Tensor, coords: torch.Tensor | None = None, **kwargs) -> torch.Tensor:
        """The slide embedding [D] (float32) of one slide's tile embeddings and coordinates."""
        tile_dim = self.tile_dim or get(self.spec.tile_encoder).embed_dim
        if tiles.ndim != 2 or tiles.shape[1] != tile_dim:
            raise InvalidSetting(f"encoder '{self.spec.name}' takes [N, {tile_dim}] embeddings of "
                                 f"'{self.spec.tile_encoder}' tiles, got shape {tuple(tiles.shape)}")
        if coords is not None and coords.shape != (tiles.shape[0], 2):
            raise InvalidSetting(f"encoder '{self.spec.name}': coords must be [N, 2] level-0 pixel positions, "
                                 f"got shape {tuple(coords.shape)}")
        tiles = tiles.to(self.device, torch.float32)
        coords = coords.to(self.device) if coords is not None else None
        out = self.aggregate(tiles, coords, **{**self.spec.slide_kwargs, **kwargs}).reshape(-1)
        if out.shape[0] != self.spec.embed_dim:
            raise RuntimeError(f"encoder '{self.spec.name}' produced {out.shape[0]} values, "
                               f"expected {self.spec.embed_dim}")
        return out.float()


def _need_coords(spec: EncoderSpec, coords) -> torch.Tensor:
    if coords is None:
        raise InvalidSetting(f"encoder '{spec.name}' needs the tiles' level-0 coordinates (coords [N, 2])")
    return coords


def _prism(spec, weights, trust):
    """PRISM: ``slide_representations(tiles[None])["image_embedding"]`` (1,280-d)."""
    from transformers import AutoModel
    source, weights_id = hub_or_local(spec, weights)
    with hub_call(spec, spec.hub_id):
        model = AutoModel.from_pretrained(source, trust_remote_code=trust, revision=spec.revision)
    return model, lambda t, c, **kw: model.slide_representations(t[None])["image_embedding"], weights_id


def _titan(spec, weights, trust):
    """TITAN: ``encode_slide_from_patch_features(tiles, coords, patch_size_level0)`` (768-d)."""
    from transformers import AutoModel
    source, weights_id = hub_or_local(spec, weights)
    with hub_call(spec, spec.hub_id):
        model = AutoModel.from_pretrained(source, trust_remote_code=trust, revision=spec.revision)

    def aggregate(t, c, patch_size_level0, **kw):
        return model.encode_slide_from_patch_features(t[None], _need_coords(spec, c)[None].long(),
                                                      int(patch_size_level0))
    return model, aggregate, weights_id


def _gigapath(spec, weights, trust):
    """Prov-GigaPath LongNet slide encoder: the 12th output of ``all_layer_embed=True`` (768-d)."""
    from gigapath import slide_encoder
    source, weights_id = hub_or_local(spec, weights)
    with hub_call(spec, "prov-gigapath/prov-gigapath"):
        model = slide_encoder.create_model(source, "gigapath_slide_enc12l768d", 1536, global_pool=True)

    def aggregate(t, c, layer=11, **kw):
        return model(t[None], _need_coords(spec, c)[None].float(), all_layer_embed=True)[layer]
    return model, aggregate, weights_id


def _moozy(spec, weights, trust):
    """MOOZY: the case ``cls`` embedding (768-d) of one slide's feature grid, built by the package
    from an h5 of the bag in its own layout (``features``, ``coords`` + ``patch_size_level0``)."""
    from moozy.data.features import save_h5
    from moozy.data.stage2 import load_stage2_slide_sample
    from moozy.encoding import run_case_encoding
    from moozy.models.factory import load_stage2_inference_model
    if weights is None:
        source, weights_id = hub_or_local(spec, None)
        from huggingface_hub import hf_hub_download

        with hub_call(spec, spec.hub_id):
            ckpt = hf_hub_download(spec.hub_id, spec.hub_file, local_files_only=offline())
    else:
        ckpt, weights_id = hub_or_local(spec, weights)
    model = load_stage2_inference_model(ckpt, device=torch.device("cpu"))

    def aggregate(t, c, patch_size_level0, patch_size=224, **kw):
        with tempfile.TemporaryDirectory(prefix="rbfm_moozy_") as tmp:
            path = os.path.join(tmp, "slide.h5")
            save_h5(path, {"features": t.cpu().numpy(), "coords": _need_coords(spec, c).cpu().numpy()},
                    {"coords": {"patch_size_level0": int(patch_size_level0), "patch_size": int(patch_size)}})
            slide = load_stage2_slide_sample("slide", path, include_geometry_meta=True, feature_h5_key="features")
        return run_case_encoding(model, [slide], device=t.device, mixed_precision=False)["cls"]
    return model, aggregate, weights_id


_AGGREGATORS = {"prism": _prism, "titan": _titan, "gigapath": _gigapath, "moozy": _moozy}


@register_loader("slide")
def load_slide_encoder(spec: EncoderSpec, weights, device, allow_remote_code: bool = ALLOW_REMOTE_CODE) -> SlideEncoder:
    """Build the slide aggregator ``spec.architecture`` with its authors' code."""
    require(spec)
    trust = trust_remote_code(spec, allow_remote_code)
    if weights is not None and not Path(weights).exists():
        raise MissingInput(f"encoder '{spec.name}': weights '{weights}' not found")
    model, aggregate, weights_id = _AGGREGATORS[spec.architecture](spec, weights, trust)
    return SlideEncoder(spec, model, aggregate, weights_id, torch.device(device))
