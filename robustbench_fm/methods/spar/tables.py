"""SPAR-Bench tables (spar.md Tables 1-5) from the ``spar`` stage's results, with the published
row labels (``CNN-MLP``, ``RadDINO-Trans†``, ``Chance``), sections and column headers, accuracies
as fractions and MED in pixels, each the mean over seeds (Table 2 also the std, ``<col>_sd``).

MED frame: ``MED`` is in pixels of the 224 x 224 frame the models see, the frame the published
values are compared against; the native slice frame (512 px on WORD) is shown beside it, as the
``MED (native)`` column of Table 1 and the ``native`` block of Table 3, whose sections carry
"(native slice frame)" so no published cell is matched to them. See
:func:`~robustbench_fm.methods.spar.metrics.localization` for why the default is the 224 frame.

Reference rows under the configurations: ``Chance`` (1 / classes, the paper's), ``Majority class``
(always the most frequent TRAINING label) and ``Question-only prior`` (the most frequent training
label of the same question, e.g. the same pair of organ pairs for distance:
:func:`~robustbench_fm.methods.spar.metrics.reference_answers`) and ``Canonical recall``
(:data:`CANONICAL`: what recalling the usual anatomy gives, from the training data only: each organ's
mean training position for MED, its usual training cell for Perm, the organ pair plus whether the
slice is flipped for relative position; also in Tables 3-4 per organ). Table 2 also has an ``n=`` row,
the number of items per probe, as the published header prints it."""
from __future__ import annotations

import numpy as np
import pandas as pd

from ...core.tables import PaperTable, SweepResults
from .params import DEFAULT_LABELS, PLANTED

TABLES = ["spar_table1", "spar_table2", "spar_table3", "spar_table4", "spar_table5"]

PROBE_COLUMNS = {"relative_position": "RelPos", "orientation": "Orient", "kidney_symmetry": "Symm",
                 "liver_size": "Size", "distance_compare": "Dist"}
ORGAN_COLUMNS = {"liver": "Liver", "spleen": "Spln", "left_kidney": "K-L", "right_kidney": "K-R", "stomach": "Stom",
                 "gallbladder": "GB", "esophagus": "Esph", "pancreas": "Panc", "duodenum": "Duod", "colon": "Colon",
                 "intestine": "Intes", "adrenal": "Adrn"}
COHORTS = {"word": "WORD", "totalsegmentator": "TotalSegmentator", "lits": "LiTS"}
SECTIONS = ("Trained from scratch", "Frozen foundation models", "Finetuned foundation models")
MAJORITY = "Majority class"
PRIOR = "Question-only prior"
#: the canonical-recall reference row (issue 42 item 5; spar.md Section 5: "what we measured in domain
#: was recall of canonical anatomy"): from the in-domain TRAINING data only, MED of each organ's mean
#: position, Perm of each organ in its usual cell, Level 3 from the question plus how the slice is
#: shown (relative position: organ pair + flipped or not; metrics.canonical_answers); Orient blank
CANONICAL = "Canonical recall"
#: Level 1-2 columns of the canonical-recall row and the result columns they read
CANONICAL_LEVELS = {"MED": ("localization", "ref_med"), "MED (native)": ("localization", "ref_med_native"),
                    "Perm": ("permutation", "ref_perm_acc")}
N_ROW = "n="
#: Table 3's frame column: the default 224 frame, then the native slice frame
FRAMES = {"med": "224 px", "med_native": "native px"}
NATIVE_SECTION = " (native slice frame)"
ROW_ORDER = ("CNN-MLP", "CNN-Trans", "ViT-MLP", "ViT-Trans", "ViT-Combined", "RadDINO-MLP", "RadDINO-Trans",
             "BiomedCLIP-MLP", "BiomedCLIP-Trans", "SAM-Med2D-MLP", "SAM-Med2D-Trans")


def _rows(results: SweepResults) -> pd.DataFrame:
    """Encoder configuration rows of the spar stage (chat-model rows excluded)."""
    df = results.summaries("spar")
    if df.empty or "label" not in df:
        return pd.DataFrame(columns=["label", "section", "finding", "eval_dataset", "dataset", "organ", "seed"])
    return df[df["section"].isin(SECTIONS)] if "section" in df else df


# planted calibration backbones (params.PLANTED, ``stage.params.planted``): their rows are shown, never picked as
# the best or worst encoder configuration (Table 2), since their tokens are computed from the answers' masks


def _not_planted(df: pd.DataFrame) -> pd.DataFrame:
    """``df`` without the planted backbones' rows (by the results' ``encoder`` column)."""
    return df[~df["encoder"].isin(PLANTED)] if "encoder" in df else df


def _reference_rows(frame: pd.DataFrame) -> tuple:
    """Index labels of the rows no configuration competes with: Chance, Majority class and the
    planted oracle's (``Oracle-...``); the renderer shows them but never marks them best."""
    if "Model" not in frame:
        return ()
    model = frame["Model"].astype(str)
    planted = tuple(f"{DEFAULT_LABELS[p]}-" for p in PLANTED)
    return tuple(frame.index[model.isin(["Chance", MAJORITY, PRIOR, CANONICAL, N_ROW]) | model.str.startswith(planted)])


def _order(frame: pd.DataFrame) -> pd.DataFrame:
    rank = {s: i for i, s in enumerate(SECTIONS)}
    known = {r: i for i, r in enumerate(ROW_ORDER)}
    key = frame["label"].str.rstrip("\u2020").map(lambda r: known.get(r, len(known)))
    return frame.assign(_s=frame["section"].map(rank), _r=key).sort_values(["_s", "_r", "label"], kind="stable") \
        .drop(columns=["_s", "_r"])


def _means(df: pd.DataFrame, metric: str, column: str, by=("label", "section")) -> pd.DataFrame:
    """Mean over seeds of ``metric`` per configuration, as column ``column``."""
    if df.empty or metric not in df:
        return pd.DataFrame(columns=[*by, column])
    return df.groupby(list(by), sort=False)[metric].mean().rename(column).reset_index()


def _cohort(name: str, in_domain: bool) -> str:
    return f"{COHORTS.get(name, name)} ({'in domain' if in_domain else 'zero-shot'})"


def _level_frame(df: pd.DataFrame) -> pd.DataFrame:
    """Per configuration: MED (224 frame), MED (native), Perm and the Level 3 probes (means over seeds)."""
    overall = df[df["organ"] == "all"]
    loc = overall[overall["finding"] == "localization"]
    parts = [_means(loc, "med", "MED"), _means(loc, "med_native", "MED (native)"),
             _means(overall[overall["finding"] == "permutation"], "perm_acc", "Perm")]
    parts += [_means(overall[overall["finding"] == p], "accuracy", c) for p, c in PROBE_COLUMNS.items()]
    out = None
    for part in parts:
        out = part if out is None else out.merge(part, on=["label", "section"], how="outer")
    return out


def _chance(df: pd.DataFrame, columns, metric: str = "chance") -> dict:
    """Per probe column: its chance (``metric='chance'``: 1 / number of classes, recorded with the
    results), its majority-class rate (``'majority'``: the accuracy of the most frequent training
    label on the scored items) or its question-only prior (``'prior'``), each the mean over the
    rows, which share their items and training labels."""
    out = {}
    for probe, col in PROBE_COLUMNS.items():
        part = df[(df["finding"] == probe) & df[metric].notna()] if metric in df else df.iloc[:0]
        if col in columns and len(part):
            out[col] = float(part[metric].iloc[0]) if metric == "chance" else float(part[metric].mean())
    return out


def _baselines(df: pd.DataFrame, columns, **fields) -> pd.DataFrame:
    """The Chance row (uniform, the paper's 1 / classes) and, beside it, the Majority class row
    (always answering a probe's most frequent training label), which differ where labels are
    imbalanced (organ size, distance), and the Question-only prior row (the most frequent training
    label of the same question), which a head reading the image must beat; each is left out for
    results recorded without it."""
    rows = [{**fields, "label": "Chance", **_chance(df, columns)}]
    for metric, label in (("majority", MAJORITY), ("prior", PRIOR)):
        values = _chance(df, columns, metric)
        if values:
            rows.append({**fields, "label": label, **values})
    canonical = _canonical(df, columns)
    if canonical:
        rows.append({**fields, "label": CANONICAL, **canonical})
    return pd.DataFrame(rows)


def _canonical(df: pd.DataFrame, columns) -> dict:
    """The canonical-recall row's values (:data:`CANONICAL`): Level 3 columns from ``canonical``,
    MED, MED (native) and Perm from the reference columns of the overall Level 1-2 rows (means over
    the rows, which share their training data); only the columns in ``columns`` and results that
    record them."""
    out = {k: v for k, v in _chance(df, columns, "canonical").items() if np.isfinite(v)}
    overall = df[df["organ"] == "all"] if "organ" in df else df
    for col, (finding, metric) in CANONICAL_LEVELS.items():
        part = overall[overall["finding"] == finding]
        if col in columns and metric in part and part[metric].notna().any():
            out[col] = float(part[metric].mean())
    return out


def spar_table1(results: SweepResults) -> list[PaperTable]:
    """Table 1: MED, Perm, RelPos, Orient, Symm per configuration on the in-domain cohort and
    zero-shot on each transfer cohort; Chance and Majority class rows."""
    df = _rows(results)
    frames = []
    for in_domain in (True, False):
        sel = df[(df["eval_dataset"] == df["dataset"]) == in_domain]
        for name, part in sel.groupby("eval_dataset", sort=False):
            cohort = _cohort(name, in_domain)
            table = _order(_level_frame(part))
            table.insert(0, "Cohort", cohort)
            table["section"] = cohort + " / " + table["section"]
            frames.append(pd.concat([table, _baselines(part, ("MED", "MED (native)", "Perm", "RelPos", "Orient",
                                                              "Symm"), Cohort=cohort, section=cohort)],
                                    ignore_index=True))
    cols = ["Cohort", "Section", "Model", "MED", "MED (native)", "Perm", "RelPos", "Orient", "Symm"]
    frame = (pd.concat(frames, ignore_index=True) if frames else pd.DataFrame()) \
        .rename(columns={"section": "Section", "label": "Model"}).reindex(columns=cols)
    frame = frame.reset_index(drop=True)
    return [PaperTable("spar_table1", frame,
                       caption="SPAR Table 1: spatial reasoning, mean over seeds (MED in px of the 224 frame, "
                               "MED (native) in px of the original slice; accuracies as fractions)",
                       best={"MED": "min", "MED (native)": "min", "Perm": "max", "RelPos": "max", "Orient": "max"},
                       group_by="Cohort",
                       unranked=_reference_rows(frame))]


def _per_organ(results: SweepResults, finding: str, metrics: dict, name: str, caption: str, best: str):
    """Per-organ means over seeds in domain. ``metrics`` maps each metric to its block's Frame
    label; with more than one, a ``Frame`` column names the block and every block after the first
    has "(native slice frame)" appended to its sections, so only the first is compared with the
    published values."""
    df = _rows(results)
    df = df[(df["eval_dataset"] == df["dataset"]) & (df["finding"] == finding) & df["organ"].isin(ORGAN_COLUMNS)]
    lead = ["Section", "Model"] + (["Frame"] if len(metrics) > 1 else [])
    blocks = []
    for k, (metric, frame_label) in enumerate(metrics.items()):
        if df.empty or metric not in df:
            continue
        wide = df.groupby(["label", "section", "organ"], sort=False)[metric].mean().unstack("organ").reset_index()
        wide = _order(wide)
        if f"ref_{metric}" in df and df[f"ref_{metric}"].notna().any():  # the canonical-recall row (CANONICAL)
            ref = df.groupby("organ", sort=False)[f"ref_{metric}"].mean()
            wide = pd.concat([wide, pd.DataFrame([{"label": CANONICAL, "section": "", **ref.to_dict()}])],
                             ignore_index=True)
        wide = wide.rename(columns={"section": "Section", "label": "Model", **ORGAN_COLUMNS})
        wide["Model"] = wide["Model"].str.replace("-Combined", "-Comb", regex=False)
        if k:
            wide["Section"] = wide["Section"] + NATIVE_SECTION
        blocks.append(wide.assign(Frame=frame_label))
    frame = (pd.concat(blocks, ignore_index=True) if blocks else pd.DataFrame()) \
        .reindex(columns=[*lead, *ORGAN_COLUMNS.values()]).reset_index(drop=True)
    return [PaperTable(name, frame, caption=caption, best={c: best for c in ORGAN_COLUMNS.values()},
                       group_by="Frame" if "Frame" in lead else None, unranked=_reference_rows(frame))]


def spar_table3(results: SweepResults) -> list[PaperTable]:
    """Table 3: per-organ localization error (MED, px) in domain, in the 224 frame and, below it,
    in the native slice frame (``Frame``)."""
    return _per_organ(results, "localization", FRAMES, "spar_table3",
                      "SPAR Table 3: per-organ localization error (MED, px, mean over seeds; 224 frame, then the "
                      "native slice frame)", "min")


def spar_table4(results: SweepResults) -> list[PaperTable]:
    """Table 4: per-organ permutation patch accuracy in domain."""
    return _per_organ(results, "permutation", {"patch_acc": ""}, "spar_table4",
                      "SPAR Table 4: per-organ patch accuracy (fraction, mean over seeds)", "max")


def spar_table5(results: SweepResults) -> list[PaperTable]:
    """Table 5: zero-shot Level 3 probes on the transfer cohorts; Chance and Majority class rows."""
    df = _rows(results)
    df = df[(df["eval_dataset"] != df["dataset"]) & (df["organ"] == "all")]
    cols = ["Section", "Model", *PROBE_COLUMNS.values()]
    if df.empty:
        frame = pd.DataFrame(columns=cols)
    else:
        table = _order(_level_frame(df)).drop(columns=["MED", "MED (native)", "Perm"])
        table["label"] = table["label"].str.replace("-Combined", "-Comb", regex=False)
        frame = pd.concat([table, _baselines(df, PROBE_COLUMNS.values(), section="")], ignore_index=True) \
            .rename(columns={"section": "Section", "label": "Model"}).reindex(columns=cols)
    return [PaperTable("spar_table5", frame.reset_index(drop=True),
                       caption="SPAR Table 5: zero-shot transfer, Level 3 probes (fraction, mean over seeds)")]


def spar_table2(results: SweepResults) -> list[PaperTable]:
    """Table 2: SPAR-VQA accuracy per probe and macro (mean and std over seeds) per chat model,
    the best and worst encoder configuration (by macro over the five probes, in domain; planted
    backbones, :data:`PLANTED`, left out of the pick), Chance and Majority class (of the chat
    models' items)."""
    df = results.summaries("spar")
    cols = ["Macro", *PROBE_COLUMNS.values()]
    rows = []
    if not df.empty and "section" in df:
        vqa = df[(df["section"] == "MLLM") & df["finding"].isin(PROBE_COLUMNS)]
        for label, part in vqa.groupby("label", sort=False):
            per_seed = part.pivot_table(index="seed", columns="finding", values="accuracy")
            per_seed = per_seed.rename(columns=PROBE_COLUMNS)
            per_seed["Macro"] = per_seed[[c for c in PROBE_COLUMNS.values() if c in per_seed]].mean(axis=1)
            row = {"Section": "MLLM", "Model": label}
            for c in cols:
                if c in per_seed:
                    row[c], row[f"{c}_sd"] = per_seed[c].mean(), per_seed[c].std(ddof=1) if len(per_seed) > 1 else 0.0
            rows.append(row)
        enc = _rows(results)
        enc = enc[(enc["eval_dataset"] == enc["dataset"]) & (enc["organ"] == "all")]
        candidates = _not_planted(enc)  # the planted oracle is a calibration reference, not an encoder
        if not candidates.empty:
            frame = _level_frame(candidates)
            probes = [c for c in PROBE_COLUMNS.values() if c in frame]
            frame["Macro"] = frame[probes].mean(axis=1)
            frame = frame.dropna(subset=["Macro"])
            if len(frame):
                best, worst = frame.loc[frame["Macro"].idxmax()], frame.loc[frame["Macro"].idxmin()]
                for tag, r in (("best", best), ("worst", worst)):
                    rows.append({"Section": "encoder reference (from Table 1 configurations)",
                                 "Model": f"{r['label']} ({tag} enc.)", **{c: r[c] for c in ["Macro", *probes]}})
        base = vqa if len(vqa) else enc  # the reference rows and n of the items the chat models answered
        if _chance(base, PROBE_COLUMNS.values()):
            rows += [{"Section": "", "Model": r.pop("label"), **r}
                     for r in _baselines(base, PROBE_COLUMNS.values()).to_dict("records")]
        counts = _item_counts(base)
        if counts:
            rows.insert(0, {"Section": "", "Model": N_ROW, **counts})
    order = ["Section", "Model"] + [x for c in cols for x in (c, f"{c}_sd")]
    frame = pd.DataFrame(rows).reindex(columns=order).reset_index(drop=True)
    return [PaperTable("spar_table2", frame,
                       caption="SPAR Table 2: SPAR-VQA accuracy (fraction; mean and std over seeds); n= items "
                               "per probe",
                       best={c: "max" for c in cols}, unranked=_reference_rows(frame))]


def _item_counts(df: pd.DataFrame) -> dict:
    """Table 2's ``n=`` row: items per probe column, the mean of ``n`` over the rows (a chat
    model's seeds each draw the same number of items; the encoder rows all score the same test
    split), and for Macro the sum over the probes shown. spar.md Table 2 prints "(n=1162)" under
    each probe's header."""
    if "n" not in df:
        return {}
    out = {col: float(df.loc[df["finding"] == probe, "n"].mean()) for probe, col in PROBE_COLUMNS.items()
           if (df["finding"] == probe).any()}
    if out:
        out["Macro"] = float(sum(out.values()))
    return out

