"""Miniature copies of the chest datasets' official layouts (catalog 1.1), in the real formats.

Each ``write_<name>(root)`` writes a few images (JPEG, 8/16-bit PNG, DICOM through pydicom with
MONOCHROME1 for some) and the label files with the official column names and quirks: MIMIC's
gzipped CSVs, CheXpert's ``Path`` with the top folder, PadChest's unnamed index column and
list-in-a-cell ``Labels``, NIH's bracketed header ``OriginalImage[Width,Height]``, VinDr's one
row per reader, RSNA's one row per box, Open-I's report XMLs, MS-CXR's pixel boxes. The label
values are written out by hand so that the tests can assert exact expected values.
"""
from __future__ import annotations

import gzip
from pathlib import Path

import numpy as np
import pandas as pd
from PIL import Image

RNG_SEED = 0


def _image(path: Path, size=(40, 48), bits: int = 8) -> None:
    """A small grayscale JPEG or PNG (8- or 16-bit) with some structure."""
    path.parent.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(RNG_SEED)
    top = 255 if bits == 8 else 4095  # PadChest stores 12-bit data in 16-bit PNGs
    arr = (rng.random(size[::-1]) * top).astype(np.uint8 if bits == 8 else np.uint16)
    Image.fromarray(arr).save(path)


def write_dicom(path: Path, rows: int, cols: int, photometric: str = "MONOCHROME2",
                view: str | None = "PA", patient_id: str = "anon", bits: int = 12) -> None:
    """A DX/CR DICOM file with realistic tags (pixel data included)."""
    from pydicom.dataset import Dataset as DicomDataset
    from pydicom.dataset import FileMetaDataset
    from pydicom.uid import ExplicitVRLittleEndian, generate_uid

    meta = FileMetaDataset()
    meta.MediaStorageSOPClassUID = "1.2.840.10008.5.1.4.1.1.1"  # CR image storage
    meta.MediaStorageSOPInstanceUID = generate_uid()
    meta.TransferSyntaxUID = ExplicitVRLittleEndian
    ds = DicomDataset()
    ds.file_meta = meta
    ds.SOPClassUID, ds.SOPInstanceUID = meta.MediaStorageSOPClassUID, meta.MediaStorageSOPInstanceUID
    ds.Modality, ds.BodyPartExamined, ds.PatientID = "CR", "CHEST", patient_id
    if view is not None:
        ds.ViewPosition = view
    ds.Rows, ds.Columns = rows, cols
    ds.SamplesPerPixel, ds.PhotometricInterpretation = 1, photometric
    ds.BitsAllocated, ds.BitsStored, ds.HighBit, ds.PixelRepresentation = ((8, 8, 7, 0) if bits == 8
                                                                           else (16, bits, bits - 1, 0))
    ds.RescaleIntercept, ds.RescaleSlope = 0, 1
    ds.WindowCenter, ds.WindowWidth = (2 ** bits) // 2, 2 ** bits
    rng = np.random.default_rng(RNG_SEED)
    arr = (rng.random((rows, cols)) * (2 ** bits - 1)).astype(np.uint8 if bits == 8 else np.uint16)
    ds.PixelData = arr.tobytes()
    path.parent.mkdir(parents=True, exist_ok=True)
    ds.save_as(path, enforce_file_format=True)


def _csv_gz(df: pd.DataFrame, path: Path) -> None:
    with gzip.open(path, "wt", newline="") as f:
        df.to_csv(f, index=False)


# --- MIMIC-CXR-JPG (+ MS-CXR on its images) -------------------------------------------------
MIMIC_LABELS = ["Atelectasis", "Cardiomegaly", "Consolidation", "Edema", "Enlarged Cardiomediastinum",
                "Fracture", "Lung Lesion", "Lung Opacity", "No Finding", "Pleural Effusion", "Pleural Other",
                "Pneumonia", "Pneumothorax", "Support Devices"]
MIMIC_IMAGES = [  # dicom_id, subject, study, ViewPosition, split
    ("02aa804e-bde0afdd-112c0b34-7bc16630-4e384014", 10000032, 50414267, "PA", "train"),
    ("174413ec-4ec4c1f7-34ea26b7-c5f994f8-79ef1962", 10000032, 50414267, "LATERAL", "train"),
    ("2a2277a9-b0ded155-c0de8eb9-c124d10e-82c5caab", 10000032, 53189527, "AP", "train"),
    ("68b5c4b1-227d0485-9cc38c3f-7b84ab51-4b472714", 10000764, 57375967, "AP", "validate"),
    ("096052b7-d256dc40-453a102b-fa7d01c6-1b22c6b4", 10000764, 57375967, "LL", "validate"),
    ("fffabebf-74fd3a1f-673b6b41-96ec0ac9-2ab69818", 10000898, 50771383, "", "test"),
    ("ea030e7a-2e3b1346-bc518786-7a8fd698-f673b44c", 11000011, 59000001, "SWIMMERS", "train"),
]
MIMIC_STUDIES = {  # study -> {label: value}; 59000001 has no labeler row
    50414267: {"No Finding": 1.0},
    53189527: {"Pneumothorax": 1.0, "Pleural Effusion": -1.0, "Edema": 0.0},
    57375967: {"Pneumonia": -1.0, "Lung Opacity": 1.0, "Support Devices": 1.0},
    50771383: {"Cardiomegaly": 1.0, "Fracture": 0.0},
}


def write_mimic_cxr(root: Path) -> Path:
    """MIMIC-CXR-JPG 2.1.0 layout: 7 JPEGs, 4 studies with labels (one study unlabelled)."""
    root.mkdir(parents=True, exist_ok=True)
    meta = pd.DataFrame([{
        "dicom_id": d, "subject_id": s, "study_id": st,
        "PerformedProcedureStepDescription": "CHEST (PA AND LAT)", "ViewPosition": v or None,
        "Rows": 3056, "Columns": 2544, "StudyDate": 21800506, "StudyTime": 213014.531,
        "ProcedureCodeSequence_CodeMeaning": "CHEST (PA AND LAT)",
        "ViewCodeSequence_CodeMeaning": {"PA": "postero-anterior", "AP": "antero-posterior"}.get(v, "lateral"),
        "PatientOrientationCodeSequence_CodeMeaning": "Erect"} for d, s, st, v, _ in MIMIC_IMAGES])
    _csv_gz(meta, root / "mimic-cxr-2.0.0-metadata.csv.gz")
    split = pd.DataFrame([{"dicom_id": d, "study_id": st, "subject_id": s, "split": sp}
                          for d, s, st, _, sp in MIMIC_IMAGES])
    _csv_gz(split, root / "mimic-cxr-2.0.0-split.csv.gz")
    subject_of = {st: s for _, s, st, _, _ in MIMIC_IMAGES}
    labels = pd.DataFrame([{"subject_id": subject_of[st], "study_id": st,
                            **{c: vals.get(c, np.nan) for c in MIMIC_LABELS}} for st, vals in MIMIC_STUDIES.items()])
    _csv_gz(labels, root / "mimic-cxr-2.0.0-chexpert.csv.gz")
    _csv_gz(labels, root / "mimic-cxr-2.0.0-negbio.csv.gz")
    for d, s, st, _, _ in MIMIC_IMAGES:
        _image(root / "files" / f"p{str(s)[:2]}" / f"p{s}" / f"s{st}" / f"{d}.jpg")
    return root


MS_CXR_ROWS = [  # dicom_id index into MIMIC_IMAGES, category, label_text, x, y, w, h
    (0, "Pneumothorax", "small right apical pneumothorax", 1800, 200, 400, 300),
    (0, "Pneumothorax", "small right apical pneumothorax", 1700, 400, 200, 500),
    (0, "Pleural Effusion", "left effusion", 100, 2000, 600, 500),
    (2, "Cardiomegaly", "enlarged heart", 900, 1500, 1200, 900),
]


def write_ms_cxr(mimic_root: Path) -> Path:
    """MS-CXR v1.1.0 CSV next to a MIMIC-CXR-JPG fixture (one row per box, 3056x2544 images)."""
    rows = []
    for i, cat, text, x, y, w, h in MS_CXR_ROWS:
        d, s, st, _, _ = MIMIC_IMAGES[i]
        rows.append({"dicom_id": d, "category_name": cat, "label_text": text,
                     "path": f"files/p{str(s)[:2]}/p{s}/s{st}/{d}.jpg", "x": x, "y": y, "w": w, "h": h,
                     "image_width": 2544, "image_height": 3056, "split": "test" if i == 0 else "train"})
    folder = mimic_root / "ms-cxr" / "1.1.0"
    folder.mkdir(parents=True, exist_ok=True)
    pd.DataFrame(rows).to_csv(folder / "MS_CXR_Local_Alignment_v1.1.0.csv", index=False)
    return mimic_root


# --- CheXpert -------------------------------------------------------------------------------
CHEXPERT_LABELS = ["No Finding", "Enlarged Cardiomediastinum", "Cardiomegaly", "Lung Opacity", "Lung Lesion",
                   "Edema", "Consolidation", "Pneumonia", "Atelectasis", "Pneumothorax", "Pleural Effusion",
                   "Pleural Other", "Fracture", "Support Devices"]
CHEXPERT_ROWS = [  # split, patient, study, view file, Frontal/Lateral, AP/PA, labels
    ("train", 1, 1, "view1_frontal", "Frontal", "AP", {"No Finding": 1.0, "Support Devices": 1.0}),
    ("train", 2, 2, "view1_frontal", "Frontal", "AP", {"Cardiomegaly": -1.0, "Lung Opacity": 1.0,
                                                        "Edema": -1.0, "Fracture": 1.0}),
    ("train", 2, 2, "view2_lateral", "Lateral", None, {"Pneumothorax": 0.0, "Pleural Effusion": 1.0}),
    ("train", 3, 1, "view1_frontal", "Frontal", "PA", {"Pneumothorax": 1.0, "Atelectasis": -1.0}),
    ("train", 4, 1, "view1_frontal", "Frontal", "LL", {"Pleural Other": 1.0}),
    ("valid", 64541, 1, "view1_frontal", "Frontal", "AP", {c: 0.0 for c in CHEXPERT_LABELS} | {"Edema": 1.0}),
]


def write_chexpert(root: Path) -> Path:
    """CheXpert-v1.0-small layout: train.csv (with uncertain -1) and valid.csv (0/1), JPEGs."""
    for split in ("train", "valid"):
        rows = []
        for sp, pat, st, view, fl, appa, labels in CHEXPERT_ROWS:
            if sp != split:
                continue
            rel = f"{split}/patient{pat:05d}/study{st}/{view}.jpg"
            _image(root / rel, size=(32, 40))
            rows.append({"Path": f"CheXpert-v1.0-small/{rel}", "Sex": "Female", "Age": 68,
                         "Frontal/Lateral": fl, "AP/PA": appa,
                         **{c: labels.get(c, np.nan) for c in CHEXPERT_LABELS}})
        pd.DataFrame(rows).to_csv(root / f"{split}.csv", index=False)
    return root


# --- PadChest -------------------------------------------------------------------------------
PADCHEST_ROWS = [  # ImageID, ImageDir, PatientID, Projection, Labels cell
    ("20536686640136348236148679891455886468_k6ga29.png", 0, "p1", "PA", "['normal']"),
    ("20536686640136348236148679891455886468_k6ga30.png", 0, "p1", "L", "['pleural effusion', ' cardiomegaly']"),
    ("216840111366964012283393834152009033102258826_00-059-087.png", 1, "p2", "AP_horizontal",
     "['pericardial effusion', 'hydropneumothorax', 'pseudonodule']"),
    ("216840111366964012339356563862009072111404053_00-043-192.png", 1, "p3", "AP",
     "['callus rib fracture', 'increased density', 'lung metastasis', 'calcified pleural plaques']"),
    ("216840111366964012373310883942009117084022290_00-064-025.png", 54, "p4", "COSTAL", None),
    ("216840111366964012373310883942009170084120009_00-097-074.png", 54, "p5", "UNK",
     "['superior mediastinal enlargement', 'air bronchogram', '']"),
]


def write_padchest(root: Path) -> Path:
    """PadChest layout: the 36-column CSV (gzipped, unnamed first column), 16-bit PNGs in ImageDir/."""
    columns = ["ImageID", "ImageDir", "StudyDate_DICOM", "StudyID", "PatientID", "PatientBirth",
               "PatientSex_DICOM", "ViewPosition_DICOM", "Projection", "MethodProjection", "Pediatric",
               "Modality_DICOM", "Manufacturer_DICOM", "PhotometricInterpretation_DICOM",
               "PixelRepresentation_DICOM", "PixelAspectRatio_DICOM", "SpatialResolution_DICOM",
               "BitsStored_DICOM", "WindowCenter_DICOM", "WindowWidth_DICOM", "Rows_DICOM", "Columns_DICOM",
               "XRayTubeCurrent_DICOM", "Exposure_DICOM", "ExposureInuAs_DICOM", "ExposureTime",
               "RelativeXRayExposure_DICOM", "ReportID", "Report", "MethodLabel", "Labels", "Localizations",
               "LabelsLocalizationsBySentence", "labelCUIS", "LocalizationsCUIS"]
    rows = []
    for image, folder, patient, proj, labels in PADCHEST_ROWS:
        _image(root / str(folder) / image, bits=16)
        row = dict.fromkeys(columns, "None")
        row.update(ImageID=image, ImageDir=folder, StudyDate_DICOM=20140915, StudyID=image[:20], PatientID=patient,
                   PatientBirth=1930.0, PatientSex_DICOM="F", ViewPosition_DICOM="POSTEROANTERIOR",
                   Projection=proj, MethodProjection="Manual review of DICOM fields", Pediatric="No",
                   Modality_DICOM="CR", PhotometricInterpretation_DICOM="MONOCHROME2", BitsStored_DICOM=12,
                   Report=" sin hallazg patolog edad pacient .", MethodLabel="Physician", Labels=labels,
                   Localizations="[]", LabelsLocalizationsBySentence="[['normal']]", labelCUIS="[]",
                   LocalizationsCUIS="[]")
        rows.append(row)
    table = pd.DataFrame(rows, columns=columns)
    with gzip.open(root / "PADCHEST_chest_x_ray_images_labels_160K_01.02.19.csv.gz", "wt", newline="") as f:
        table.to_csv(f, index=True)  # the official file's first column is an unnamed index
    return root


# --- NIH ChestX-ray14 -----------------------------------------------------------------------
NIH_ROWS = [  # Image Index, Finding Labels, Patient ID, View Position
    ("00000001_000.png", "Cardiomegaly", 1, "PA"),
    ("00000001_001.png", "Cardiomegaly|Emphysema", 1, "PA"),
    ("00000002_000.png", "No Finding", 2, "AP"),
    ("00000003_000.png", "Hernia|Mass|Pleural_Thickening", 3, "PA"),
    ("00000003_001.png", "Pneumothorax|Effusion|Infiltration", 3, "AP"),
]


def write_nih_cxr14(root: Path) -> Path:
    """NIH Box layout: Data_Entry_2017_v2020.csv with its 11-column bracketed header, images/, split lists."""
    root.mkdir(parents=True, exist_ok=True)
    header = ("Image Index,Finding Labels,Follow-up #,Patient ID,Patient Age,Patient Gender,View Position,"
              "OriginalImage[Width,Height],OriginalImagePixelSpacing[x,y]")
    lines = [header] + [f"{name},{labels},{i},{pid},57,M,{view},2682,2749,0.143,0.143"
                        for i, (name, labels, pid, view) in enumerate(NIH_ROWS)]
    (root / "Data_Entry_2017_v2020.csv").write_text("\n".join(lines) + "\n")
    for name, *_ in NIH_ROWS:
        _image(root / "images" / name, size=(64, 64))
    (root / "train_val_list.txt").write_text("00000001_000.png\n00000001_001.png\n00000002_000.png\n")
    (root / "test_list.txt").write_text("00000003_000.png\n00000003_001.png\n")
    return root


# --- RSNA Pneumonia -------------------------------------------------------------------------
RSNA_ROWS = [  # patientId, x, y, width, height, Target
    ("0004cfab-14fd-4e49-80ba-63a80b6bddd6", None, None, None, None, 0),
    ("00436515-870c-4b36-a041-de91049b9ab4", 264.0, 152.0, 213.0, 379.0, 1),
    ("00436515-870c-4b36-a041-de91049b9ab4", 562.0, 152.0, 256.0, 453.0, 1),
    ("00704310-78a8-4b38-8475-49f4573b2dbb", 323.0, 577.0, 160.0, 104.0, 1),
    ("00569f44-917d-4c86-a842-81832af98c30", None, None, None, None, 0),
]
RSNA_VIEWS = {"0004cfab-14fd-4e49-80ba-63a80b6bddd6": "PA", "00436515-870c-4b36-a041-de91049b9ab4": "AP",
              "00704310-78a8-4b38-8475-49f4573b2dbb": "PA", "00569f44-917d-4c86-a842-81832af98c30": "AP"}


def write_rsna_pneumonia(root: Path) -> Path:
    """Kaggle stage-2 layout: labels CSV (one row per box) and 1024x1024 8-bit DICOMs."""
    root.mkdir(parents=True, exist_ok=True)
    pd.DataFrame(RSNA_ROWS, columns=["patientId", "x", "y", "width", "height", "Target"]).to_csv(
        root / "stage_2_train_labels.csv", index=False)
    for pid, view in RSNA_VIEWS.items():
        write_dicom(root / "stage_2_train_images" / f"{pid}.dcm", 1024, 1024, view=view, patient_id=pid, bits=8)
    return root


# --- VinDr-CXR / VinDr-PCXR -----------------------------------------------------------------
VINDR_LABELS = ["Aortic enlargement", "Atelectasis", "Calcification", "Cardiomegaly", "Clavicle fracture",
                "Consolidation", "Edema", "Emphysema", "Enlarged PA", "ILD", "Infiltration", "Lung Opacity",
                "Lung cavity", "Lung cyst", "Mediastinal shift", "Nodule/Mass", "Pleural effusion",
                "Pleural thickening", "Pneumothorax", "Pulmonary fibrosis", "Rib fracture", "Other lesion",
                "COPD", "Lung tumor", "Pneumonia", "Tuberculosis", "Other diseases", "No finding"]
VINDR_TRAIN = {  # image_id -> [(rad_id, positive labels)] (3 readers)
    "000434271f63a053c4128a0ba6352c7f": [("R2", ["No finding"]), ("R3", ["No finding"]), ("R6", ["No finding"])],
    "00053190460d56c53cc3e57321387478": [("R8", ["Pneumothorax", "Lung tumor"]), ("R9", ["Pneumothorax"]),
                                         ("R10", ["Infiltration"])],
    "0005e8e3701dfb1dd93d53e2ff537b6e": [("R8", ["Rib fracture"]), ("R9", ["No finding"]), ("R10", ["No finding"])],
}
VINDR_TEST = {"0a1aef5326b7b24378c6692f7a454e52": ["Pneumonia", "Pleural effusion"],
              "0a2d5b3b0b32a4e2a9c8a8bf0e6bd4f3": ["No finding"]}
VINDR_BOXES = [  # image_id, rad_id, class_name, x_min, y_min, x_max, y_max
    ("00053190460d56c53cc3e57321387478", "R8", "Pneumothorax", 1500.0, 300.0, 1900.0, 900.0),
    ("00053190460d56c53cc3e57321387478", "R9", "Pneumothorax", 1450.0, 350.0, 1850.0, 1000.0),
    ("00053190460d56c53cc3e57321387478", "R10", "Infiltration", 300.0, 700.0, 600.0, 1200.0),
    ("000434271f63a053c4128a0ba6352c7f", "R2", "No finding", None, None, None, None),
]
VINDR_SIZE = (2000, 2500)  # Rows, Columns of the boxed image


def write_vindr_cxr(root: Path) -> Path:
    """VinDr-CXR 1.0.0 PhysioNet layout: per-reader image labels, boxes, DICOMs (MONOCHROME1 and 2)."""
    ann = root / "annotations"
    ann.mkdir(parents=True, exist_ok=True)
    train = [{"image_id": i, "rad_id": r, **{c: float(c in pos) for c in VINDR_LABELS}}
             for i, readers in VINDR_TRAIN.items() for r, pos in readers]
    pd.DataFrame(train).to_csv(ann / "image_labels_train.csv", index=False)
    test_cols = [c if c != "Other diseases" else "Other disease" for c in VINDR_LABELS]  # spelling differs
    test = [{"image_id": i, **{c: float(c in pos) for c in test_cols}} for i, pos in VINDR_TEST.items()]
    pd.DataFrame(test).to_csv(ann / "image_labels_test.csv", index=False)
    cols = ["image_id", "rad_id", "class_name", "x_min", "y_min", "x_max", "y_max"]
    pd.DataFrame(VINDR_BOXES, columns=cols).to_csv(ann / "annotations_train.csv", index=False)
    pd.DataFrame(columns=cols).to_csv(ann / "annotations_test.csv", index=False)
    for n, image in enumerate(VINDR_TRAIN):
        rows, columns = VINDR_SIZE if n == 1 else (256, 200)
        write_dicom(root / "train" / f"{image}.dicom", rows, columns,
                    photometric="MONOCHROME1" if n % 2 else "MONOCHROME2", view=None, bits=14)
    for image in VINDR_TEST:
        write_dicom(root / "test" / f"{image}.dicom", 256, 200, photometric="MONOCHROME1", view=None)
    return root


PCXR_LABELS = ["No finding", "Bronchitis", "Brocho-pneumonia", "Bronchiolitis", "Situs inversus", "Pneumonia",
               "Pleuro-pneumonia", "Diagphramatic hernia", "Tuberculosis", "Congenital emphysema", "CPAM",
               "Hyaline membrane disease", "Mediastinal tumor", "Lung tumor", "Other disease"]
PCXR_TRAIN = {"0a0b1c2d3e4f5a6b7c8d9e0f1a2b3c4d": ["Brocho-pneumonia"],
              "1b2c3d4e5f6a7b8c9d0e1f2a3b4c5d6e": ["No finding"],
              "2c3d4e5f6a7b8c9d0e1f2a3b4c5d6e7f": ["Mediastinal tumor", "Bronchiolitis"]}
PCXR_TEST = {"3d4e5f6a7b8c9d0e1f2a3b4c5d6e7f80": ["Lung tumor"]}


def write_vindr_pcxr(root: Path) -> Path:
    """VinDr-PCXR 1.0.0 layout (VinDr pattern): image_labels_{train,test}.csv, DICOMs."""
    root.mkdir(parents=True, exist_ok=True)
    for split, images in (("train", PCXR_TRAIN), ("test", PCXR_TEST)):
        rows = [{"image_id": i, "rad_ID": "R1", **{c: float(c in pos) for c in PCXR_LABELS}}
                for i, pos in images.items()]
        pd.DataFrame(rows).to_csv(root / f"image_labels_{split}.csv", index=False)
        for image in images:
            write_dicom(root / split / f"{image}.dicom", 128, 100, photometric="MONOCHROME2", view="PA")
    return root


# --- Open-I ---------------------------------------------------------------------------------
OPENI_REPORTS = {  # report n -> (MeSH major terms, [(parentImage id, DICOM ViewPosition or None)])
    1: (["normal"], [("CXR1_1_IM-0001-3001", "PA"), ("CXR1_1_IM-0001-4001", "LATERAL")]),
    2: (["Cardiomegaly/borderline", "Pulmonary Atelectasis/base/left", "Thickening/pleura/right"],
        [("CXR2_IM-0652-1001", "PA"), ("CXR2_IM-0652-2001", "LL")]),
    3: (["Opacity/lung/base/right", "Fractures, Bone/ribs/left/healed", "Thickening/mediastinum"],
        [("CXR3_IM-1384-1001", None)]),
    4: (["No Indexing"], [("CXR4_IM-2050-1001", "AP")]),
    5: (["Cardiac Shadow/enlarged/severe"], []),  # a report without images
}


def _openi_xml(n: int, terms: list[str], images: list[tuple[str, str | None]]) -> str:
    major = "".join(f"<major>{t}</major>" for t in terms)
    parents = "".join(f'<parentImage id="{i}"><figureId>F{k}</figureId><caption>Xray Chest</caption>'
                      f"<url>/hadoop/storage/radiology/extract/{i}.jpg</url></parentImage>"
                      for k, (i, _) in enumerate(images, 1))
    return (f'<?xml version="1.0" encoding="utf-8"?>\n<eCitation><meta type="rr"/><uId id="CXR{n}"/>'
            f'<pmcId id="{n}"/><docSource>CXR</docSource><IUXRId id="{n}"/>'
            "<licenseType>open-access</licenseType>"
            "<licenseURL>http://creativecommons.org/licenses/by-nc-nd/4.0/</licenseURL>"
            "<MedlineCitation><Article><Abstract><AbstractText Label=\"FINDINGS\">Lungs clear.</AbstractText>"
            f"</Abstract></Article></MedlineCitation><MeSH>{major}<automatic>opacity</automatic></MeSH>"
            f"{parents}</eCitation>")


def write_openi(root: Path) -> Path:
    """Open-I layout: ecgen-radiology/*.xml, NLMCXR_png/*.png, NLMCXR_dcm/*.dcm (no 'CXR' prefix)."""
    (root / "ecgen-radiology").mkdir(parents=True, exist_ok=True)
    for n, (terms, images) in OPENI_REPORTS.items():
        (root / "ecgen-radiology" / f"{n}.xml").write_text(_openi_xml(n, terms, images))
        for image, view in images:
            _image(root / "NLMCXR_png" / f"{image}.png")
            write_dicom(root / "NLMCXR_dcm" / f"{image[3:]}.dcm", 64, 48, photometric="MONOCHROME1",
                        view=view, bits=12)
    return root
