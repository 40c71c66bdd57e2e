"""PathoROB benchmarks (Camelyon, TCGA-4x4, TCGA-2x2, Tolkach-ESCA) from their Hugging Face
parquet snapshots plus PathoROB's metadata CSVs (croma.md §2.5 Table 1; conventions
``croma_conventions.md`` E, "Which rows each metric uses"), and CRoMa's slide-level PCaBiop
cohorts from PANDA's slide table (adapter ``pcabiop``: :func:`build_pcabiop`,
:func:`pcabiop_cohorts`, the PCaBiop-ISUP pair design :func:`isup_pair_occurrences`).

Layout under ``root`` (one folder per HF dataset repo ``bifold-pathomics/PathoROB-<x>``)::

    data/*.parquet      the snapshot: an ``image`` column (HF Image: struct of bytes + path)
                        plus at least ``slide_id`` and ``patch_id``
    metadata/<x>.csv    PathoROB's ``data/metadata`` file(s) (``metadata_dir`` option to move it):
                        subset, slide_id, patch_id, biological_class, medical_center

``view="ri"`` (default) selects the rows the RI / MaRI / CRoMa evaluation uses: Camelyon and
TCGA-4x4 without their OOD centres (20,400 and 5,760 tiles), ``tolkach_esca_reduced.csv``
(9,000 tiles) and, for TCGA-2x2, every row of ``tcga_2x2.csv`` with its quartet as ``subset``
(one manifest row per (tile, quartet) occurrence). ``view="apd"`` returns the whole metadata
file (in-domain and unseen centres, in metadata order, which the shortcut stage's slide blocks
rely on) for the ``shortcut`` stage.

Manifest columns: sample_id = PathoROB's feature id ``"<slide_id>-<patch_id>"``; path = the
locator ``"<parquet file relative to root>#<row index>"`` (read with :func:`read_parquet_image`);
slide_id; patient_id (the TCGA case ``slide_id[:12]``; the slide elsewhere: Camelyon has one
slide per patient in this set and Tolkach's ``slide_id`` is already a case); site and acq_group =
medical_center; bio_label = biological_class; subset (TCGA-2x2 only).
"""
from __future__ import annotations

from itertools import combinations
from pathlib import Path

import numpy as np
import pandas as pd
import pyarrow.parquet as pq

from .files import DatasetError, DatasetFileMissing
from .parquet_images import LOCATOR_SEPARATOR, parse_locator, read_parquet_image  # noqa: F401
from .registry import Adapter, register

_PATCH_COLUMNS = ("patch_id", "sample_id", "id")
_SLIDE_COLUMNS = ("slide_id", "case_id", "wsi_id")
_METADATA_COLUMNS = ("subset", "slide_id", "patch_id", "biological_class", "medical_center")

#: registry name -> (HF repo, RI metadata file, keep only the ``ID`` subset, APD metadata file)
SOURCES = {
    "pathorob_camelyon": ("bifold-pathomics/PathoROB-camelyon", "camelyon.csv", True, "camelyon.csv"),
    "pathorob_tcga4x4": ("bifold-pathomics/PathoROB-tcga", "tcga_4x4.csv", True, "tcga_4x4.csv"),
    "pathorob_tcga2x2": ("bifold-pathomics/PathoROB-tcga", "tcga_2x2.csv", False, None),
    "pathorob_tolkach": ("bifold-pathomics/PathoROB-tolkach_esca", "tolkach_esca_reduced.csv", False,
                         "tolkach_esca.csv"),
}


def _pick(names: list[str], candidates: tuple[str, ...], file: Path, what: str) -> str:
    found = next((c for c in candidates if c in names), None)
    if found is None:
        raise DatasetError(f"{file}: no {what} column (looked for {', '.join(candidates)}; present: "
                           f"{', '.join(names)}); use the bifold-pathomics/PathoROB-* parquet snapshot")
    return found


def parquet_index(root: Path) -> pd.Series:
    """PathoROB feature id ``"<slide_id>-<patch_id>"`` -> locator, over ``root/data/*.parquet``."""
    files = sorted((root / "data").glob("*.parquet"))
    if not files:
        raise DatasetFileMissing(f"{root / 'data'}: no *.parquet files; download the dataset's HF snapshot "
                                 "(data/*.parquet) into the dataset root")
    parts = []
    for file in files:
        names = pq.ParquetFile(file).schema_arrow.names
        cols = [_pick(names, _SLIDE_COLUMNS, file, "slide"), _pick(names, _PATCH_COLUMNS, file, "patch")]
        table = pq.read_table(file, columns=cols).to_pandas().astype(str)
        rel = file.relative_to(root).as_posix()
        parts.append(pd.Series([f"{rel}{LOCATOR_SEPARATOR}{i}" for i in range(len(table))],
                               index=table[cols[0]] + "-" + table[cols[1]]))
    index = pd.concat(parts)
    return index[~index.index.duplicated(keep="first")]


def read_metadata(file: Path) -> pd.DataFrame:
    """One PathoROB metadata CSV, every value a string, with its five columns checked."""
    if not file.is_file():
        raise DatasetFileMissing(f"{file}: metadata file missing; copy it from the PathoROB repository's "
                                 "data/metadata/ (or set the dataset option metadata_dir)")
    meta = pd.read_csv(file, dtype=str, keep_default_na=False)
    missing = [c for c in _METADATA_COLUMNS if c not in meta.columns]
    if missing:
        raise DatasetError(f"{file}: columns {', '.join(missing)} missing; expected PathoROB's "
                           f"{', '.join(_METADATA_COLUMNS)}")
    return meta


def _build(name: str, root: Path, view: str = "ri", metadata_dir: str | Path | None = None) -> pd.DataFrame:
    """The canonical manifest of adapter ``name``: its ``view``'s metadata rows in file order,
    each joined to its tile's parquet locator (module doc)."""
    repo, ri_file, id_only, apd_file = SOURCES[name]
    if view not in ("ri", "apd"):
        raise DatasetError(f"{name}: option view='{view}' unknown; use 'ri' (RI/CRoMa rows) or 'apd' (shortcut stage)")
    if view == "apd" and apd_file is None:
        raise DatasetError(f"{name}: no APD view (PathoROB's TCGA shortcut protocol uses TCGA-4x4); "
                           "use dataset pathorob_tcga4x4 with view=apd")
    meta_dir = Path(metadata_dir) if metadata_dir else root / "metadata"
    file = meta_dir / (ri_file if view == "ri" else apd_file)
    meta = read_metadata(file)
    if view == "ri" and id_only:
        meta = meta[meta["subset"] == "ID"]
    ids = meta["slide_id"] + "-" + meta["patch_id"]
    locator = ids.map(parquet_index(root))
    if locator.isna().any():
        raise DatasetFileMissing(f"{name}: {int(locator.isna().sum())} of {len(meta)} rows of {file} have no tile in "
                                 f"{root / 'data'}/*.parquet, first '{ids[locator.isna()].iloc[0]}'; download the "
                                 f"complete {repo} snapshot into {root}")
    tcga = "tcga" in name
    out = pd.DataFrame({
        "sample_id": ids, "path": locator, "slide_id": meta["slide_id"],
        "patient_id": meta["slide_id"].str[:12] if tcga else meta["slide_id"],
        "site": meta["medical_center"], "acq_group": meta["medical_center"],
        "bio_label": meta["biological_class"]})
    if name == "pathorob_tcga2x2":
        out["subset"] = meta["subset"]
    return out.reset_index(drop=True)


def isup_pair_occurrences(manifest: pd.DataFrame, label_col: str = "bio_label", site_col: str = "site"
                          ) -> pd.DataFrame:
    """PCaBiop-ISUP pair design (croma.md Appendix "ISUP grading"): every pair of the grades in
    ``label_col`` crossed with the two centres is one 2×2 sub-cohort. Returns one row per
    (slide, pair) occurrence with ``subset = "<grade a>_vs_<grade b>"`` (15 pairs for grades
    0–5), ready for the ``croma`` stage's ``design="paired_2x2"``."""
    for col in (label_col, site_col):
        if col not in manifest.columns:
            raise DatasetError(f"isup pairs: manifest has no column '{col}'; add it or pass {col}=<column>")
    sites = manifest[site_col].dropna().unique()
    if len(sites) != 2:
        raise DatasetError(f"isup pairs: column '{site_col}' must hold exactly 2 centres, found {len(sites)}")
    grades = sorted(manifest[label_col].dropna().unique())
    if len(grades) < 2:
        raise DatasetError(f"isup pairs: column '{label_col}' holds fewer than 2 grades")
    parts = [manifest[manifest[label_col].isin((a, b))].assign(subset=f"{a}_vs_{b}")
             for a, b in combinations(grades, 2)]
    return pd.concat(parts, ignore_index=True)


def median_of_pair_medians(per_sample: pd.DataFrame, value_col: str = "croma", subset_col: str = "subset"
                           ) -> tuple[float, pd.Series]:
    """Headline of the pair design: the median over pairs of each pair's median per-occurrence
    value (croma.md Appendix "ISUP grading"; conventions A.7 paired aggregate). Returns the
    headline and the per-pair medians (indexed by pair)."""
    for col in (value_col, subset_col):
        if col not in per_sample.columns:
            raise ValueError(f"pair medians: per-sample table has no column '{col}'")
    pair_medians = per_sample.groupby(subset_col, sort=True)[value_col].median()
    return float(np.median(pair_medians.to_numpy())), pair_medians


#: PANDA's slide table (``train.csv``) columns: slide id, ISUP grade group (0 = benign), centre
PANDA_COLUMNS = {"id_col": "image_id", "grade_col": "isup_grade", "centre_col": "data_provider"}
PCABIOP_VIEWS = ("binary", "isup")


def _read_slide_table(file: Path, id_col: str, grade_col: str, centre_col: str) -> pd.DataFrame:
    if not file.is_file():
        raise DatasetFileMissing(f"pcabiop: slide table '{file}' not found; put PANDA's train.csv there "
                                 "(kaggle.com/competitions/prostate-cancer-grade-assessment) or set slides_csv")
    table = pd.read_csv(file, dtype={id_col: str, centre_col: str})
    missing = [c for c in (id_col, grade_col, centre_col) if c not in table.columns]
    if missing:
        raise DatasetError(f"pcabiop: {file} has no column(s) {', '.join(missing)} (present: "
                           f"{', '.join(table.columns)}); pass id_col / grade_col / centre_col")
    grades = pd.to_numeric(table[grade_col], errors="coerce")
    bad = grades.isna() | ~grades.isin(range(6))
    if bad.any():
        raise DatasetError(f"pcabiop: {file} column '{grade_col}' holds '{table[grade_col][bad].iloc[0]}' at row "
                           f"{int(np.flatnonzero(bad)[0])}; ISUP grade groups are integers 0-5")
    centres = table[centre_col].dropna().unique()
    if len(centres) != 2:
        raise DatasetError(f"pcabiop: {file} column '{centre_col}' holds {len(centres)} centres; the design needs 2")
    return pd.DataFrame({"slide_id": table[id_col], "isup_grade": grades.astype(int), "site": table[centre_col]})


def _draw(frame: pd.DataFrame, n: int, rng: np.random.Generator, what: str) -> pd.DataFrame:
    if len(frame) < n:
        raise DatasetError(f"pcabiop: {what} has {len(frame)} slides, fewer than per_cell={n}; lower per_cell")
    return frame.iloc[np.sort(rng.choice(len(frame), n, replace=False))]


def pcabiop_cohorts(slides: pd.DataFrame, per_cell: int | None = 250, seed: int = 0
                    ) -> tuple[pd.DataFrame, pd.DataFrame]:
    """PCaBiop-ISUP and PCaBiop (croma.md §2.5 and A.12) from a slide table (slide_id, isup_grade,
    site): ISUP = ``per_cell`` slides of every grade group (0–5) × centre cell, drawn at random
    with ``seed`` (all rows when ``per_cell`` is None; 250 × 12 = 3,000 in the paper); binary =
    its matched subset: every benign (grade 0) slide of each centre and as many cancer slides per
    centre, spread evenly over grades 1–5 (⌊n/5⌋ each, the remainder to the lowest grades; the
    paper does not say how it spread them), drawn with the same seed. Returns (binary, isup)."""
    rng = np.random.default_rng(seed)
    cells = []
    for (grade, site), cell in slides.groupby(["isup_grade", "site"], sort=True):
        cells.append(cell if per_cell is None else _draw(cell, per_cell, rng, f"cell ISUP {grade} x {site}"))
    isup = pd.concat(cells).sort_index()
    missing = {(g, s) for g in range(6) for s in slides["site"].unique()} - set(zip(isup["isup_grade"], isup["site"]))
    if missing:
        raise DatasetError(f"pcabiop: no slide of ISUP grade {min(missing)[0]} at centre '{min(missing)[1]}'; "
                           "the design needs all 6 grade groups at both centres")
    parts = []
    for site, rows in isup.groupby("site", sort=True):
        benign = rows[rows["isup_grade"] == 0]
        share = np.full(5, len(benign) // 5) + (np.arange(5) < len(benign) % 5)
        parts.append(benign)
        parts += [_draw(rows[rows["isup_grade"] == g], int(n), rng, f"cell ISUP {g} x {site}")
                  for g, n in zip(range(1, 6), share)]
    return pd.concat(parts).sort_index(), isup


def build_pcabiop(root: Path, view: str = "binary", slides_csv: str = "train.csv", per_cell: int | None = 250,
                  seed: int = 0, image_dir: str = "train_images", id_col: str = "image_id",
                  grade_col: str = "isup_grade", centre_col: str = "data_provider") -> pd.DataFrame:
    """PCaBiop slide manifest from PANDA's layout under ``root``::

        train.csv                 image_id, data_provider (karolinska | radboud), isup_grade (0-5), ...
        train_images/<id>.tiff    the whole-slide images (the slide locator; not read here)
        tiles/<id>/<x>_<y>.png    the slide's tiles at level-0 position (x, y), which the slide
                                  encoders' tile encoders embed (robustbench_fm.features.slides)

    ``view="binary"``: PCaBiop, bio_label benign / cancer (1,000 slides at per_cell=250);
    ``view="isup"``: PCaBiop-ISUP as the 15 grade-pair × 2-centre quartets (one row per
    (slide, pair) occurrence, ``subset`` = pair, bio_label = grade group; croma
    ``design="paired_2x2"``). Cohorts: :func:`pcabiop_cohorts`. Columns: sample_id = slide_id =
    patient_id = the slide id, path, site = acq_group = centre, isup_grade, bio_label (+ subset).
    """
    if view not in PCABIOP_VIEWS:
        raise DatasetError(f"pcabiop: option view='{view}' unknown; use one of {', '.join(PCABIOP_VIEWS)}")
    slides = _read_slide_table(Path(root) / slides_csv, id_col, grade_col, centre_col)
    binary, isup = pcabiop_cohorts(slides, per_cell, seed)
    cohort = binary if view == "binary" else isup
    out = pd.DataFrame({"sample_id": cohort["slide_id"], "path": image_dir + "/" + cohort["slide_id"] + ".tiff",
                        "slide_id": cohort["slide_id"], "patient_id": cohort["slide_id"], "site": cohort["site"],
                        "acq_group": cohort["site"], "isup_grade": cohort["isup_grade"],
                        "bio_label": np.where(cohort["isup_grade"] > 0, "cancer", "benign") if view == "binary"
                        else cohort["isup_grade"].astype(str)}).reset_index(drop=True)
    return isup_pair_occurrences(out) if view == "isup" else out


#: registry name -> description (access, licence and citation: the card of configs/dataset/<name>.yaml)
_DESCRIPTIONS = {
    "pathorob_camelyon": ("Camelyon16/17 lymph-node tiles: normal/tumor x RUMC/UMCU (RI: 20,400; "
                          "APD adds CWZ, RST, LPON)"),
    "pathorob_tcga4x4": "TCGA tiles: 4 cancer types x 4 centres (RI: 5,760; APD adds 4 unseen centres)",
    "pathorob_tcga2x2": "TCGA 2x2 quartets (paired design, one row per tile occurrence; 94 x 1,200)",
    "pathorob_tolkach": ("Tolkach-ESCA oesophageal tiles: 6 classes x 3 centres (RI: 9,000 reduced set; "
                         "APD: 16,300 with unseen centres)"),
}


def _builder(name: str):
    def build(root, view: str = "ri", metadata_dir: str | Path | None = None) -> pd.DataFrame:
        return _build(name, Path(root), view=view, metadata_dir=metadata_dir)
    build.__doc__ = f"Manifest of {name} (module doc): ``view`` 'ri' or 'apd', ``metadata_dir`` default root/metadata."
    return build


register(Adapter(
    name="pcabiop",
    build=build_pcabiop,
    description="PCaBiop: PANDA prostate biopsies, benign/cancer (binary) or ISUP grade pairs (isup) x "
                "Karolinska/Radboud; slide-level (slide encoders over cached tile embeddings)",
))

for _name, _description in _DESCRIPTIONS.items():
    register(Adapter(name=_name, build=_builder(_name), description=_description))
