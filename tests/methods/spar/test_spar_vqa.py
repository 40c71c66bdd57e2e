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
