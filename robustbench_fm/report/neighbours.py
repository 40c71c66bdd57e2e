"""Neighbourhoods, shown (issue 55 item 2; docs/neighbourhoods.md): the report's section of thumbnails
behind CANDOR's verdict.

For each finding (at most :data:`MAX_FINDINGS`, the ranking's order) it takes the best and the worst
encoder by D in the run's ranking (:func:`robustbench_fm.report.comparisons.read`, the finding's
headline row of metric ``d``; without a ranking, by the D of the queries saved), and under each of
them the :data:`TOP_QUERIES` positive queries of largest DM = c− − c+ (the most discordant). Each
query is one row: its image, then, per encoder (the one it was chosen under first, the other beside
it), its k nearest positives and k nearest negatives in the banks as ``neighbours.parquet`` holds
them (the neighbours the stage averaged), the similarity under each thumbnail.

Images are read by the dataset's own reader, :func:`robustbench_fm.data.images.read_image` (DICOM
LUTs and polarity, bit depth, crops, ``#`` locators of h5 / npz / parquet files), from the manifest's
``path`` under the run's dataset root, and shrunk to at most :data:`THUMB_PX` px (:func:`thumbnail`:
Pillow's ``Image.thumbnail``, Lanczos; never enlarged), then embedded as base64 PNG, so the page stays
one file. Without images (a run from a features file, or a report given no manifest) the same rows
name the images by id instead, and the section says why.
"""
from __future__ import annotations

import base64
import io
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import pandas as pd
from PIL import Image

from .. import methods
from ..core.tables import SweepResults
from ..data.images import read_image
from . import comparisons as which_mod

#: the file a result folder holds (core.results.Results.neighbours); shown here: the tables of a
#: discordance stage's queries (these columns; CANDOR's), whatever the stage is named
FILE = "neighbours.parquet"
QUERY_COLUMNS = {"query_id", "side", "rank", "neighbour_id", "similarity", "dm", "discordant"}
#: the longest side of a thumbnail, in pixels
THUMB_PX = 96
#: the most discordant positive queries shown per encoder and finding
TOP_QUERIES = 4
#: findings shown (the first in the ranking's order)
MAX_FINDINGS = 3
#: why a section has ids where thumbnails would be: a run from a features file
FROM_FEATURES = ("This run scored a features file: there are no images to show, so the neighbours are named by "
                 "their sample_id.")
NO_MANIFEST = ("This report was built without the run's manifest (a sweep's collect step): the neighbours are named "
               "by their sample_id; each run's own report.html shows their thumbnails.")


@dataclass
class Thumb:
    """One image of the section: its id, the base64 PNG (empty without images), the text under it
    (a similarity, or the query's group) and why it could not be read (empty when it could)."""

    sample_id: str
    png: str = ""
    caption: str = ""
    error: str = ""


@dataclass
class Strip:
    """One query's neighbourhood under one encoder: its DM and flag, k positives and k negatives."""

    encoder: str
    dm: float
    discordant: bool
    positives: list[Thumb] = field(default_factory=list)
    negatives: list[Thumb] = field(default_factory=list)
    missing: str = ""  # why this encoder has no neighbours for the query

    @property
    def dm_text(self) -> str:
        """DM to 3 significant digits (a DM of 0.0002 between near-identical features stays readable)."""
        return f"{self.dm:+.3g}"


@dataclass
class QueryRow:
    query: Thumb
    acq_group: str
    strips: list[Strip]


@dataclass
class Panel:
    """The most discordant queries of one finding under one encoder (``role``: best / worst by D, or
    the only encoder)."""

    finding: str
    encoder: str
    role: str
    d: float
    rows: list[QueryRow]
    decimals: int = 3  # of the similarities under the thumbnails (:func:`decimals`)


@dataclass
class Section:
    panels: list[Panel]
    k: int
    note: str = ""  # why the images are named by id
    encoders: list[str] = field(default_factory=list)

    @property
    def images(self) -> bool:
        return not self.note


def thumbnail(image: Image.Image, size: int = THUMB_PX) -> Image.Image:
    """``image`` shrunk to fit ``size`` × ``size`` (aspect kept, never enlarged; Pillow's
    ``Image.thumbnail`` with Lanczos), as 'L' or 'RGB'."""
    out = image.convert("RGB") if image.mode not in ("L", "RGB") else image.copy()
    out.thumbnail((size, size), Image.Resampling.LANCZOS)
    return out


def decimals(similarities) -> int:
    """Decimals that tell a finding's similarities apart: enough for two significant digits of the
    median 1 − s (similarities of 0.9989 and 0.9985, 1 − s ≈ 0.0013: 4), at least 3, at most 6."""
    gap = float(np.median(1 - np.asarray(similarities, float))) if len(similarities) else 1.0
    return int(np.clip(np.ceil(-np.log10(max(gap, 1e-12))) + 1, 3, 6))


def png_base64(image: Image.Image) -> str:
    buffer = io.BytesIO()
    image.save(buffer, format="PNG", optimize=True)
    return base64.b64encode(buffer.getvalue()).decode("ascii")


def _read_tables(folder: str | Path, columns: set[str]) -> pd.DataFrame:
    """Every ``neighbours.parquet`` under ``folder`` (a run, or a sweep's jobs) that has ``columns`` (one
    stage's kind of neighbourhood), with its ``encoder`` (where the table has none), ``stage`` and ``job``."""
    try:
        dirs = SweepResults(Path(folder)).job_dirs
    except OSError:
        return pd.DataFrame()
    parts = []
    for d in dirs:
        for f in sorted((d / "results").glob(f"*/*/*/*/{FILE}")):
            frame = pd.read_parquet(f)
            if not columns <= set(frame.columns):
                continue  # another stage's kind of neighbourhood: not this section's
            frame["stage"] = f.parent.parent.name
            if "encoder" not in frame.columns:
                frame.insert(0, "encoder", f.parent.parent.parent.parent.name)
            parts.append(frame.assign(job=d.name))
    return pd.concat(parts, ignore_index=True) if parts else pd.DataFrame()


def read_neighbours(folder: str | Path) -> pd.DataFrame:
    """Every ``neighbours.parquet`` of query neighbourhoods (:data:`QUERY_COLUMNS`: CANDOR's) under
    ``folder`` (a run, or a sweep's jobs), with the ``stage`` that wrote it."""
    return _read_tables(folder, QUERY_COLUMNS)


def _ranked(ranking: pd.DataFrame, finding: str, queries: pd.DataFrame) -> list[tuple[str, float]]:
    """(encoder, D) of ``finding`` from best to worst: the ranking's headline row of the stage's first
    headline metric (CANDOR's ``d``) where the run has one, else the D of the saved queries (the share
    discordant)."""
    stage = str(queries["stage"].iloc[0]) if "stage" in queries.columns and len(queries) else ""
    method = methods.find(stage) if stage else None
    metric = method.headline[0].name if method is not None and method.headline else "d"
    if len(ranking):
        rows = which_mod.headline_rows(ranking)
        rows = rows[(rows["method"] == stage) & (rows["metric"] == metric) & (rows["finding"] == finding)]
        rows = rows[rows["encoder"].isin(set(queries["encoder"]))]
        if len(rows):
            rows = rows.sort_values(["rank", "estimate", "encoder"], kind="stable").drop_duplicates("encoder")
            return list(zip(rows["encoder"], rows["estimate"].astype(float)))
    d = queries.groupby("encoder")["discordant"].mean().sort_values(kind="stable")
    return list(zip(d.index, d.to_numpy(float)))


def _findings(ranking: pd.DataFrame, nbrs: pd.DataFrame) -> list[str]:
    found = list(dict.fromkeys(nbrs["finding"].astype(str)))
    if len(ranking):
        stages = set(nbrs["stage"].astype(str)) if "stage" in nbrs.columns else set()
        ranked = [f for f in dict.fromkeys(ranking.loc[ranking["method"].isin(stages), "finding"].astype(str))
                  if f in found]
        found = ranked + [f for f in found if f not in ranked]
    return found[:MAX_FINDINGS]


class _Images:
    """Thumbnails by sample_id, each image read and shrunk once."""

    def __init__(self, manifest: pd.DataFrame | None, root: str | Path | None):
        self.rows = None if manifest is None else manifest.drop_duplicates("sample_id").set_index("sample_id")
        self.root = root
        self.done: dict[str, tuple[str, str]] = {}

    def __call__(self, sample_id: str, caption: str = "") -> Thumb:
        if self.rows is None:
            return Thumb(str(sample_id), caption=caption)
        if sample_id not in self.done:
            try:
                row = {"sample_id": sample_id, **self.rows.loc[sample_id].to_dict()}
                self.done[sample_id] = (png_base64(thumbnail(read_image(self.root, row))), "")
            except Exception as exc:  # one unreadable image costs its thumbnail, not the report
                self.done[sample_id] = ("", f"{type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}")
        png, error = self.done[sample_id]
        return Thumb(str(sample_id), png, caption, error)


def _strip(part: pd.DataFrame, encoder: str, images: _Images, places: int) -> Strip:
    first = part.iloc[0]
    strip = Strip(encoder, float(first["dm"]), bool(first["discordant"]))
    for side, out in (("pos", strip.positives), ("neg", strip.negatives)):
        for _, nb in part[part["side"] == side].sort_values("rank").iterrows():
            out.append(images(nb["neighbour_id"], f"{nb['similarity']:.{places}f}"))
    return strip


def section(folder: str | Path, manifest: pd.DataFrame | None = None, root: str | Path | None = None,
            note: str = "") -> Section | None:
    """The report's neighbourhood section of the CANDOR results under ``folder`` (None without any
    ``neighbours.parquet``). ``manifest`` and ``root``: the run's manifest and dataset root, whose images
    become the thumbnails; without them the images are named by id and ``note`` says why (default
    :data:`NO_MANIFEST`)."""
    folder = Path(folder)
    nbrs = read_neighbours(folder)
    if nbrs.empty:
        return None
    # an encoder in several jobs of a sweep (an ablation's settings): the neighbourhoods of its first job
    nbrs = nbrs[nbrs["job"] == nbrs.groupby("encoder")["job"].transform("first")]
    note = "" if manifest is not None else note or NO_MANIFEST
    images = _Images(None if note else manifest, root)
    bank = nbrs[(nbrs["candidates"] == "bank") & (nbrs["query_label"] == 1)]
    k = int(bank["rank"].max()) if len(bank) else 0
    panels, shown = [], []
    ranking = which_mod.read(folder).ranking
    for finding in _findings(ranking, bank):
        rows = bank[bank["finding"].astype(str) == finding]
        queries = rows.drop_duplicates(["encoder", "target", "acq_group", "query_id"])
        ranked = _ranked(ranking, finding, queries)
        if not ranked:
            continue
        chosen = [(ranked[0], "best")] + ([(ranked[-1], "worst")] if len(ranked) > 1 else [])
        if len(ranked) == 1:
            chosen = [(ranked[0], "only")]
        encoders = [e for (e, _), _ in chosen]
        shown += [e for e in encoders if e not in shown]
        by_query = {key: part for key, part in rows.groupby(["target", "acq_group", "query_id", "encoder"],
                                                            sort=False)}
        places = decimals(rows.loc[rows["encoder"].isin(encoders), "similarity"])
        for (encoder, d), role in chosen:
            mine = queries[queries["encoder"] == encoder]
            top = mine.sort_values(["dm", "query_id"], ascending=[False, True], kind="stable").head(TOP_QUERIES)
            out = []
            for _, q in top.iterrows():
                strips = []
                for other in [encoder] + [e for e in encoders if e != encoder]:
                    part = by_query.get((q["target"], q["acq_group"], q["query_id"], other))
                    strips.append(_strip(part, other, images, places) if part is not None else
                                  Strip(other, np.nan, False, missing=f"not a query under {other}"))
                group = str(q["acq_group"]) + ("" if str(q["target"]) == finding else f" · {q['target']}")
                out.append(QueryRow(images(q["query_id"], group), str(q["acq_group"]), strips))
            panels.append(Panel(finding, encoder, role, d, out, places))
    return Section(panels, k, note, shown) if panels else None


# --- CRoMa: the anchors whose neighbours share the centre but not the label (issue 55 item 2) -----------------------

#: the columns of an anchor-neighbourhood table (CRoMa's ``neighbours.parquet``)
ANCHOR_COLUMNS = {"anchor_id", "label", "centre", "rank", "neighbour_id", "neighbour_label", "neighbour_centre",
                  "type", "distance"}


@dataclass
class AnchorStrip:
    """One anchor's k nearest cross-slide neighbours under one encoder, each with its pair type (SO: same
    label, other centre; OS: other label, same centre; SS, OO) and distance, and its count of OS."""

    encoder: str
    n_os: int
    neighbours: list[tuple[Thumb, str]] = field(default_factory=list)
    missing: str = ""


@dataclass
class AnchorRow:
    anchor: Thumb
    strips: list[AnchorStrip]


@dataclass
class AnchorPanel:
    """The anchors of one finding with the most OS neighbours under one encoder (``role``: best / worst
    by CRoMa, or the only encoder) and its CRoMa."""

    finding: str
    encoder: str
    role: str
    croma: float
    rows: list[AnchorRow]


@dataclass
class AnchorSection:
    panels: list[AnchorPanel]
    k: int
    note: str = ""

    @property
    def images(self) -> bool:
        return not self.note


def read_anchor_neighbours(folder: str | Path) -> pd.DataFrame:
    """Every anchor-neighbourhood ``neighbours.parquet`` (:data:`ANCHOR_COLUMNS`: CRoMa's) under ``folder``,
    with its ``encoder``, ``stage`` and ``job``."""
    return _read_tables(folder, ANCHOR_COLUMNS)


def _compared_metric(stage: str) -> str:
    """The first metric the stage's ``Pairing`` compares (CRoMa: its median margin), "" without one."""
    method = methods.find(stage)
    pairing = method.pairing if method is not None else None
    return next((m.metric for m in (pairing.metrics if pairing else ()) if not m.not_compared), "")


def _ranked_anchors(ranking: pd.DataFrame, finding: str, nbrs: pd.DataFrame) -> list[tuple[str, float]]:
    """(encoder, value) from best to worst: the ranking's row of the stage's first compared metric
    (CRoMa's ``croma``) where the run has one, else the share of SO among the typed neighbours saved
    (RI at k)."""
    metric = _compared_metric(str(nbrs["stage"].iloc[0])) if len(nbrs) else ""
    if len(ranking) and metric:
        rows = which_mod.headline_rows(ranking)
        rows = rows[(rows["metric"] == metric) & (rows["finding"].astype(str) == finding)
                    & rows["encoder"].isin(set(nbrs["encoder"]))]
        if len(rows):
            rows = rows.sort_values(["rank", "encoder"], kind="stable").drop_duplicates("encoder")
            return list(zip(rows["encoder"], rows["estimate"].astype(float)))
    typed = nbrs[nbrs["type"].isin(["SO", "OS"])]
    ri = (typed["type"] == "SO").groupby(typed["encoder"]).mean().sort_values(ascending=False, kind="stable")
    return list(zip(ri.index, ri.to_numpy(float)))


def anchor_section(folder: str | Path, manifest: pd.DataFrame | None = None, root: str | Path | None = None,
                   note: str = "") -> AnchorSection | None:
    """The report's CRoMa part of the neighbourhoods: per finding, under the best and the worst encoder by
    CRoMa, the :data:`TOP_QUERIES` anchors with the most OS neighbours (the centre shared, not the label:
    croma_conventions.md A.2), each with its k nearest cross-slide neighbours under that encoder and the
    other (None without any anchor table). Images as :func:`section`'s."""
    nbrs = read_anchor_neighbours(folder)
    if nbrs.empty:
        return None
    nbrs = nbrs[nbrs["job"] == nbrs.groupby("encoder")["job"].transform("first")]
    note = "" if manifest is not None else note or NO_MANIFEST
    images = _Images(None if note else manifest, root)
    ranking = which_mod.read(folder).ranking
    panels = []
    for finding in list(dict.fromkeys(nbrs["finding"].astype(str)))[:MAX_FINDINGS]:
        rows = nbrs[nbrs["finding"].astype(str) == finding]
        ranked = _ranked_anchors(ranking, finding, rows)
        if not ranked:
            continue
        chosen = [(ranked[0], "best"), (ranked[-1], "worst")] if len(ranked) > 1 else [(ranked[0], "only")]
        encoders = [e for (e, _), _ in chosen]
        by_anchor = {key: part.sort_values("rank") for key, part in rows.groupby(["anchor_id", "encoder"], sort=False)}
        for (encoder, value), role in chosen:
            mine = rows[rows["encoder"] == encoder]
            n_os = (mine["type"] == "OS").groupby(mine["anchor_id"]).sum()
            top = n_os[n_os > 0].sort_index().sort_values(ascending=False, kind="stable").head(TOP_QUERIES)
            out = []
            for anchor in top.index:
                first = mine[mine["anchor_id"] == anchor].iloc[0]
                strips = []
                for other in [encoder] + [e for e in encoders if e != encoder]:
                    part = by_anchor.get((anchor, other))
                    if part is None:
                        strips.append(AnchorStrip(other, 0, missing=f"not an anchor under {other}"))
                        continue
                    strips.append(AnchorStrip(other, int((part["type"] == "OS").sum()), [
                        (images(nb["neighbour_id"], f"{nb['distance']:.3f}"), str(nb["type"]))
                        for _, nb in part.iterrows()]))
                out.append(AnchorRow(images(anchor, f"{first['label']} · {first['centre']}"), strips))
            if out:
                panels.append(AnchorPanel(finding, encoder, role, value, out))
    k = int(nbrs["rank"].max()) if len(nbrs) else 0
    return AnchorSection(panels, k, note) if panels else None
