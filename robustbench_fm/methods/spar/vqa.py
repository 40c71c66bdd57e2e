"""SPAR-VQA (spar.md Section 3.3, Table 2): the Level 3 questions posed in natural language to
open-weight image-text chat models through transformers.

Each probe has several templates that ask the same question in different words; one is drawn
per item with the seed. Answer options keep a fixed order (as in the paper). A parser per probe
maps the free-text reply to a class (:func:`parse_answer`: the earliest option mention that is
not negated, percentages for organ size), and a reply naming no option counts as wrong. Sides
follow one convention in prompts, labels and parser: the patient's ("left kidney" is the
patient's left), read from the image as shown in the radiological convention (patient's left on
the image's right; ``probes.relative_position_label``). Items are a seeded resample of the test
split's questions (the paper's counts by default; counting is omitted).
"""
from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pandas as pd

from ...core import errors
from . import metrics
from .probes import LIVER_SIZE_BINS
from .samples import SparSamples, apply_transform


@dataclass(frozen=True)
class ChatModel:
    name: str
    hub_id: str
    display: str


#: Open-weight chat models of Table 2 (hub ids; weights come from the local Hugging Face cache).
MODELS = {m.name: m for m in (
    ChatModel("llava_1_5_7b", "llava-hf/llava-1.5-7b-hf", "LLaVA-1.5-7B"),
    ChatModel("qwen2_vl_2b", "Qwen/Qwen2-VL-2B-Instruct", "Qwen2-VL-2B-Instruct"),
    ChatModel("qwen2_vl_7b", "Qwen/Qwen2-VL-7B-Instruct", "Qwen2-VL-7B-Instruct"),
    ChatModel("medgemma_4b", "google/medgemma-4b-it", "MedGemma-4B-IT"),
)}

#: Items per probe in the paper (spar.md Section 3.3).
PAPER_ITEMS = {"relative_position": 1162, "orientation": 1050, "kidney_symmetry": 444, "liver_size": 712,
               "distance_compare": 170}

_ORIENT = "original, horizontally flipped, vertically flipped, rotated 90 degrees, or rotated 180 degrees"
#: The side convention every side word of the prompts, labels and parser follows: sides are the
#: patient's ("left kidney" is the patient's left kidney), read from the image as shown in the
#: radiological convention (``data.ct.volumes``: the patient's left on the image's right).
_CONVENTION = "radiological convention: the patient's left is on the image's right"
TEMPLATES: dict[str, tuple[str, ...]] = {
    "relative_position": (
        (f"In this axial CT slice ({_CONVENTION}), is the {{a}} on the patient's left or right of the {{b}}? "
         "Answer left or right."),
        (f"Reading this CT image as shown ({_CONVENTION}), does the {{a}} lie to the patient's left or right "
         "of the {b}? Reply with left or right."),
        f"On this CT image ({_CONVENTION}), where is the {{a}} relative to the {{b}}: patient's left or right?",
    ),
    "orientation": (
        f"Is this axial CT slice shown in its {_ORIENT}? Answer with one of these.",
        f"How has this CT image been transformed? Options: {_ORIENT}.",
        f"Which describes the orientation of this abdominal CT slice: {_ORIENT}?",
    ),
    "kidney_symmetry": (
        (f"Compare the two kidneys in this CT slice ({_CONVENTION}). Are they symmetric, is the patient's left "
         "kidney larger, or is the right kidney larger? Answer symmetric, left larger or right larger."),
        (f"In this axial CT image ({_CONVENTION}), which kidney has the larger cross-section: are they "
         "symmetric, left larger, or right larger?"),
        f"Judge the kidney sizes on this slice ({_CONVENTION}): symmetric, left larger, or right larger?",
    ),
    "liver_size": (
        ("What fraction of this CT slice does the liver occupy? A) less than 10%, B) between 10% and 20%, "
         "C) more than 20%. Answer A, B or C."),
        ("How much of the image area is liver? Options: A) less than 10%, B) between 10% and 20%, "
         "C) more than 20%."),
        ("Estimate the liver's share of this axial slice: A) less than 10%, B) between 10% and 20%, "
         "C) more than 20%."),
    ),
    "distance_compare": (
        ("In this CT slice, is the distance between the {a} and the {b} greater or less than the distance "
         "between the {c} and the {d}? Answer greater or less."),
        "Compare distances on this image: is {a} to {b} greater or less than {c} to {d}?",
        "Is the {a}-{b} distance greater or less than the {c}-{d} distance in this axial CT image?",
    ),
    "tumour_count": (
        "How many liver tumours are visible in this CT slice: 0, 1, or 2 or more?",
        "Count the tumours in the liver on this image. Answer 0, 1, or 2 or more.",
        "Number of liver tumour instances on this axial slice (0, 1, or 2 or more)?",
    ),
}


def _letter(x: str) -> str:
    """A multiple-choice letter given alone, after a colon or after 'answer'/'option' ("A",
    "B)", "Answer: C", "... 10%: B"), not the article in "A large part" (a letter then a word)."""
    return rf"(?:^|:\s*|\b(?:answer|option)\W*(?:is\W*)?)(?P<opt>\(?{x}\b)(?![ \t]*[a-z])"


_IMAGE_SIDE = r"(?:(?:image|viewer|screen)(?:'s)? {s}|{s}(?: hand)? side of the (?:image|screen))"
_COMPARE = r"\b{s}\b[^.;,:]*?\b{c}\b"
#: Per probe, the regular expressions of each class (in label order). A reply's class is that of
#: its earliest match that is not negated; of matches starting at the same place the longest
#: (most specific) wins, so "right kidney is smaller" beats the bare "right".
ANSWER_PATTERNS: dict[str, tuple[tuple[str, ...], ...]] = {
    "relative_position": (  # the patient's side; an image side is converted (radiological convention)
        (r"\bleft\b", _IMAGE_SIDE.format(s="right")),
        (r"\bright\b", _IMAGE_SIDE.format(s="left")),
    ),
    "orientation": (
        (r"\b(original|normal|standard|unchanged|not (been )?transformed|no transformation)\b",),
        (r"\bhorizontal(ly)?\b", r"\b(left-right|mirrored left to right)\b"),
        (r"\bvertical(ly)?\b", r"\b(up-down|upside-down flip|top-bottom)\b"),
        (r"\b90\b|\bninety\b|\bquarter turn\b",),
        (r"\b180\b|\bhalf turn\b",),
    ),
    "kidney_symmetry": (
        (r"\b(symmetric(al)?|equal( in size)?|same size|similar( in size| size)?)\b",),
        (r"\bleft\b", _COMPARE.format(s="left", c="(larger|bigger|greater)"),
         _COMPARE.format(s="right", c="smaller")),
        (r"\bright\b", _COMPARE.format(s="right", c="(larger|bigger|greater)"),
         _COMPARE.format(s="left", c="smaller")),
    ),
    "liver_size": (
        (_letter("a"), r"\b(less than|under|below|fewer than) 10\b", r"<\s*10\b"),
        (_letter("b"), r"\bbetween 10\b", r"\b10\s*(%|percent)?\s*(-|to|and)\s*20\b"),
        (_letter("c"), r"\b(more than|over|above|greater than) 20\b", r">\s*20\b"),
    ),
    "distance_compare": (
        (r"\b(less|smaller|shorter|closer)\b",),
        (r"\b(greater|larger|longer|farther|further|more)\b",),
    ),
    "tumour_count": (
        (r"\b(0|zero|none)\b", r"\bno (visible |liver )?(tumou?rs?|lesions?)\b"),
        (r"\b(1|one|single|a single)\b",),
        (r"\b(2|two|[3-9]|\d{2,}|three|four|five|several|multiple|many)\b",),
    ),
}
#: A percentage in a liver-size reply ("About 15%"): classified by the label's own bins
#: (probes.liver_size_class: < 10% -> 0, 10-20% -> 1, > 20% -> 2).
_PERCENT = re.compile(r"(\d+(?:\.\d+)?)\s*(%|percent\b|per cent\b)")
#: Words that negate what follows them in the same clause ("not symmetric", "isn't left").
_NEGATION = re.compile(r"n't\b|\b(not|no|never|neither|nor|cannot|without)\b")
#: Clause boundaries: a negation reaches no further than these.
_CLAUSE = re.compile(r"[;:.!?,\n]|\b(but|while|whereas|however|although|though|rather|instead)\b")
#: Organ names carrying a side word, masked in relative-position replies so that "the left kidney
#: is on the right" is read as 'right' (the side word of the name is not an answer).
_SIDED_ORGANS = re.compile(r"\b(left|right) (kidney|adrenal( gland)?|femur|femoral head)s?\b"
                           r"|\bhead of (the )?femur (left|right)\b|\b(kidney|femur) (left|right)\b")


def _negated(text: str, start: int) -> bool:
    """Whether a negation word precedes ``start`` within its clause."""
    clause = max((m.end() for m in _CLAUSE.finditer(text, 0, start)), default=0)
    return _NEGATION.search(text, clause, start) is not None


def parse_answer(probe: str, reply: str) -> int:
    """The class a free-text ``reply`` names for ``probe``, -1 if none (scored as wrong).

    The earliest option mention that is not negated wins (ties: the longest match). A negated
    mention ("not symmetric; right larger") is skipped; a two-answer probe whose reply only
    negates one answer ("not on the left") gets the other. Liver-size replies may give a
    percentage ("About 15%"), classified by the label's bins. Relative-position replies are read
    with side words in organ names masked and image sides converted to the patient's (the
    convention of the prompts and labels, :data:`_CONVENTION`).
    """
    if probe not in ANSWER_PATTERNS:
        raise ValueError(f"unknown SPAR probe {probe!r}; use one of {', '.join(ANSWER_PATTERNS)}")
    text = " ".join(reply.strip().lower().replace("\u2019", "'").split())
    if probe == "relative_position":
        text = _SIDED_ORGANS.sub(lambda m: "organ".ljust(len(m.group(0))), text)
    found = [(_start(m), -(m.end() - m.start()), cls) for cls, patterns in enumerate(ANSWER_PATTERNS[probe])
             for pattern in patterns for m in re.finditer(pattern, text)]
    if probe == "liver_size":
        found += [(m.start(), -(m.end() - m.start()), _percent_class(float(m.group(1))))
                  for m in _PERCENT.finditer(text)]
    kept = sorted(f for f in found if not _negated(text, f[0]))
    if kept:
        return kept[0][2]
    negated = {cls for _, _, cls in found}
    if len(ANSWER_PATTERNS[probe]) == 2 and len(negated) == 1:
        return 1 - negated.pop()
    return -1


def _start(m: re.Match) -> int:
    """Where an option mention starts: its ``opt`` group when the pattern has one (a letter
    after "Answer:"), else the whole match."""
    return m.start("opt") if "opt" in m.re.groupindex else m.start()


def _percent_class(value: float) -> int:
    """Liver-size class of a percentage (probes.liver_size_class on value / 100)."""
    return 0 if value < 100 * LIVER_SIZE_BINS[0] else 2 if value > 100 * LIVER_SIZE_BINS[1] else 1


def _organ(name: str) -> str:
    return name.replace("_", " ")


def render_questions(questions: pd.DataFrame, rng: np.random.Generator) -> list[str]:
    """One prompt per question: a template drawn uniformly per item, organs filled in."""
    out = []
    for row in questions.itertuples(index=False):
        template = TEMPLATES[row.probe][int(rng.integers(len(TEMPLATES[row.probe])))]
        out.append(template.format(a=_organ(row.organ_a), b=_organ(row.organ_b), c=_organ(row.organ_c),
                                   d=_organ(row.organ_d)))
    return out


def select_items(questions: pd.DataFrame, n_items: dict, rng: np.random.Generator) -> pd.DataFrame:
    """A seeded resample (without replacement, at most what exists) of the test questions, per probe."""
    test = questions[questions["split"] == "test"]
    parts = []
    for probe, n in n_items.items():
        pool = test[test["probe"] == probe]
        parts.append(pool.iloc[np.sort(rng.choice(len(pool), size=min(int(n), len(pool)), replace=False))])
    return pd.concat(parts, ignore_index=True) if parts else test.iloc[:0]


class ChatBackend:
    """An image-text chat model through transformers (``AutoProcessor`` + ``AutoModelForImageTextToText``)
    from a hub id (local cache when offline) or a local folder; greedy decoding."""

    def __init__(self, source: str, device="auto", dtype: str | None = None):
        import torch
        from transformers import AutoModelForImageTextToText, AutoProcessor

        from ...core.devices import resolve_device  # lazy: imports torch

        self.device = resolve_device(device)
        torch_dtype = getattr(torch, dtype) if dtype else (torch.bfloat16 if self.device.type == "cuda"
                                                           else torch.float32)
        try:
            self.processor = AutoProcessor.from_pretrained(source)
            self.model = AutoModelForImageTextToText.from_pretrained(source, dtype=torch_dtype).to(self.device).eval()
        except OSError as err:
            raise errors.UserError(f"chat model '{source}' is not available locally ({type(err).__name__}); "
                                   "download it into the Hugging Face cache (gated models need an accepted "
                                   "licence and HF_TOKEN) or pass stage.params.vqa.weights=<folder>") from None
        tokenizer = getattr(self.processor, "tokenizer", None)
        if tokenizer is not None:
            tokenizer.padding_side = "left"

    def answer(self, images, prompts: list[str], max_new_tokens: int = 16) -> list[str]:
        """Greedy replies to (image, prompt) pairs, one chat turn each."""
        import torch

        texts = [self.processor.apply_chat_template(
            [{"role": "user", "content": [{"type": "image"}, {"type": "text", "text": p}]}],
            add_generation_prompt=True) for p in prompts]
        inputs = self.processor(images=list(images), text=texts, return_tensors="pt", padding=True).to(self.device)
        with torch.inference_mode():
            out = self.model.generate(**inputs, max_new_tokens=max_new_tokens, do_sample=False)
        return self.processor.batch_decode(out[:, inputs["input_ids"].shape[1]:], skip_special_tokens=True)


def run_vqa(model: str, samples: SparSamples, seeds=(42, 123, 1234), device="auto", n_items: dict | None = None,
            max_new_tokens: int = 16, batch_size: int = 8, weights: dict | None = None,
            dtype: str | None = None) -> pd.DataFrame:
    """Accuracy per probe and macro for one chat model (registry name, hub id or local folder)
    per seed; each seed resamples the items and the phrasings (spar.md Table 2)."""
    from PIL import Image

    entry = MODELS.get(model)
    source = (weights or {}).get(model) or (entry.hub_id if entry else model)
    if entry is None and not Path(source).is_dir():
        raise ValueError(f"unknown chat model '{model}'; use one of {', '.join(MODELS)} or a local folder")
    display = entry.display if entry else Path(source).name
    backend = ChatBackend(str(source), device=device, dtype=dtype)
    rows = []
    for seed in seeds:
        rng = np.random.default_rng(seed)
        items = select_items(samples.questions, n_items or PAPER_ITEMS, rng)
        prompts = render_questions(items, rng)
        replies = []
        for start in range(0, len(items), batch_size):
            part = items.iloc[start:start + batch_size]
            images = [Image.fromarray(np.ascontiguousarray(apply_transform(np.asarray(samples.slices[r]), t)))
                      .convert("RGB") for r, t in zip(part["slice_row"], part["transform"])]
            replies += backend.answer(images, prompts[start:start + batch_size], max_new_tokens)
        pred = np.array([parse_answer(p, r) for p, r in zip(items["probe"], replies)])
        probes = items["probe"].to_numpy()
        train = samples.questions[samples.questions["split"] == "train"]
        ref = metrics.reference_answers(train, items) if len(train) else (None, None)
        for r in metrics.probe_rows(pred, items["label"].to_numpy(), probes, items["n_classes"].to_numpy(), *ref):
            sel = probes == r["finding"] if r["finding"] != "macro" else np.ones(len(probes), bool)
            rows.append({"label": display, "section": "MLLM", "model": model, "head": "chat", "mode": "vqa",
                         "organ": "all", "eval_dataset": "", "seed": seed, **r,
                         "unparsed": float((pred[sel] < 0).mean()) if sel.any() else float("nan")})
    return pd.DataFrame(rows)
