"""SPAR-VQA (spar.md Section 3.3, Table 2): the Level 3 questions posed in natural language to
open-weight image-text chat models through transformers.

Each probe has several templates that ask the same question in different words; one is drawn
per item with the seed. Answer options keep a fixed order (as in the paper). A parser per probe
maps the free-text reply to a class: the option whose keyword appears first in the reply wins,
and a reply naming no option counts as wrong. Items are a seeded resample of the test split's
questions (the paper's counts by default; counting is omitted).
"""
from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pandas as pd

from ...core import errors
from . import metrics
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
TEMPLATES: dict[str, tuple[str, ...]] = {
    "relative_position": (
        "In this axial CT slice, is the {a} to the left or to the right of the {b}? Answer left or right.",
        "Looking at the image as shown, does the {a} appear left or right of the {b}? Reply with left or right.",
        "On this CT image, where is the {a} relative to the {b}: left or right?",
    ),
    "orientation": (
        f"Is this axial CT slice shown in its {_ORIENT}? Answer with one of these.",
        f"How has this CT image been transformed? Options: {_ORIENT}.",
        f"Which describes the orientation of this abdominal CT slice: {_ORIENT}?",
    ),
    "kidney_symmetry": (
        ("Compare the two kidneys in this CT slice. Are they symmetric, is the left kidney larger, or is the "
         "right kidney larger? Answer symmetric, left larger or right larger."),
        ("In this axial CT image, which kidney has the larger cross-section: are they symmetric, left larger, "
         "or right larger?"),
        "Judge the kidney sizes on this slice: symmetric, left larger, or right larger?",
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

#: Per probe, a regular expression per class (in label order); the earliest match in a reply wins.
ANSWER_PATTERNS: dict[str, tuple[str, ...]] = {
    "relative_position": (r"\bleft\b", r"\bright\b"),
    "orientation": (r"\b(original|normal|standard|unchanged|not (been )?transformed)\b",
                    r"\bhorizontal(ly)?\b", r"\bvertical(ly)?\b", r"\b90\b|\bninety\b", r"\b180\b"),
    "kidney_symmetry": (r"\b(symmetric(al)?|equal|same size|similar)\b", r"\bleft\b", r"\bright\b"),
    "liver_size": (r"^\W*a\b|\bless than 10|\b(under|below) 10",
                   r"^\W*b\b|\bbetween 10|\b10\s*(%|percent)?\s*(-|to|and)\s*20",
                   r"^\W*c\b|\bmore than 20|\b(over|above) 20"),
    "distance_compare": (r"\b(less|smaller|shorter|closer)\b", r"\b(greater|larger|longer|farther|further|more)\b"),
    "tumour_count": (r"\b(0|zero|no|none)\b", r"\b(1|one|single)\b", r"\b(2|two|[3-9]|three|several|multiple)\b"),
}


def parse_answer(probe: str, reply: str) -> int:
    """The class a free-text ``reply`` names for ``probe`` (earliest matching option), -1 if none."""
    text = reply.strip().lower()
    first, best = len(text) + 1, -1
    for cls, pattern in enumerate(ANSWER_PATTERNS[probe]):
        m = re.search(pattern, text)
        if m and m.start() < first:
            first, best = m.start(), cls
    return best


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
        acc = metrics.probe_accuracy(pred, items["label"].to_numpy(), probes)
        n_cls = dict(zip(probes, items["n_classes"]))
        for probe, value in acc.items():
            sel = probes == probe if probe != "macro" else np.ones(len(probes), bool)
            rows.append({"label": display, "section": "MLLM", "model": model, "head": "chat", "mode": "vqa",
                         "finding": probe, "organ": "all",
                         "eval_dataset": "", "seed": seed, "accuracy": value, "n": int(sel.sum()),
                         "unparsed": float((pred[sel] < 0).mean()) if sel.any() else float("nan"),
                         "chance": metrics.chance(int(n_cls[probe])) if probe != "macro"
                         else float(np.mean([metrics.chance(int(c)) for c in n_cls.values()]))})
    return pd.DataFrame(rows)
