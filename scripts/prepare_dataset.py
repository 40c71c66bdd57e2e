"""Store every image of a dataset at SIZE x SIZE, as the CANDOR papers do before each encoder's
own resize (candor.md "Scope": "Every image is stored at 224x224 pixels. The image processor of
each encoder then resizes it to the input size of that encoder"; 512 for the resolution ablation).
The experiments do this themselves (``resolution=224``, :mod:`robustbench_fm.data.prepared`); this
script writes standalone PNG copies and their manifest, for use outside the package.

    python scripts/prepare_dataset.py NAME ROOT OUT [--size 224] [--option key=value ...] [--no-verify]
                                      [--workers N] [--decode scaled|exact]

builds the manifest of dataset NAME under ROOT, writes one PNG per row to
``OUT/images/<sample_id>.png`` and ``OUT/manifest.csv`` (the manifest with ``path`` relative to
OUT), so ``dataset.root=OUT`` with that manifest reproduces the run on the stored copies.

Resize rule (:func:`robustbench_fm.data.prepared.prepare_image`, shared with the experiments' store): the
image as :func:`robustbench_fm.data.images.read_image` returns it (8-bit 'L' or
'RGB', DICOM LUTs applied, crop columns applied) is resized to exactly SIZE x SIZE with Pillow's
bicubic filter, which low-passes when it shrinks (no aliasing); the aspect ratio is not kept
(no crop, so nothing of the image is lost). PNG keeps the result lossless and single-channel
images single-channel. The crop columns are dropped from the written manifest (already applied);
other columns, boxes included (normalised, so unchanged by the resize), are kept.

Decoding (``--decode``, the experiments' ``extract.decode``, same default): ``scaled`` reads a JPEG at
the largest DCT scale that leaves at least twice SIZE on both sides
(:func:`robustbench_fm.data.images.draft_scale`, the prepared store's need), then resizes as above;
``exact`` decodes it at full size (the copies this script wrote before scaled decoding, bit for
bit). Either way the copies hold the pixels the experiments' store holds for the same mode (tested).
Other formats are read at full size in both modes.

Resumable: a finished PNG is never rewritten (each is written to a temp file and renamed, so an
existing file is complete), nor are an unchanged manifest and ``prepare.json``. ``prepare.json``
records the dataset, size and decode mode (``"decode": "scaled"``; no field for ``exact``, as
the prepared store keys it, so an OUT written before is an exact one); a later run into the same
OUT with another dataset, size or decode mode stops with an error instead of mixing them.
``--workers N`` decodes in N forked processes.
"""
from __future__ import annotations

import argparse
import json
import multiprocessing
import re
import sys
from pathlib import Path

import yaml
from tqdm import tqdm

from robustbench_fm.core.atomic import write_atomic, write_text_atomic
from robustbench_fm.data import build_manifest
from robustbench_fm.data.images import (
    CROP_COLUMNS,
    DECODE_MODES,
    DEFAULT_DECODE,
    check_decode,
    decode_fields,
    need_of,
    read_image,
)
from robustbench_fm.data.prepared import prepare_image


def stored_name(sample_id: str) -> str:
    """``images/<sample_id>.png`` with characters outside ``[A-Za-z0-9._/-]`` replaced by ``_``
    and ``..``/empty path parts removed (sample_ids such as ``NCT-CRC-HE-100K/ADI-X`` keep folders)."""
    parts = [re.sub(r"[^A-Za-z0-9._-]", "_", p) for p in str(sample_id).split("/")]
    parts = [p for p in parts if p not in ("", ".", "..")]
    return "images/" + "/".join(parts) + ".png"


def _parse_options(pairs: list[str]) -> dict:
    options = {}
    for pair in pairs:
        key, sep, value = pair.partition("=")
        if not sep or not key:
            raise SystemExit(f"--option '{pair}': write it as key=value (value in YAML, e.g. part=segmentation)")
        options[key] = yaml.safe_load(value)
    return options


def _check_out(out: Path, record: dict) -> None:
    marker = out / "prepare.json"
    if marker.is_file():
        previous = json.loads(marker.read_text())
        keys = ("dataset", "size", "decode")
        if {k: previous.get(k) for k in keys} != {k: record.get(k) for k in keys}:
            raise SystemExit(f"{out} holds dataset '{previous.get('dataset')}' at size {previous.get('size')} "
                             f"(decode {previous.get('decode', 'exact')}); choose another OUT for "
                             f"'{record['dataset']}' at size {record['size']} (decode {record.get('decode', 'exact')})")
    _write_if_changed(marker, json.dumps(record, indent=1, sort_keys=True) + "\n")


def _write_if_changed(path: Path, text: str) -> None:
    if not path.is_file() or path.read_text() != text:
        write_text_atomic(path, text)


def _store(job: tuple[Path, dict, Path, int, str]) -> int:
    """Write one resized copy unless it exists; 1 if written."""
    root, row, dest, size, decode = job
    if dest.is_file():
        return 0
    need = need_of("squash", size) if decode == "scaled" else None  # the prepared store's need: S x S
    image = prepare_image(read_image(root, row, need), size)  # the rule's one home (the experiments' store too)
    write_atomic(dest, lambda f: image.save(f, format="PNG"))
    return 1


def prepare(name: str, root: Path, out: Path, size: int = 224, options: dict | None = None,
            verify_images: bool = True, progress: bool = True, workers: int = 1,
            decode: str = DEFAULT_DECODE) -> tuple[Path, int]:
    """Write the resized copies and ``OUT/manifest.csv``; returns (manifest path, images written).

    ``workers`` > 1 decodes in that many forked processes (each opens its own HDF5 handles).
    ``decode``: ``scaled`` or ``exact`` (module docstring).
    """
    check_decode(decode, "--decode")
    if size < 8:
        raise SystemExit(f"--size {size}: too small; use 224 (the papers) or 512 (resolution ablation)")
    manifest = build_manifest(name, root, verify_images=verify_images, **(options or {}))
    names = manifest["sample_id"].map(stored_name)
    clash = names.duplicated()
    if clash.any():
        raise SystemExit(f"{name}: sample_id {manifest['sample_id'][clash].iloc[0]!r} maps to the same file as "
                         "another after replacing unsafe characters; make sample_ids distinct")
    out.mkdir(parents=True, exist_ok=True)
    _check_out(out, {"dataset": name, "size": int(size), "source_root": str(Path(root).resolve()),
                     "options": options or {}, "resize": "PIL bicubic to size x size, aspect not kept, PNG",
                     **decode_fields(decode)})
    jobs = [(root, row, out / rel, size, decode) for row, rel in zip(manifest.to_dict("records"), names)]
    bar = {"total": len(jobs), "desc": f"{name} -> {size}px", "unit": "img", "disable": not progress}
    if workers > 1:
        with multiprocessing.get_context("fork").Pool(workers) as pool:
            written = sum(tqdm(pool.imap_unordered(_store, jobs, chunksize=8), **bar))
    else:
        written = sum(_store(job) for job in tqdm(jobs, **bar))
    stored = manifest.drop(columns=[c for c in CROP_COLUMNS if c in manifest.columns]).assign(path=names)
    target = out / "manifest.csv"
    _write_if_changed(target, stored.to_csv(index=False))
    return target, written


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("name", help="registry name of the dataset (python -m robustbench_fm list datasets)")
    parser.add_argument("root", type=Path, help="folder of the official download (dataset.root)")
    parser.add_argument("out", type=Path, help="folder for the resized copies and manifest.csv")
    parser.add_argument("--size", type=int, default=224, help="side in pixels (224 as in the papers; 512)")
    parser.add_argument("--option", action="append", default=[], metavar="KEY=VALUE",
                        help="adapter option passed to build_manifest (repeatable)")
    parser.add_argument("--no-verify", action="store_true", help="do not check that every image exists first")
    parser.add_argument("--workers", type=int, default=1, help="decoding processes (DICOM/JPEG 2000 are slow)")
    parser.add_argument("--decode", choices=DECODE_MODES, default=DEFAULT_DECODE,
                        help="scaled: JPEGs decoded at the DCT scale the resize needs (the experiments' default); "
                             "exact: full size, the copies of earlier releases")
    args = parser.parse_args(argv)
    target, written = prepare(args.name, args.root, args.out, args.size, _parse_options(args.option),
                              verify_images=not args.no_verify, workers=args.workers, decode=args.decode)
    print(f"{args.name}: {written} images written at {args.size}px, manifest {target}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
