"""SPAR-Bench tables (spar.md Tables 1-5) from the ``spar`` stage's results, with the published
row labels (``CNN-MLP``, ``RadDINO-Trans†``, ``Chance``), sections and column headers, accuracies
as fractions and MED in pixels, each the mean over seeds (Table 2 also the std, ``<col>_sd``)."""
from __future__ import annotations

import pandas as pd

from ...core.tables import PaperTable, SweepResults
from .params import DEFAULT_LABELS, ORACLE

TABLES = ["spar_table1", "spar_table2", "spar_table3", "spar_table4", "spar_table5"]

PROBE_COLUMNS = {"relative_position": "RelPos", "orientation": "Orient", "kidney_symmetry": "Symm",
                 "liver_size": "Size", "distance_compare": "Dist"}
ORGAN_COLUMNS = {"liver": "Liver", "spleen": "Spln", "left_kidney": "K-L", "right_kidney": "K-R", "stomach": "Stom",
                 "gallbladder": "GB", "esophagus": "Esph", "pancreas": "Panc", "duodenum": "Duod", "colon": "Colon",
                 "intestine": "Intes", "adrenal": "Adrn"}
COHORTS = {"word": "WORD", "totalsegmentator": "TotalSegmentator", "lits": "LiTS"}
SECTIONS = ("Trained from scratch", "Frozen foundation models", "Finetuned foundation models")
MAJORITY = "Majority class"
ROW_ORDER = ("CNN-MLP", "CNN-Trans", "ViT-MLP", "ViT-Trans", "ViT-Combined", "RadDINO-MLP", "RadDINO-Trans",
             "BiomedCLIP-MLP", "BiomedCLIP-Trans", "SAM-Med2D-MLP", "SAM-Med2D-Trans")


def _rows(results: SweepResults) -> pd.DataFrame:
    """Encoder configuration rows of the spar stage (chat-model rows excluded)."""
    df = results.summaries("spar")
    if df.empty or "label" not in df:
        return pd.DataFrame(columns=["label", "section", "finding", "eval_dataset", "dataset", "organ", "seed"])
    return df[df["section"].isin(SECTIONS)] if "section" in df else df


#: planted calibration backbones (``stage.params.planted``): their rows are shown, never picked as the best
#: or worst encoder configuration (Table 2), since their tokens are computed from the answers' masks
PLANTED = (ORACLE,)


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
    return tuple(frame.index[model.isin(["Chance", MAJORITY]) | model.str.startswith(planted)])


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
    """Per configuration: MED, Perm and the three Table 1 probes (means over seeds)."""
    overall = df[df["organ"] == "all"]
    parts = [_means(overall[overall["finding"] == "localization"], "med", "MED"),
             _means(overall[overall["finding"] == "permutation"], "perm_acc", "Perm")]
    parts += [_means(overall[overall["finding"] == p], "accuracy", c) for p, c in PROBE_COLUMNS.items()]
    out = None
    for part in parts:
        out = part if out is None else out.merge(part, on=["label", "section"], how="outer")
    return out


def _chance(df: pd.DataFrame, columns, metric: str = "chance") -> dict:
    """Per probe column: its chance (``metric='chance'``: 1 / number of classes, recorded with the
    results) or its majority-class rate (``'majority'``: the share of the most frequent label
    among the scored items, the mean over the rows, which share their items)."""
    out = {}
    for probe, col in PROBE_COLUMNS.items():
        part = df[(df["finding"] == probe) & df[metric].notna()] if metric in df else df.iloc[:0]
        if col in columns and len(part):
            out[col] = float(part[metric].iloc[0]) if metric == "chance" else float(part[metric].mean())
    return out


def _baselines(df: pd.DataFrame, columns, **fields) -> pd.DataFrame:
    """The Chance row (uniform, the paper's 1 / classes) and, beside it, the Majority class row
    (always answering a probe's most frequent label), which differ where labels are imbalanced
    (organ size, distance); the second is left out for results recorded without it."""
    rows = [{**fields, "label": "Chance", **_chance(df, columns)}]
    majority = _chance(df, columns, "majority")
    if majority:
        rows.append({**fields, "label": MAJORITY, **majority})
    return pd.DataFrame(rows)


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
            frames.append(pd.concat([table, _baselines(part, ("RelPos", "Orient", "Symm"), Cohort=cohort,
                                                       section=cohort)], ignore_index=True))
    cols = ["Cohort", "Section", "Model", "MED", "Perm", "RelPos", "Orient", "Symm"]
    frame = (pd.concat(frames, ignore_index=True) if frames else pd.DataFrame()) \
        .rename(columns={"section": "Section", "label": "Model"}).reindex(columns=cols)
    frame = frame.reset_index(drop=True)
    return [PaperTable("spar_table1", frame,
                       caption="SPAR Table 1: spatial reasoning, mean over seeds (MED px; accuracies as fractions)",
                       best={"MED": "min", "Perm": "max", "RelPos": "max", "Orient": "max"}, group_by="Cohort",
                       unranked=_reference_rows(frame))]


def _per_organ(results: SweepResults, finding: str, metric: str, name: str, caption: str, best: str):
    df = _rows(results)
    df = df[(df["eval_dataset"] == df["dataset"]) & (df["finding"] == finding) & df["organ"].isin(ORGAN_COLUMNS)]
    if df.empty:
        frame = pd.DataFrame(columns=["Section", "Model", *ORGAN_COLUMNS.values()])
    else:
        wide = df.groupby(["label", "section", "organ"], sort=False)[metric].mean().unstack("organ").reset_index()
        wide = _order(wide).rename(columns={"section": "Section", "label": "Model", **ORGAN_COLUMNS})
        wide["Model"] = wide["Model"].str.replace("-Combined", "-Comb", regex=False)
        frame = wide.reindex(columns=["Section", "Model", *ORGAN_COLUMNS.values()])
    frame = frame.reset_index(drop=True)
    return [PaperTable(name, frame, caption=caption, best={c: best for c in ORGAN_COLUMNS.values()},
                       unranked=_reference_rows(frame))]


def spar_table3(results: SweepResults) -> list[PaperTable]:
    """Table 3: per-organ localization error (MED, px) in domain."""
    return _per_organ(results, "localization", "med", "spar_table3",
                      "SPAR Table 3: per-organ localization error (MED, px, mean over seeds)", "min")


def spar_table4(results: SweepResults) -> list[PaperTable]:
    """Table 4: per-organ permutation patch accuracy in domain."""
    return _per_organ(results, "permutation", "patch_acc", "spar_table4",
                      "SPAR Table 4: per-organ patch accuracy (fraction, mean over seeds)", "max")


def spar_table5(results: SweepResults) -> list[PaperTable]:
    """Table 5: zero-shot Level 3 probes on the transfer cohorts; Chance and Majority class rows."""
    df = _rows(results)
    df = df[(df["eval_dataset"] != df["dataset"]) & (df["organ"] == "all")]
    cols = ["Section", "Model", *PROBE_COLUMNS.values()]
    if df.empty:
        frame = pd.DataFrame(columns=cols)
    else:
        table = _order(_level_frame(df)).drop(columns=["MED", "Perm"])
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
        base = vqa if len(vqa) else enc  # the majority class of the items the chat models answered
        if _chance(base, PROBE_COLUMNS.values()):
            rows += [{"Section": "", "Model": r.pop("label"), **r}
                     for r in _baselines(base, PROBE_COLUMNS.values()).to_dict("records")]
    order = ["Section", "Model"] + [x for c in cols for x in (c, f"{c}_sd")]
    frame = pd.DataFrame(rows).reindex(columns=order)
    return [PaperTable("spar_table2", frame.reset_index(drop=True),
                       caption="SPAR Table 2: SPAR-VQA accuracy (fraction; mean and std over seeds)",
                       best={c: "max" for c in cols})]

