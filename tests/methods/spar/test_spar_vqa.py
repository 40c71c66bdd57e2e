"""SPAR-VQA (spar.md Section 3.3, Table 2): templates, answer parsers and a tiny random-weight
chat model built locally and run through the same transformers backend as a hub id."""
import numpy as np
import pandas as pd
import pytest

from robustbench_fm.methods.spar import vqa
from robustbench_fm.methods.spar.samples import SparSamples


@pytest.mark.parametrize("probe, reply, want", [
    ("relative_position", "Left.", 0), ("relative_position", "It is to the right of it", 1),
    ("relative_position", "I cannot tell", -1),
    ("orientation", "The image is horizontally flipped", 1), ("orientation", "Rotated 90 degrees.", 3),
    ("orientation", "rotated 180", 4), ("orientation", "Original orientation", 0), ("orientation", "vertical", 2),
    ("kidney_symmetry", "Symmetric", 0), ("kidney_symmetry", "left larger", 1),
    ("kidney_symmetry", "The right kidney is larger than the left", 2),
    ("liver_size", "B", 1), ("liver_size", "C) more than 20%", 2), ("liver_size", "less than 10%", 0),
    ("distance_compare", "Greater", 1), ("distance_compare", "less", 0),
    ("tumour_count", "2 or more", 2), ("tumour_count", "None", 0), ("tumour_count", "one tumour", 1),
])
def test_parser_per_probe(probe, reply, want):
    assert vqa.parse_answer(probe, reply) == want


@pytest.mark.parametrize("probe, reply, want", [
    # relative position: patient sides; side words of organ names are not answers; image sides converted
    ("relative_position", "The left kidney lies to the right of the liver.", 1),
    ("relative_position", "It is not on the left.", 1), ("relative_position", "Not right; left.", 0),
    ("relative_position", "On the right side of the image", 0), ("relative_position", "image left", 1),
    ("relative_position", "The head of femur right is left of it", 0),
    # orientation: a negated option is skipped
    ("orientation", "It is not horizontally flipped, it is vertically flipped", 2),
    ("orientation", "Not rotated 90 degrees; rotated 180 degrees", 4),
    ("orientation", "The image has not been transformed", 0), ("orientation", "It isn't original.", -1),
    # symmetry: negation and comparatives
    ("kidney_symmetry", "not symmetric; right larger", 2), ("kidney_symmetry", "Not symmetric, left larger", 1),
    ("kidney_symmetry", "The left kidney is smaller than the right", 2),
    ("kidney_symmetry", "The right kidney is smaller", 1), ("kidney_symmetry", "They are the same size.", 0),
    ("kidney_symmetry", "The kidneys are asymmetric", -1),
    ("kidney_symmetry", "The left kidney is larger, not the right", 1),
    # organ size: percentages by the label's bins, letters only as answers
    ("liver_size", "About 15%", 1), ("liver_size", "approximately 25 percent", 2), ("liver_size", "5%", 0),
    ("liver_size", "10%", 1), ("liver_size", "20.5%", 2), ("liver_size", "The answer is (C).", 2),
    ("liver_size", "A large part of the slice, about 8%", 0), ("liver_size", "Not less than 10%: B", 1),
    # distance: a negated comparative of a two-answer probe gives the other answer
    ("distance_compare", "It is not greater", 0), ("distance_compare", "No, it is shorter.", 0),
    ("distance_compare", "The first distance is larger", 1),
    # counting
    ("tumour_count", "There are no tumours.", 0), ("tumour_count", "Not one, there are two", 2),
    ("tumour_count", "12 lesions", 2), ("tumour_count", "A single tumour", 1),
])
def test_parser_negations_numbers_and_sides(probe, reply, want):
    assert vqa.parse_answer(probe, reply) == want


def test_labels_prompts_and_parser_share_the_patient_side_convention():
    """Radiological display (data.ct.volumes): the liver (patient right) sits on the image left,
    the spleen (patient left) on the image right. Asked "is the liver on the patient's left or
    right of the spleen?", the label is 'right' (1) and so is the parsed truthful reply; the
    horizontally flipped view flips both. The left kidney (larger area) is 'left larger'."""
    from robustbench_fm.methods.spar import probes

    liver, spleen = np.array([0.3, 0.4]), np.array([0.75, 0.4])
    assert probes.relative_position_label(liver, spleen) == 1 == vqa.parse_answer(
        "relative_position", "The liver is on the patient's right of the spleen.")
    assert probes.relative_position_label(liver, spleen, "hflip") == 0 == vqa.parse_answer(
        "relative_position", "In this image it is on the left.")
    assert probes.kidney_symmetry_class(120, 100) == 1 == vqa.parse_answer("kidney_symmetry", "left kidney larger")
    q = pd.DataFrame({"probe": ["relative_position", "kidney_symmetry"] * 6, "organ_a": "liver", "organ_b": "spleen",
                      "organ_c": "", "organ_d": ""})
    for prompt in vqa.render_questions(q, np.random.default_rng(1)):
        assert "patient's left is on the image's right" in prompt
    relpos = vqa.render_questions(q.iloc[::2], np.random.default_rng(2))
    assert all("patient's left or right" in p for p in relpos)


def test_templates_fill_organs_and_are_sampled_with_the_seed():
    q = pd.DataFrame({"probe": ["relative_position"] * 30, "organ_a": "left_kidney", "organ_b": "liver",
                      "organ_c": "", "organ_d": ""})
    a = vqa.render_questions(q, np.random.default_rng(0))
    assert a == vqa.render_questions(q, np.random.default_rng(0))
    assert len(set(a)) == len(vqa.TEMPLATES["relative_position"])  # every phrasing drawn over 30 items
    assert all("left kidney" in t and "liver" in t for t in a)
    assert set(vqa.MODELS) == {"llava_1_5_7b", "qwen2_vl_2b", "qwen2_vl_7b", "medgemma_4b"}


def _tiny_llava(folder):
    """A random-weight LLaVA (CLIP tower + Llama) whose language head is zero, so greedy decoding
    always emits token 0, the word 'left'; saved with save_pretrained like a hub snapshot."""
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import (
        CLIPImageProcessor,
        CLIPVisionConfig,
        LlamaConfig,
        LlavaConfig,
        LlavaForConditionalGeneration,
        LlavaProcessor,
        PreTrainedTokenizerFast,
    )

    words = ["left", "<unk>", "<s>", "</s>", "<image>", "<pad>", "USER", "ASSISTANT", ":"] + \
        [w for t in vqa.TEMPLATES.values() for p in t for w in p.lower().split()]
    vocab = {w: i for i, w in enumerate(dict.fromkeys(words))}
    tok = Tokenizer(models.WordLevel(vocab, unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, unk_token="<unk>", bos_token="<s>", eos_token="</s>",
                                   pad_token="<pad>", extra_special_tokens={"image_token": "<image>"})
    template = ("{% for m in messages %}USER: {% for c in m['content'] %}{% if c['type'] == 'image' %}<image> "
                "{% else %}{{ c['text'] }}{% endif %}{% endfor %} {% endfor %}"
                "{% if add_generation_prompt %}ASSISTANT:{% endif %}")
    proc = LlavaProcessor(image_processor=CLIPImageProcessor(size={"shortest_edge": 32},
                                                             crop_size={"height": 32, "width": 32}),
                          tokenizer=fast, patch_size=16, vision_feature_select_strategy="default",
                          chat_template=template, image_token="<image>", num_additional_image_tokens=1)
    cfg = LlavaConfig(vision_config=CLIPVisionConfig(hidden_size=16, intermediate_size=32, num_hidden_layers=1,
                                                     num_attention_heads=2, image_size=32, patch_size=16),
                      text_config=LlamaConfig(vocab_size=len(vocab), hidden_size=16, intermediate_size=32,
                                              num_hidden_layers=1, num_attention_heads=2, num_key_value_heads=2,
                                              max_position_embeddings=512, bos_token_id=2, eos_token_id=3,
                                              pad_token_id=5),
                      image_token_index=vocab["<image>"], vision_feature_select_strategy="default")
    return save_snapshot(LlavaForConditionalGeneration, cfg, proc, folder)


def _samples(n=12):
    rng = np.random.default_rng(3)
    probes = [("relative_position", 2), ("orientation", 5), ("kidney_symmetry", 3)]
    rows = [{"question_id": f"q{i}", "probe": p, "slice_row": i % n, "transform": "hflip" if i % 2 else "none",
             "organ_a": "liver", "organ_b": "spleen", "organ_c": "", "organ_d": "", "label": int(rng.integers(k)),
             "n_classes": k, "split": "test" if i < 3 * n - 3 else "train"}
            for i, (p, k) in enumerate(probes[j // n] for j in range(3 * n))]
    st = pd.DataFrame({"sample_id": [f"s{i}" for i in range(n)], "subject_id": "p", "split": "test",
                       "dataset": "word", "z": 0})
    e = np.zeros((0, 16), bool)
    return SparSamples(pd.DataFrame(), np.zeros((0, 16, 8, 8), np.uint8), e, np.zeros((0, 16, 2), np.float32),
                       np.zeros((0, 16, 2), np.float32), np.zeros((0, 16), np.int64),
                       rng.integers(0, 255, (n, 64, 64), dtype=np.uint8), st, pd.DataFrame(rows))


@pytest.mark.slow
def test_tiny_chat_model_end_to_end(tmp_path):
    """Every reply is 'left': relative position scores the share of label 0 (left), symmetry the
    share of label 1 (left larger), orientation 0 (no option named)."""
    folder = _tiny_llava(tmp_path / "tiny-llava")
    s = _samples()
    n_items = {"relative_position": 8, "orientation": 5, "kidney_symmetry": 6}
    rows = vqa.run_vqa(str(folder), s, seeds=(7,), device="cpu", n_items=n_items, max_new_tokens=2, batch_size=4)
    acc = rows.set_index("finding")["accuracy"]
    items = vqa.select_items(s.questions, n_items, np.random.default_rng(7))
    share = items.groupby("probe")["label"].agg(lambda x: x.to_numpy())
    assert acc["relative_position"] == pytest.approx(np.mean(share["relative_position"] == 0))
    assert acc["kidney_symmetry"] == pytest.approx(np.mean(share["kidney_symmetry"] == 1))
    assert acc["orientation"] == 0.0 and rows.set_index("finding").loc["orientation", "unparsed"] == 1.0
    assert acc["macro"] == pytest.approx(np.mean([acc["relative_position"], acc["orientation"],
                                                  acc["kidney_symmetry"]]))
    assert rows.set_index("finding")["n"].to_dict() == {**n_items, "macro": 19}


def _tiny_qwen2_vl(folder):
    """A random-weight Qwen2-VL (vision tower + M-RoPE decoder) with a zero language head (replies
    'left'), saved like a hub snapshot with its image, video and chat processors."""
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import (
        PreTrainedTokenizerFast,
        Qwen2VLConfig,
        Qwen2VLForConditionalGeneration,
        Qwen2VLImageProcessor,
        Qwen2VLProcessor,
    )
    from transformers.models.qwen2_vl.video_processing_qwen2_vl import (
        Qwen2VLVideoProcessor,
    )

    special = ["<|im_start|>", "<|im_end|>", "<|vision_start|>", "<|vision_end|>", "<|image_pad|>", "<|video_pad|>"]
    words = ["left", "<unk>", "<pad>", *special, "user", "assistant"] + \
        [w for t in vqa.TEMPLATES.values() for p in t for w in p.lower().split()]
    vocab = {w: i for i, w in enumerate(dict.fromkeys(words))}
    tok = Tokenizer(models.WordLevel(vocab, unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, unk_token="<unk>", eos_token="<|im_end|>", pad_token="<pad>")
    fast.add_special_tokens({"additional_special_tokens": special})
    template = ("{% for m in messages %}<|im_start|>{{ m['role'] }} {% for c in m['content'] %}"
                "{% if c['type'] == 'image' %}<|vision_start|><|image_pad|><|vision_end|>{% else %}{{ c['text'] }}"
                "{% endif %}{% endfor %}<|im_end|> {% endfor %}{% if add_generation_prompt %}<|im_start|>assistant "
                "{% endif %}")
    proc = Qwen2VLProcessor(image_processor=Qwen2VLImageProcessor(min_pixels=28 * 28 * 4, max_pixels=28 * 28 * 16),
                            tokenizer=fast, video_processor=Qwen2VLVideoProcessor(), chat_template=template)
    cfg = Qwen2VLConfig(
        text_config=dict(vocab_size=len(vocab), hidden_size=16, intermediate_size=32, num_hidden_layers=1,
                         num_attention_heads=2, num_key_value_heads=1,
                         rope_scaling={"type": "mrope", "mrope_section": [1, 1, 2]}),
        vision_config=dict(depth=1, embed_dim=16, hidden_size=16, num_heads=2, patch_size=14, spatial_merge_size=2,
                           temporal_patch_size=2),
        image_token_id=vocab["<|image_pad|>"], video_token_id=vocab["<|video_pad|>"],
        vision_start_token_id=vocab["<|vision_start|>"], vision_end_token_id=vocab["<|vision_end|>"])
    return save_snapshot(Qwen2VLForConditionalGeneration, cfg, proc, folder)


@pytest.mark.slow
def test_tiny_qwen2_vl_through_the_same_backend(tmp_path):
    folder = _tiny_qwen2_vl(tmp_path / "tiny-qwen2-vl")
    s = _samples()
    rows = vqa.run_vqa(str(folder), s, seeds=(1,), device="cpu", n_items={"relative_position": 6},
                       max_new_tokens=2, batch_size=3)
    items = vqa.select_items(s.questions, {"relative_position": 6}, np.random.default_rng(1))
    acc = rows.set_index("finding")["accuracy"]
    assert acc["relative_position"] == pytest.approx(np.mean(items["label"] == 0))
    assert rows["unparsed"].max() == 0.0


def save_snapshot(model_class, cfg, proc, folder):
    """Build a seeded random model whose LM head is zero (so every reply is the same known token
    sequence) and save it with its processor like a hub snapshot."""
    import torch

    torch.manual_seed(0)
    model = model_class(cfg)
    with torch.no_grad():
        model.lm_head.weight.zero_()
    model.save_pretrained(folder)
    proc.save_pretrained(folder)
    return folder
