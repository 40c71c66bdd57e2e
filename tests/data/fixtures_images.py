"""Writers of small image files in real formats (DICOM, HDF5, NPZ, TIFF, PNG) for the tests."""
from __future__ import annotations

import io
from pathlib import Path

import numpy as np
from PIL import Image


def write_dicom(path: Path, pixels: np.ndarray, photometric: str = "MONOCHROME2", bits_stored: int = 12,
                window: tuple[float, float] | None = None, rescale: tuple[float, float] | None = None,
                voi_lut: tuple[int, list[int], int] | None = None, jpeg2000: bool = False) -> Path:
    """A single-frame grayscale DICOM of uint16 ``pixels``: Explicit VR Little Endian, or with
    ``jpeg2000`` a lossless JPEG 2000 codestream (encoded by Pillow) in encapsulated pixel data.

    ``window`` = (center, width); ``rescale`` = (slope, intercept); ``voi_lut`` = (first mapped
    value, LUT entries, bits per entry) written as a VOI LUT Sequence item.
    """
    from pydicom.dataset import Dataset, FileMetaDataset
    from pydicom.encaps import encapsulate
    from pydicom.uid import (
        ExplicitVRLittleEndian,
        JPEG2000Lossless,
        SecondaryCaptureImageStorage,
        generate_uid,
    )

    meta = FileMetaDataset()
    meta.MediaStorageSOPClassUID = SecondaryCaptureImageStorage
    meta.MediaStorageSOPInstanceUID = generate_uid()
    meta.TransferSyntaxUID = ExplicitVRLittleEndian
    ds = Dataset()
    ds.file_meta = meta
    ds.SOPClassUID = meta.MediaStorageSOPClassUID
    ds.SOPInstanceUID = meta.MediaStorageSOPInstanceUID
    ds.Modality = "MG"
    ds.PatientID = "anon"
    ds.Rows, ds.Columns = pixels.shape
    ds.SamplesPerPixel = 1
    ds.PhotometricInterpretation = photometric
    ds.BitsAllocated, ds.BitsStored, ds.HighBit = 16, bits_stored, bits_stored - 1
    ds.PixelRepresentation = 0
    if window is not None:
        ds.WindowCenter, ds.WindowWidth = window
    if rescale is not None:
        ds.RescaleSlope, ds.RescaleIntercept = rescale
    if voi_lut is not None:
        first, entries, bits = voi_lut
        item = Dataset()
        item.LUTDescriptor = [len(entries), first, bits]
        item.LUTData = np.asarray(entries, dtype="<u2").tobytes()  # OW: one 16-bit word per entry
        ds.VOILUTSequence = [item]
    ds.PixelData = np.ascontiguousarray(pixels, dtype="<u2").tobytes()
    if jpeg2000:
        stream = io.BytesIO()
        Image.fromarray(np.asarray(pixels, np.uint16)).save(stream, format="JPEG2000", no_jp2=True,
                                                            irreversible=False)
        ds.PixelData = encapsulate([stream.getvalue()])
        ds["PixelData"].VR = "OB"
        meta.TransferSyntaxUID = JPEG2000Lossless
    path.parent.mkdir(parents=True, exist_ok=True)
    ds.save_as(path, enforce_file_format=True)
    return path
