"""Open-I / Indiana University chest X-ray collection (catalog 1.1, "Open-I")::

    <root>/ecgen-radiology/<n>.xml      NLMCXR_reports.tgz unpacked (the .tgz itself is read too)
    <root>/NLMCXR_png/CXR1_1_IM-0001-3001.png    NLMCXR_png.tgz unpacked (``image_dir``)
    <root>/NLMCXR_dcm/.../1_IM-0001-3001.dcm     NLMCXR_dcm.tgz unpacked (optional, for the view)

One row per ``<parentImage id>``; the patient is the report's ``<uId id="CXRn"/>``. Labels are
the report's manual MeSH ``<major>`` terms ``Head/qualifier/...``: a mapped label ``Head`` matches
the head, ``Head/q`` the head with qualifier ``q`` (chest_findings.csv); an absent term is
negative; a report indexed only as ``No Indexing`` is unlabelled. The XML has no view: it comes
from the DICOM ``ViewPosition`` of NLMCXR_dcm, or from ``dicom_metadata`` = a table with
``imageid`` and ``View Position`` (e.g. torchxrayvision's nlmcxr_dicom_metadata.csv.gz); else UNKNOWN.
"""
from __future__ import annotations

import tarfile
import xml.etree.ElementTree as ET
from pathlib import Path
from typing import Iterator

import pandas as pd

from ..registry import Adapter, register
from .common import (
    ChestDataError,
    assemble,
    dicom_headers,
    finding_sources,
    findings_from_terms,
    normalise_views,
    read_table,
)

REPORTS_DIR, REPORTS_TGZ = "ecgen-radiology", "NLMCXR_reports.tgz"
NOT_INDEXED = "no indexing"


def _xml_reports(root: Path) -> Iterator[tuple[str, bytes]]:
    if (root / REPORTS_DIR).is_dir():
        for path in sorted((root / REPORTS_DIR).glob("*.xml")):
            yield str(path), path.read_bytes()
    elif (root / REPORTS_TGZ).is_file():
        with tarfile.open(root / REPORTS_TGZ, "r:gz") as tar:
            for member in tar.getmembers():
                if member.isfile() and member.name.endswith(".xml"):
                    yield f"{root / REPORTS_TGZ}:{member.name}", tar.extractfile(member).read()
    else:
        raise ChestDataError(f"dataset 'openi': neither '{root / REPORTS_DIR}/' nor '{root / REPORTS_TGZ}' "
                             "found; download NLMCXR_reports.tgz from Open-i into dataset.root")


def mesh_keys(term: str) -> set[str]:
    """Match keys of one MeSH major term: its head and head/qualifier for every qualifier."""
    head, *qualifiers = [p.strip().lower() for p in term.split("/")]
    return {head} | {f"{head}/{q}" for q in qualifiers}


def _reports(root: Path) -> pd.DataFrame:
    rows = []
    for name, data in _xml_reports(root):
        try:
            report = ET.fromstring(data)
        except ET.ParseError as err:
            raise ChestDataError(f"{name}: not valid XML ({err}); re-extract NLMCXR_reports.tgz") from None
        uid = report.find("uId")
        if uid is None:
            raise ChestDataError(f"{name}: element 'uId' missing; re-extract NLMCXR_reports.tgz")
        terms = [t.text for t in report.findall(".//MeSH/major") if t.text]
        keys = set().union(*map(mesh_keys, terms)) if terms else set()
        labelled = bool(keys - {NOT_INDEXED})
        for image in report.findall(".//parentImage"):
            rows.append({"imageid": image.attrib["id"], "uid": uid.attrib["id"],
                         "terms": frozenset(keys) if labelled else None})
    if not rows:
        raise ChestDataError(f"dataset 'openi': no report with a parentImage under '{root}'; "
                             "re-extract NLMCXR_reports.tgz")
    return pd.DataFrame(rows)


def _views(root: Path, ids: pd.Series, dicom_metadata: str | None) -> pd.Series:
    if dicom_metadata is not None:
        path = Path(dicom_metadata) if Path(dicom_metadata).is_absolute() else root / dicom_metadata
        if not path.is_file():
            raise ChestDataError(f"dataset 'openi': option 'dicom_metadata' '{path}' is not a file; "
                                 "point it at a table with imageid and 'View Position' columns")
        table = read_table(path, "openi", ["imageid", "View Position"], usecols=["imageid", "View Position"],
                           dtype=str)
        raw = ids.map(table.drop_duplicates("imageid").set_index("imageid")["View Position"])
    elif (root / "NLMCXR_dcm").is_dir():
        files = {"CXR" + p.stem: p for p in (root / "NLMCXR_dcm").rglob("*.dcm")}
        head = dicom_headers({i: files[i] for i in ids if i in files}, ["ViewPosition"])
        raw = ids.map(head["ViewPosition"]) if len(head) else pd.Series(pd.NA, index=ids.index)
    else:
        raw = pd.Series(pd.NA, index=ids.index)
    return normalise_views(raw)


def build_openi(root: Path, image_dir: str = "NLMCXR_png", dicom_metadata: str | None = None,
                views: list[str] | None = None) -> pd.DataFrame:
    """Open-I manifest from the report XMLs (+ DICOM views)."""
    table = _reports(root)
    vocabulary = set().union(*[t for t in table["terms"] if t is not None])
    prefix = f"{image_dir.strip('/')}/" if image_dir.strip("/") else ""
    base = pd.DataFrame({
        "sample_id": table["imageid"],
        "path": prefix + table["imageid"] + ".png",
        "patient_id": table["uid"],
        "view": _views(root, table["imageid"], dicom_metadata),
        "split": pd.NA,
    })
    findings = findings_from_terms(table["terms"], "openi", vocabulary=vocabulary)
    return assemble(base, findings, "openi", views)


register(Adapter(
    name="openi", build=build_openi, findings=tuple(finding_sources("openi")),
    description="Open-I (Indiana University): 7,470 radiographs of 3,955 reports with manual MeSH terms; "
                "CANDOR's external site.",
))
