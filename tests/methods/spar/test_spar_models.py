"""SPAR metrics, heads and backbones (spar.md Sections 3.1-3.2) on hand-built inputs."""
import numpy as np
import pandas as pd
import pytest
import torch

import robustbench_fm.encoders as enc
from robustbench_fm.core.devices import torch_threads
from robustbench_fm.methods.spar import metrics
from robustbench_fm.methods.spar import run as spar_run
from robustbench_fm.methods.spar.heads import MLPHead, ProbeHeads, SparModel, TransformerHead
from robustbench_fm.methods.spar.models import Backbone, CombinedViT
from robustbench_fm.methods.spar.params import ORACLE, SparParams
from robustbench_fm.methods.spar.run import N_CLASSES_L3, QUESTION_DIM, QueryTask, encode_questions, slice_views
from robustbench_fm.methods.spar.samples import L3_PROBES, ORGANS, SparSamples, slice_frame_mm
from robustbench_fm.methods.spar.train import TrainConfig, fit, predict

CPU = torch.device("cpu")


def test_localization_metrics_by_hand():
    true = np.zeros((2, 16, 2), np.float32)
    pred = true.copy()
    pred[0, 0] = (3, 4)      # 5 px
    pred[0, 1] = (6, 8)      # 10 px: a success at the 10 px threshold
    pred[1, 0] = (0, 12)     # 12 px
    pred[1, 5] = (100, 100)  # absent: ignored
    present = np.zeros((2, 16), bool)
    present[0, :2] = present[1, 0] = True
    m = metrics.localization(pred, true, present, threshold=10)
    assert m["med"] == pytest.approx(27 / 3) and m["sdr"] == pytest.approx(2 / 3) and m["n"] == 3
    assert m["per_slot_med"][0] == pytest.approx(8.5) and m["per_slot_med"][1] == pytest.approx(10)
    assert np.isnan(m["per_slot_med"][5])


def test_permutation_metrics_by_hand():
    true = np.tile(np.arange(16), (3, 1))
    pred = true.copy()
    pred[1, [0, 1]] = pred[1, [1, 0]]  # two present tiles swapped
    pred[2, [14, 15]] = pred[2, [15, 14]]  # two absent tiles swapped: still a full permutation
    present = np.ones((3, 16), bool)
    present[2, 14:] = False
    m = metrics.permutation(pred, true, present)
    assert m["patch_acc"] == pytest.approx((16 + 14 + 14) / 46)
    assert m["perm_acc"] == pytest.approx(2 / 3)
    assert m["per_slot_acc"][0] == pytest.approx(2 / 3) and m["per_slot_acc"][15] == 1.0  # present twice


def test_probe_accuracy_and_macro():
    acc = metrics.probe_accuracy([0, 1, 1, 2, 0], [0, 0, 1, 2, 1], ["a", "a", "a", "b", "b"])
    assert acc == {"a": pytest.approx(2 / 3), "b": 0.5, "macro": pytest.approx((2 / 3 + 0.5) / 2)}


def _symmetry_samples(n_per_split=(30, 15, 30)) -> SparSamples:
    """Only balanced kidney-symmetry questions (3 classes, equal counts in every split)."""
    rows = []
    for split, n in zip(("train", "val", "test"), n_per_split):
        for i in range(n):
            rows.append({"question_id": f"{split}{i}", "probe": "kidney_symmetry", "slice_row": len(rows),
                         "transform": "none", "organ_a": "left_kidney", "organ_b": "right_kidney", "organ_c": "",
                         "organ_d": "", "label": i % 3, "n_classes": 3, "split": split})
    q = pd.DataFrame(rows)
    m = len(q)
    st = pd.DataFrame({"sample_id": [f"s{i}" for i in range(m)], "subject_id": "p", "split": q["split"],
                       "dataset": "word", "z": 0})
    empty = np.zeros((0, 16), bool)
    return SparSamples(pd.DataFrame(), np.zeros((0, 16, 8, 8), np.uint8), empty, np.zeros((0, 16, 2), np.float32),
                       np.zeros((0, 16, 2), np.float32), np.zeros((0, 16), np.int64),
                       np.random.default_rng(0).integers(0, 255, (m, 8, 8), dtype=np.uint8), st, q)


def test_frozen_mlp_on_a_constant_encoder_scores_chance_on_symmetry():
    """Constant tokens and one question encoding: one answer for every slice; balanced 3 classes
    give exactly 1/3 (spar.md 3.1 (iii): undersampling keeps a constant answer at chance)."""
    s = _symmetry_samples()
    views, view_of = slice_views(s)
    constant = np.ones((len(views), 5, 16), np.float16)
    task = QueryTask(s, lambda rows: constant[rows], view_of, CPU)
    torch.manual_seed(0)
    model = SparModel(ProbeHeads(lambda k: MLPHead(16, k, has_cls=True, cond_dim=QUESTION_DIM, hidden=32),
                                 N_CLASSES_L3))
    split = s.questions["split"].to_numpy()
    fit(model, task.batch, task.loss, np.flatnonzero(split == "train"), np.flatnonzero(split == "val"),
        TrainConfig(lr=1e-2, max_epochs=20, patience=5), CPU)
    test = np.flatnonzero(split == "test")
    rows = {r["finding"]: r for r in task.score(predict(model, task.batch, test, 16, CPU), test)}
    assert rows["kidney_symmetry"]["accuracy"] == pytest.approx(1 / 3, abs=1e-9)
    assert rows["kidney_symmetry"]["chance"] == pytest.approx(1 / 3)


def test_question_encoding_is_one_hot_probe_and_organs():
    q = pd.DataFrame({"probe": ["distance_compare"], "organ_a": ["liver"], "organ_b": ["spleen"],
                      "organ_c": ["colon"], "organ_d": [""]})
    x = encode_questions(q)[0]
    assert x.sum() == 4 and x[L3_PROBES.index("distance_compare")] == 1
    assert x[len(L3_PROBES) + 2 * len(ORGANS) + ORGANS.index("colon")] == 1


TINY_VIT = dict(pretrained=False, seed=0, input_size=32, arch_kwargs={"img_size": 32, "depth": 1, "embed_dim": 16,
                                                                     "num_heads": 2, "patch_size": 8})


def test_backbone_tokens_cls_and_cnn_map():
    vit = Backbone(enc.load(enc.get("vit_b32_in1k").replace(**TINY_VIT), device="cpu"), token_grid=2)
    x = torch.randint(0, 255, (3, 40, 40), dtype=torch.uint8)
    tok = vit(x)
    assert vit.has_cls and tok.shape == (3, 1 + 4, 16)  # 4 x 4 patch grid pooled to 2 x 2
    full = Backbone(vit_enc := enc.load(enc.get("vit_b32_in1k").replace(**TINY_VIT), device="cpu"), token_grid=99)
    with torch.no_grad():
        ref = vit_enc.model.forward_features(full.prepare(x))
    assert torch.allclose(full(x), ref, atol=1e-6)  # no pooling: exactly timm's CLS + patch tokens
    pooled = ref[:, 1:].reshape(3, 4, 4, 16).permute(0, 3, 1, 2)
    want = torch.nn.functional.avg_pool2d(pooled, 2).flatten(2).transpose(1, 2)
    assert torch.allclose(tok[:, 1:], want, atol=1e-5)
    cnn = Backbone(enc.load(enc.get("resnet50_in1k").replace(
        pretrained=False, seed=0, input_size=32, arch_kwargs={"layers": [1, 1, 1, 1], "channels": (8, 16, 32, 64),
                                                              "stem_width": 8}), device="cpu"))
    tok = cnn(x)
    assert not cnn.has_cls and tok.shape == (3, 1, 256)  # 32 px -> 1 x 1 map of 64 x 4 channels
    assert torch.equal(cnn.pool(tok), tok.mean(1))


def test_heads_and_combined_vit_shapes():
    tiles = torch.randn(2, 16, 5, 12)
    assert MLPHead(12, 2, True, n_tiles=16, hidden=8)(tiles).shape == (2, 16, 2)
    assert TransformerHead(12, 16, 5, n_tiles=16, d_model=8, heads=2)(tiles).shape == (2, 16, 16)
    q = torch.zeros(2, QUESTION_DIM)
    assert TransformerHead(12, 30, 5, cond_dim=QUESTION_DIM, d_model=8, heads=2)(tiles[:, 0], q).shape == (2, 30)
    comb = CombinedViT(enc.load(enc.get("vit_b32_in1k").replace(**TINY_VIT), device="cpu"))
    out = comb(torch.randint(0, 255, (2, 16, 32, 32), dtype=torch.uint8))
    assert out.shape == (2, 16, 1, 16)
    swapped = torch.randint(0, 255, (1, 16, 32, 32), dtype=torch.uint8)
    a = comb(swapped)
    b = comb(swapped[:, [1, 0, *range(2, 16)]])
    assert not torch.allclose(a[0, 0], b[0, 1])  # tile embeddings make the slot matter


# ------------------------------------------------------------------ Level 3: six heads, own losses

def _l3_batch(n=24, dim=6, seed=0):
    g = torch.Generator().manual_seed(seed)
    probe = torch.arange(n) % len(L3_PROBES)
    q = torch.zeros(n, QUESTION_DIM)
    q[torch.arange(n), probe] = 1.0
    label = torch.tensor([int(torch.randint(k, (1,), generator=g)) for k in (N_CLASSES_L3[p] for p in probe)])
    return torch.randn(n, 5, dim, generator=g), q, probe, label


@pytest.mark.parametrize("head", ["mlp", "transformer"])
def test_level3_has_six_separate_heads_each_trained_on_its_own_loss(head):
    """spar.md Level 3: "routes the sample to one of six heads ... cross-entropy loss per head":
    six heads with disjoint parameters, each answering its probe's classes; the gradient reaching a
    head is that of its own cross-entropy alone (brute force: the head run on its own samples), so
    changing another probe's labels leaves it unchanged."""
    from robustbench_fm.methods.spar.run import QueryTask, Setup, _head

    torch.manual_seed(0)
    model = _head(head, "spatial_queries", 6, 5, True, Setup(d_model=8, hidden=8)).eval()
    assert isinstance(model, ProbeHeads) and len(model.heads) == 6
    ids = [{id(p) for p in h.parameters()} for h in model.heads]
    assert all(not (a & b) for i, a in enumerate(ids) for b in ids[i + 1:])  # no shared layer
    tokens, q, probe, label = _l3_batch()
    out = model(tokens, q)
    for p, k in enumerate(N_CLASSES_L3):  # each head answers with its own classes, -inf beyond
        assert torch.isfinite(out[probe == p, :k]).all() and torch.isinf(out[probe == p, k:]).all()
    loss = QueryTask.loss(None, out, (probe, label, None))
    loss.backward()
    grads = [[p.grad.clone() for p in h.parameters()] for h in model.heads]
    for p, h in enumerate(model.heads):
        rows = probe == p
        h.zero_grad()
        torch.nn.functional.cross_entropy(h(tokens[rows], q[rows]), label[rows]).backward()
        for a, b in zip(grads[p], h.parameters()):
            assert torch.allclose(a, b.grad, atol=1e-6)
    model.zero_grad()
    flipped = label.clone()
    flipped[probe == 1] = (flipped[probe == 1] + 1) % 5  # another answer for every orientation question
    QueryTask.loss(None, model(tokens, q), (probe, flipped, None)).backward()
    for p, h in enumerate(model.heads):
        same = all(torch.equal(a, b.grad) for a, b in zip(grads[p], h.parameters()))
        assert same == (p != 1)


def test_level3_loss_is_the_sum_of_each_heads_mean_cross_entropy():
    """Closed form: zero logits give each head log(k) whatever its number of samples, so the loss is
    sum_p log k_p = 2 log 2 + log 5 + 3 log 3 (a joint CE over the batch would weight probes by count)."""
    from robustbench_fm.methods.spar.run import QueryTask

    probe = torch.tensor([0, 0, 0, 0, 1, 2, 3, 4, 5, 5])
    out = torch.zeros(10, 5)
    label = torch.zeros(10, dtype=torch.long)
    want = 2 * np.log(2) + np.log(5) + 3 * np.log(3)
    assert float(QueryTask.loss(None, out, (probe, label, None))) == pytest.approx(want, abs=1e-6)


def test_vit_combined_at_level3_reads_the_question_inside_the_vit():
    """ViT-Combined at Level 3 is the unified model: the question is a token of the ViT's own
    sequence, so the token the heads read changes with the question (ViT-MLP's does not)."""
    vit = enc.load(enc.get("vit_b32_in1k").replace(**TINY_VIT), device="cpu")
    comb = CombinedViT(vit, n_tiles=0, cond_dim=QUESTION_DIM).eval()
    x = torch.randint(0, 255, (2, 32, 32), dtype=torch.uint8)
    q1, q2 = torch.zeros(2, QUESTION_DIM), torch.zeros(2, QUESTION_DIM)
    q1[:, 0] = 1.0
    q2[:, 3] = 1.0
    with torch.no_grad():
        a, b = comb(x, q1), comb(x, q2)
    assert a.shape == (2, 1, 16) and not torch.allclose(a, b)
    model = SparModel(ProbeHeads(lambda k: MLPHead(16, k, True, hidden=8), N_CLASSES_L3), comb)
    with torch.no_grad():
        out = model(x, q1)
    assert out.shape == (2, 5) and torch.isfinite(out[:, :2]).all() and torch.isinf(out[:, 2:]).all()


def _count_fits(monkeypatch, setup, configs, samples):
    """(learning rate of every fit, rows) of run_encoder over ``configs`` with a fake fit."""
    rates = []

    def fake_fit(model, batch, loss, train_idx, val_idx, cfg, device, groups=None, own=None):
        rates.append(cfg.lr)
        by_group = {p: {"val_loss": 1.0, "epochs": 1} for p in (own or {})}
        return {"epochs": 1, "val_loss": float(len(by_group) or 1), **({"by_group": by_group} if own else {})}

    views, view_of = slice_views(samples)
    monkeypatch.setattr(spar_run, "fit", fake_fit)
    monkeypatch.setattr(spar_run.EncoderRun, "_frozen_source",
                        lambda self, level, name, s: (np.ones((len(views), 2, 4), np.float16), view_of, True))
    rows = spar_run.run_encoder("x", samples, {}, setup, configs, CPU, None, "word")
    return rates, rows


def test_the_default_trains_every_configuration_once_per_level_and_seed_at_1e4(monkeypatch):
    """Issue 29 item 6, spar.md Section 3.2 ("All models are trained with Adam, learning rate
    10^-4 (logarithmic search over 10^-3 to 10^-6)") read as one rate for every model: 2 heads x
    2 seeds at Level 3 are 4 fits, all at 1e-4, and every row records it. The old default searched
    4 rates, so it ran 16 fits (the per_configuration option below)."""
    assert (SparParams().lr, SparParams().lr_selection) == (1e-4, "fixed")
    assert spar_run.Setup().lr_selection == "fixed" and spar_run.Setup().train.lr == 1e-4
    configs = [("mlp", "frozen"), ("transformer", "frozen")]
    setup = spar_run.Setup(levels=("spatial_queries",), seeds=(42, 123), hidden=4, d_model=8, head_layers=1)
    rates, rows = _count_fits(monkeypatch, setup, configs, _symmetry_samples(n_per_split=(6, 3, 3)))
    assert rates == [1e-4] * 4
    assert (rows["lr"] == 1e-4).all() and set(rows["seed"]) == {42, 123}


def test_the_per_configuration_option_still_searches_every_rate(monkeypatch):
    """``lr_selection="per_configuration"`` (the behaviour before issue 29): every configuration,
    level and seed is trained at each of the 4 rates, 16 fits for 2 heads x 2 seeds; an empty
    search list is refused naming the fix."""
    configs = [("mlp", "frozen"), ("transformer", "frozen")]
    setup = spar_run.Setup(levels=("spatial_queries",), seeds=(42, 123), hidden=4, d_model=8, head_layers=1,
                           lr_selection="per_configuration")
    rates, _ = _count_fits(monkeypatch, setup, configs, _symmetry_samples(n_per_split=(6, 3, 3)))
    assert len(rates) == 16 and sorted(set(rates)) == [1e-6, 1e-5, 1e-4, 1e-3]
    assert all(rates[k:k + 4] == [1e-3, 1e-4, 1e-5, 1e-6] for k in range(0, 16, 4))
    with pytest.raises(ValueError, match="lr_selection=fixed"):
        SparParams(lr_selection="per_configuration", lr_search=()).check()
    with pytest.raises(ValueError, match="lr_selection"):
        SparParams(lr_selection="per_model").check()


def test_learning_rate_search_gives_each_level3_head_the_rate_with_its_own_lowest_validation_loss(monkeypatch):
    """spar.md Section 3.2 (search over 1e-3...1e-6 on validation) with Level 3's six independent
    heads (Section 3.1: "cross-entropy loss per head"): every rate starts from the same seeded
    initialisation, and each probe's head is taken from the rate whose run gave THAT head the
    lowest validation loss (here probe p prefers 1e-(3 + p mod 4)); each probe's rows carry its own
    rate and epochs, the macro row NaN (the heads chose different rates)."""
    from robustbench_fm.methods.spar import run as spar_run

    assert SparParams().lr_search == (1e-3, 1e-4, 1e-5, 1e-6)
    s = _symmetry_samples(n_per_split=(6, 3, 3))
    seen, owns = {}, []

    def fake_fit(model, batch, loss, train_idx, val_idx, cfg, device, groups=None, own=None):
        seen[cfg.lr] = torch.cat([p.detach().flatten() for p in model.parameters()])
        owns.append(own)
        with torch.no_grad():
            for p in model.parameters():
                p.fill_(np.log10(cfg.lr))  # mark the model with its rate
        by_group = {p: {"val_loss": abs(np.log10(cfg.lr) + 3 + p % 4), "epochs": p + 1} for p in own}
        return {"epochs": 6, "val_loss": sum(g["val_loss"] for g in by_group.values()), "by_group": by_group}

    scored = []
    monkeypatch.setattr(spar_run, "fit", fake_fit)
    monkeypatch.setattr(spar_run, "predict", lambda model, *a: scored.append(model) or np.zeros((len(a[1]), 5),
                                                                                                  np.float32))
    views, _ = slice_views(s)

    class Run(spar_run.EncoderRun):
        def _frozen_source(self, level, name, samples):
            return np.ones((len(views), 2, 4), np.float16), slice_views(samples)[1], True

    run = Run("x", s, {}, spar_run.Setup(levels=("spatial_queries",), hidden=4, lr_selection="per_configuration"),
              CPU, None, "word")
    rows = pd.DataFrame(run.run_config("mlp", "frozen", "spatial_queries", 42))
    assert sorted(seen) == [1e-6, 1e-5, 1e-4, 1e-3]
    first = next(iter(seen.values()))
    assert all(torch.equal(v, first) for v in seen.values())  # one seeded initialisation for every rate
    assert owns[0] == {p: f"head.heads.{p}." for p in range(6)}
    (model,) = {id(m): m for m in scored}.values()
    for p, head in enumerate(model.head.heads):
        assert all(torch.all(w == -(3 + p % 4)) for w in head.parameters()), p
    for p, probe in enumerate(L3_PROBES):
        part = rows[rows["finding"] == probe]
        assert (part["lr"] == 10.0 ** -(3 + p % 4)).all() and (part["epochs"] == p + 1).all(), probe
    macro = rows[rows["finding"] == "macro"]
    assert macro["lr"].isna().all() and (macro["epochs"] == 6).all()


def test_each_level3_head_stops_on_its_own_validation_loss_and_keeps_its_own_best_weights():
    """train.fit with ``own``: two independent one-weight heads, each training step raising its
    weight w by lr = 1 (Adam on a constant gradient). Head 0's validation loss |w - 2| + 1 is lowest
    after epoch 2 and then rises (patience 3: it trains epochs 1-5, then stops); head 1's 10 - w
    falls to the last epoch (8). Each gets back the weight of its own best epoch (2 and 8); one
    early stop on the summed loss would have kept a single epoch for both."""
    class Model(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.head = torch.nn.Module()
            self.head.heads = torch.nn.ModuleList([torch.nn.Linear(1, 1, bias=False) for _ in range(2)])
            for h in self.head.heads:
                torch.nn.init.zeros_(h.weight)

        def forward(self, x, q):
            return torch.cat([self.head.heads[int(g)](x[i:i + 1]) for i, g in enumerate(q)])

    groups = np.array([0, 1, 0, 1])  # samples 0, 1 train; 2, 3 validate
    steps = {0: 0, 1: 0}

    def batch(rows, rng):
        return torch.ones(len(rows), 1), torch.from_numpy(groups[rows]), torch.from_numpy(rows)

    def loss(out, rows):
        g = int(groups[int(rows[0])])
        if int(rows[0]) >= 2:  # validation
            return (out - 2).abs().mean() + 1 if g == 0 else (10 - out).mean()
        steps[g] += 1
        return -out.sum()

    model = Model()
    info = fit(model, batch, loss, np.array([0, 1]), np.array([2, 3]),
               TrainConfig(lr=1.0, batch_size=1, max_epochs=8, patience=3, seed=0), CPU, groups,
               {0: "head.heads.0.", 1: "head.heads.1."})
    assert steps == {0: 5, 1: 8}  # head 0's batches stop after its fifth epoch
    assert info["epochs"] == 8 and {g: v["epochs"] for g, v in info["by_group"].items()} == {0: 5, 1: 8}
    assert [info["by_group"][g]["val_loss"] for g in (0, 1)] == pytest.approx([1.0, 2.0])
    assert info["val_loss"] == pytest.approx(3.0)
    assert [float(h.weight.detach()) for h in model.head.heads] == pytest.approx([2.0, 8.0])


@pytest.mark.parametrize("min_delta, epochs", [(0.0, 8), (1e-3, 5)])
def test_min_delta_stops_a_loss_that_only_creeps_and_keeps_the_lowest_loss_weights(min_delta, epochs):
    """train.fit's ``min_delta`` (Keras' and Lightning's EarlyStopping rule): one weight w rising by
    lr = 1 per step (Adam on a constant gradient, w = epoch), validation loss 10 - w until epoch 1,
    then 5 - 1e-4 w: a drop of 4 at epoch 2, then a creep of 1e-4 per epoch. With min_delta 1e-3
    and patience 3 epochs 3-5 are no improvement (the loss sits 1e-4 to 3e-4 below the epoch-2
    mark), so training stops after epoch 5 and keeps w = 5, the lowest loss seen; with 0 (the paper's
    rule) every creep counts and it trains all 8 epochs (w = 8)."""
    model = torch.nn.Linear(1, 1, bias=False)
    torch.nn.init.zeros_(model.weight)
    net = torch.nn.Module()
    net.head = model

    def forward(x, q):
        return model(x)
    net.forward = forward

    def batch(rows, rng):
        return torch.ones(len(rows), 1), None, torch.from_numpy(rows)

    def loss(out, rows):
        if int(rows[0]) == 1:  # validation
            w = out.mean()
            return 10 - w if float(w) < 1.5 else 5 - 1e-4 * w
        return -out.sum()

    info = fit(net, batch, loss, np.array([0]), np.array([1]),
               TrainConfig(lr=1.0, batch_size=1, max_epochs=8, patience=3, seed=0, min_delta=min_delta), CPU)
    assert info["epochs"] == epochs
    assert float(model.weight.detach()) == pytest.approx(epochs, abs=1e-5)
    assert info["val_loss"] == pytest.approx(5 - 1e-4 * epochs, abs=1e-6)


# ------------------------------------------------------------------ the planted oracle

def _oracle_samples() -> SparSamples:
    rng = np.random.default_rng(3)
    n = 4
    present = rng.random((n, 16)) < 0.7
    cent = rng.random((n, 16, 2)).astype(np.float32)
    cent[~present] = np.nan
    tiles = rng.integers(1, 255, (n, 16, 8, 8), dtype=np.uint8)
    tiles[~present] = 0
    from robustbench_fm.methods.spar.probes import grid_cells
    table = pd.DataFrame({"sample_id": [f"s{i}" for i in range(n)], "split": "train"})
    return SparSamples(table, tiles, present, cent, cent * 224, grid_cells(np.nan_to_num(cent), present),
                       np.zeros((0, 8, 8), np.uint8), table.iloc[:0], pd.DataFrame())


def test_oracle_tokens_come_from_the_masks_behind_each_image():
    """The planted oracle returns, for each tile image (found by its bytes), its organ's centroid as
    Gaussian bumps over x and y (peak in the centroid's bin) and its Level 2 cell as a one-hot, in
    zero-mean blocks (a head's LayerNorm keeps them linear); black tiles give zeros; an image it was
    not built for is refused."""
    from robustbench_fm.methods.spar.models import ORACLE_BINS, OracleBackbone, oracle_tile_tokens

    s = _oracle_samples()
    tok = oracle_tile_tokens(s)
    oracle = OracleBackbone.for_tiles(s)
    out = oracle(torch.from_numpy(s.tiles.reshape(-1, 8, 8))).numpy().reshape(tok.shape)
    assert np.array_equal(out, tok)
    present, b = s.present, ORACLE_BINS
    code = tok[present][:, 0]
    assert np.array_equal(code[:, :b].argmax(-1), np.minimum((s.centroids[present][:, 0] * b).astype(int), b - 1))
    assert np.array_equal(code[:, 2 * b:3 * b].argmax(-1),
                          np.minimum((s.centroids[present][:, 1] * b).astype(int), b - 1))
    assert np.array_equal(code[:, 4 * b:4 * b + 16].argmax(-1), s.grid_cells[present])
    i = np.flatnonzero(present.ravel())[0]  # the x code peaks at exp(0) only when x sits on a bin centre
    x = s.centroids.reshape(-1, 2)[i, 0]
    assert code[0, :b].max() == pytest.approx(np.exp(-0.5 * ((x * b - 0.5) % 1 if (x * b - 0.5) % 1 < 0.5
                                                              else 1 - (x * b - 0.5) % 1) ** 2), rel=1e-5)
    assert np.allclose(tok[present].mean(-1), 0, atol=1e-6)
    assert not tok[~present].any()
    with pytest.raises(ValueError, match="holds no masks"):
        oracle(torch.full((1, 8, 8), 7, dtype=torch.uint8))


def test_oracle_view_tokens_follow_the_presented_transform():
    """Level 3 views: token 0 carries the transform and the kidney-symmetry class the masks give;
    each organ token its identity, the rank of its presented x among the present organs (hflip
    reverses the order) and its row of the pair-distance ranks (distances do not move under a
    flip); the whole token is zero-mean ``[v, -v]``."""
    from robustbench_fm.methods.spar.models import oracle_view_tokens
    from robustbench_fm.methods.spar.probes import kidney_symmetry_class

    present = np.zeros((1, 16), bool)
    present[0, [0, 2, 3]] = True
    cent = np.full((1, 16, 2), np.nan, np.float32)
    cent[0, [0, 2, 3]] = [(0.3, 0.4), (0.7, 0.6), (0.2, 0.6)]
    areas = np.zeros((1, 16), np.int64)
    areas[0, [0, 2, 3]] = (900, 110, 100)  # left/right kidney ratio 1.1: left larger
    st = pd.DataFrame({"height": [96], "width": [96]})
    s = SparSamples(pd.DataFrame(), np.zeros((0, 16, 8, 8), np.uint8), np.zeros((0, 16), bool),
                    np.zeros((0, 16, 2), np.float32), np.zeros((0, 16, 2), np.float32), np.zeros((0, 16), np.int64),
                    np.zeros((1, 8, 8), np.uint8), st, pd.DataFrame(), present, cent, areas, np.array([-1]))
    views = pd.DataFrame({"slice_row": [0, 0], "transform": ["none", "hflip"]})
    tok = oracle_view_tokens(s, views)
    half = tok.shape[-1] // 2
    assert np.array_equal(tok[..., half:], -tok[..., :half])
    organ = tok[:, 1:, :half]  # identity (16), presence, x rank, pair-distance ranks (16)
    assert np.array_equal(organ[0, :, :16], np.eye(16))
    assert np.allclose(organ[0, [0, 2, 3], 17], [0.5, 1.0, 0.0]) and np.allclose(organ[1, [0, 2, 3], 17], [0.5, 0, 1])
    # distances 0-2: 0.447, 0-3: 0.224, 2-3: 0.5 -> ranks 0.5, 0, 1, the same under hflip
    for v in (0, 1):
        assert np.allclose(organ[v, 0, 18 + np.array([2, 3])], [0.5, 0.0]) and organ[v, 2, 18 + 3] == 1.0
    assert tok[0, 0, :5].argmax() == 0 and tok[1, 0, :5].argmax() == 1  # transform one-hot
    assert tok[0, 0, 5:8].argmax() == kidney_symmetry_class(110, 100) == 1


def test_the_oracle_reads_what_each_question_compares_from_its_encoding():
    """Issue 29 item 8: per question, the oracle's token 0 holds the two quantities it compares,
    decoded from the question's encoding as a head sees it: relative position, the presented x
    ranks of A and B; distance, the ranks of d(A, B) and d(C, D) (in mm on a non-square slice with
    anisotropic spacing, where the squashed frame orders pairs otherwise). Comparing the two
    entries answers every such question (1.000 under every transform), and every other entry is
    its view's token."""
    from robustbench_fm.methods.spar.models import _ASKED_AT, AskedTokens, oracle_asked, oracle_view_tokens
    from robustbench_fm.methods.spar.probes import make_questions

    rng = np.random.default_rng(7)
    m = 40
    present = rng.random((m, 16)) < 0.75
    cent = rng.uniform(0.05, 0.95, (m, 16, 2)).astype(np.float32)
    cent[~present] = np.nan
    areas = np.where(present, rng.integers(50, 900, (m, 16)), 0)
    st = pd.DataFrame({"sample_id": [f"s{i}" for i in range(m)], "split": "train", "dataset": "word",
                       "height": 400, "width": 512, "spacing_x": 0.6, "spacing_y": 1.1})
    q = make_questions(st, present, cent, areas, np.full(m, 400 * 512), np.full(m, -1), rng,
                       distance_questions=6, frame_mm=slice_frame_mm(st), distance_rule="random")
    s = SparSamples(pd.DataFrame(), np.zeros((0, 16, 8, 8), np.uint8), np.zeros((0, 16), bool),
                    np.zeros((0, 16, 2), np.float32), np.zeros((0, 16, 2), np.float32), np.zeros((0, 16), np.int64),
                    np.zeros((m, 8, 8), np.uint8), st, q, present, cent, areas, np.full(m, -1))
    views, view_of = slice_views(s)
    view_tok = oracle_view_tokens(s, views)
    tok = AskedTokens(view_tok, view_of, oracle_asked(s, views, view_of, encode_questions(q)))
    assert tok.shape == (len(q), *view_tok.shape[1:])
    rows = np.arange(len(q))
    out = tok[rows]
    half = out.shape[-1] // 2
    first, second = out[:, 0, _ASKED_AT], out[:, 0, _ASKED_AT + 1]
    assert np.array_equal(out[:, 0, half + _ASKED_AT], -first)
    rp, dc = (q["probe"] == "relative_position").to_numpy(), (q["probe"] == "distance_compare").to_numpy()
    assert rp.sum() >= 60 and dc.sum() >= 200 and set(q.loc[rp, "transform"]) == {"none", "hflip"}
    assert np.array_equal((first[rp] < second[rp]).astype(int), q.loc[rp, "label"].to_numpy())
    assert np.array_equal((first[dc] > second[dc]).astype(int), q.loc[dc, "label"].to_numpy())
    idx = [q.loc[dc, f"organ_{k}"].map(ORGANS.index).to_numpy() for k in "abcd"]
    r = q.loc[dc, "slice_row"].to_numpy()
    squashed = np.linalg.norm(cent[r, idx[0]] - cent[r, idx[1]], axis=-1) > \
        np.linalg.norm(cent[r, idx[2]] - cent[r, idx[3]], axis=-1)
    assert (squashed != q.loc[dc, "label"].to_numpy()).any()  # mm and the 224 frame disagree somewhere
    other = ~(rp | dc)
    assert not out[other][:, 0, [_ASKED_AT, _ASKED_AT + 1]].any()
    keep = np.ones(out.shape[-1], bool)
    keep[[_ASKED_AT, _ASKED_AT + 1, half + _ASKED_AT, half + _ASKED_AT + 1]] = False
    assert np.array_equal(out[:, 0][:, keep], view_tok[view_of, 0][:, keep])
    assert np.array_equal(out[:, 1:], view_tok[view_of, 1:])
    assert not view_tok[:, 0, [_ASKED_AT, _ASKED_AT + 1]].any()


def _layout_samples(n: int = 160, seed: int = 5) -> SparSamples:
    """``n`` tile sets of 16 organs around canonical positions (jitter 0.04), 5-16 present, each
    present tile a distinct random 8 x 8 image; splits 60/20/20 % (train/val/test)."""
    from robustbench_fm.methods.spar.probes import grid_cells

    rng = np.random.default_rng(seed)
    canon = rng.uniform(0.1, 0.9, (16, 2))
    present = np.zeros((n, 16), bool)
    for i in range(n):
        present[i, rng.choice(16, rng.integers(5, 17), replace=False)] = True
    cent = np.clip(canon + rng.normal(0, 0.04, (n, 16, 2)), 0.01, 0.99).astype(np.float32)
    cent[~present] = np.nan
    tiles = rng.integers(1, 255, (n, 16, 8, 8), dtype=np.uint8)
    tiles[~present] = 0
    split = np.where(np.arange(n) < 0.6 * n, "train", np.where(np.arange(n) < 0.8 * n, "val", "test"))
    table = pd.DataFrame({"sample_id": [f"s{i}" for i in range(n)], "split": split})
    return SparSamples(table, tiles, present, cent, cent * 224, grid_cells(np.nan_to_num(cent), present),
                       np.zeros((0, 8, 8), np.uint8), table.iloc[:0], pd.DataFrame())


# mlp: 150 epochs (100 reached perm_acc 0.84 on some CPUs, where float rounding changes the path; 150: 1.0)
@pytest.mark.parametrize("head,batch,epochs", [("mlp", 16, 150), ("transformer", 32, 40)])
def test_level2_heads_recover_the_permutation_from_planted_tokens(head, batch, epochs):
    """The calibration at Level 2, in seconds: heads trained through the real pipeline (shuffled
    tiles, Sinkhorn loss, present-slot Hungarian) on the oracle's tokens place nearly every test
    tile set fully right (chance: 0 for 5+ tiles). With separate learned query tokens the
    Transformer head stayed at chance here (patch accuracy 0.06 in the demo): each slot is now
    read from its own tile's outputs."""
    s = _layout_samples()
    setup = spar_run.Setup(levels=("permutation",), seeds=(42,), d_model=32, hidden=256,
                           train=spar_run.TrainConfig(lr=5e-3, batch_size=batch, max_epochs=epochs, patience=epochs))
    run = spar_run.EncoderRun(ORACLE, s, {}, setup, CPU, None, "layout")
    with torch_threads(1):  # as run_encoder does on the CPU (many small steps)
        rows = pd.DataFrame(run.run_config(head, "frozen", "permutation", 42))
    overall = rows[rows["organ"] == "all"].iloc[0]
    assert overall["n"] == 32 and overall["perm_acc"] >= 0.9, overall.to_dict()


def test_level3_batches_hold_one_probe_each_and_predictions_keep_their_order():
    """Level 3 trains in batches of one probe (so each step runs the one head it routes to): every
    sample exactly once per epoch, each batch single-probe and at most ``size`` long; ``predict``
    returns outputs in the order asked although it computes them probe by probe."""
    from robustbench_fm.methods.spar.train import batches

    groups = np.array([0, 1, 2, 1, 0, 0, 2, 1, 1, 0, 5])
    idx = np.array([10, 0, 3, 4, 5, 6, 7, 8, 9, 1])
    parts = batches(idx, 2, groups, np.random.default_rng(0))
    assert sorted(np.concatenate(parts).tolist()) == sorted(idx.tolist())
    assert all(len(set(groups[p])) == 1 and len(p) <= 2 for p in parts)
    assert len(parts) == 6  # groups 0 and 1: 4 samples -> 2 batches each; 2 and 5: one
    assert len(batches(idx, 2, None, None)) == 5

    def batch(rows, rng):
        return torch.from_numpy(rows.astype(np.float32))[:, None], None, None

    class Times10(torch.nn.Module):
        def forward(self, x, q):
            return x * 10

    out = predict(Times10(), batch, idx, 3, CPU, groups)
    assert np.array_equal(out[:, 0], idx * 10.0)


def test_level3_validation_loss_adds_each_probes_mean_so_a_many_question_probe_does_not_outweigh_the_others():
    """Closed form: probe 0 has 9 samples of loss 1, probe 1 one sample of loss 3. The validation
    loss (early stopping, learning-rate search) is 1 + 3 = 4, the heads' own mean losses added;
    the sample-weighted mean (1.2) would let the probe with most questions decide. Without groups
    (Levels 1-2) it stays the sample-weighted mean."""
    from robustbench_fm.methods.spar.train import evaluate_loss

    groups = np.array([0] * 9 + [1])
    value = np.array([1.0] * 9 + [3.0], np.float32)

    def batch(rows, rng):
        return torch.from_numpy(value[rows])[:, None], None, None

    class Same(torch.nn.Module):
        def forward(self, x, q):
            return x

    def loss(out, target):
        return out.mean()

    idx = np.arange(10)
    assert evaluate_loss(Same(), batch, loss, idx, 4, CPU, groups) == pytest.approx(4.0)
    assert evaluate_loss(Same(), batch, loss, idx, 4, CPU) == pytest.approx(1.2)


def test_by_encoder_overrides_one_encoders_training_setup():
    from robustbench_fm.methods.spar.stage import setup_for

    base = spar_run.Setup()
    own = setup_for(base, {"batch_size": 32, "max_epochs": 80, "hidden": 256, "lr_search": [5e-3], "lr": 5e-3})
    assert (own.train.batch_size, own.train.max_epochs, own.train.patience) == (32, 80, base.train.patience)
    assert own.train.lr == 5e-3 and base.train.lr == 1e-4
    assert (own.hidden, own.lr_search, own.d_model) == (256, (5e-3,), base.d_model)
    assert setup_for(base, {}) == base


def test_canonical_view_tokens_know_the_transform_in_domain_only():
    """Issue 42 item 6: the canonical backbone's Level 3 tokens come from the usual positions only.
    Known (in domain), a flipped view reverses the x ranks and carries its transform one-hot;
    unknown (zero-shot), the original and flipped views get identical tokens and asked entries, so
    a head must answer both forms alike (chance on relative position). Distance ranks never move."""
    from robustbench_fm.methods.spar.models import canonical_geometry, canonical_view_tokens

    mean_xy = np.stack([np.linspace(0.1, 0.9, 16), np.linspace(0.2, 0.8, 16) ** 2], -1)
    views = pd.DataFrame({"slice_row": [0, 0], "transform": ["none", "hflip"]})
    _, x_known, d_known, _, t_known = canonical_geometry(mean_xy, views, known=True)
    _, x_unknown, d_unknown, _, t_unknown = canonical_geometry(mean_xy, views, known=False)
    np.testing.assert_allclose(x_known[0], np.arange(16) / 15)
    np.testing.assert_allclose(x_known[1], 1 - np.arange(16) / 15)
    np.testing.assert_array_equal(x_unknown[0], x_unknown[1])
    np.testing.assert_array_equal(d_known, d_unknown)
    assert t_known.tolist() == [0, 1] and t_unknown.tolist() == [-1, -1]
    known, unknown = canonical_view_tokens(mean_xy, views, True), canonical_view_tokens(mean_xy, views, False)
    assert not np.array_equal(known[0], known[1])
    np.testing.assert_array_equal(unknown[0], unknown[1])
    assert (unknown[:, 0, :5] == 0).all() and known[1, 0, 1] == 1.0  # the transform one-hot, signed
