"""SPAR heads read each backbone's native token sequence by default (spar.md Section 3.2:
"Transformer heads read the full token sequence"); pooled grids are the named ablation; frozen
tokens are cached in half precision, written batch by batch."""
import numpy as np
import pandas as pd
import pytest
import torch
from store_cf22284.make_fixture import Tokens  # tokens = each image row's mean / 255 (a closed form), counting calls

import robustbench_fm.encoders as enc
import robustbench_fm.features.recipe as recipe_mod
from robustbench_fm.features import entry as fmt
from robustbench_fm.features import verify_cache
from robustbench_fm.methods.spar.models import Backbone
from robustbench_fm.methods.spar.params import SparParams
from robustbench_fm.methods.spar.run import EncoderRun, Setup, cached_tokens
from robustbench_fm.methods.spar.samples import SparSamples

CPU = torch.device("cpu")
# a ViT with a 16 x 16 patch grid (64 px, patch 4): larger than the old 7 x 7 / 2 x 2 pooled defaults
VIT16 = dict(pretrained=False, seed=0, input_size=64, arch_kwargs={"img_size": 64, "depth": 1, "embed_dim": 8,
                                                                  "num_heads": 2, "patch_size": 4})


def _vit():
    return enc.load(enc.get("vit_b32_in1k").replace(**VIT16), device="cpu")


def _tile_samples(n=3, size=16) -> SparSamples:
    rng = np.random.default_rng(0)
    present = np.ones((n, 16), bool)
    table = pd.DataFrame({"sample_id": [f"s{i}" for i in range(n)], "subject_id": "p", "split": "train",
                          "dataset": "word", "z": 0, "n_present": 16})
    return SparSamples(table, rng.integers(0, 255, (n, 16, size, size), dtype=np.uint8), present,
                       np.full((n, 16, 2), 0.5, np.float32), np.full((n, 16, 2), 112.0, np.float32),
                       np.tile(np.arange(16), (n, 1)), np.zeros((0, size, size), np.uint8), table.iloc[:0],
                       pd.DataFrame())


def test_defaults_read_the_native_sequence_and_pooling_is_the_ablation():
    assert SparParams().token_grid == 0 and SparParams().tile_token_grid == 0
    assert Setup().token_grid == 0 and Setup().tile_token_grid == 0
    x = torch.randint(0, 255, (2, 20, 20), dtype=torch.uint8)
    native = Backbone(_vit())
    tok = native(x)
    assert tok.shape == (2, 1 + 16 * 16, 8)  # CLS + the whole 16 x 16 grid
    with torch.no_grad():
        ref = native.model.forward_features(native.prepare(x))
    assert torch.allclose(tok, ref, atol=1e-6)  # exactly timm's token sequence
    pooled = Backbone(_vit(), token_grid=7)(x)  # the ablation: 7 x 7 average of the same grid
    grid = ref[:, 1:].reshape(2, 16, 16, 8).permute(0, 3, 1, 2)
    want = torch.nn.functional.adaptive_avg_pool2d(grid, 7).flatten(2).transpose(1, 2)
    assert pooled.shape == (2, 50, 8) and torch.allclose(pooled[:, 1:], want, atol=1e-5)


def test_frozen_tile_tokens_of_a_default_run_are_16_native_sequences(tmp_path):
    """Levels 1-2 with the default setup: 16 tiles x (CLS + 256) tokens, not 16 x (CLS + 2 x 2)."""
    s = _tile_samples()
    run = EncoderRun(_vit(), s, {}, Setup(), CPU, tmp_path, "word")
    tokens, _, has_cls = run._frozen_source("localization", "word", s)
    assert has_cls and tokens.shape == (3, 16, 257, 8) and tokens.dtype == np.float16
    ablation = EncoderRun(_vit(), s, {}, Setup(tile_token_grid=2), CPU, tmp_path, "word")
    assert ablation._frozen_source("localization", "word", s)[0].shape == (3, 16, 5, 8)


def test_cached_tokens_round_trip_exactly_and_are_read_back_without_the_backbone(tmp_path):
    images = np.random.default_rng(1).integers(0, 255, (37, 6, 6), dtype=np.uint8)
    want = (images.astype(np.float32).mean(-1, keepdims=True).repeat(3, -1) / 255).astype(np.float16)
    net = Tokens()
    in_memory = cached_tokens(net, lambda r: images[r], 37, "k", None, 8, tiles=False)
    on_disk = cached_tokens(net, lambda r: images[r], 37, "k", tmp_path, 8, tiles=False)
    assert np.array_equal(in_memory, want) and np.array_equal(on_disk, want)
    assert isinstance(on_disk, np.memmap) and net.calls == 2 * 5  # batches of 8 written as they come
    again = cached_tokens(net, lambda r: pytest.fail("read the images again"), 37, "k", tmp_path, 8, tiles=False)
    assert np.array_equal(again, want) and net.calls == 10
    # an array entry (features/entry.py, format "array"): array.npy and its meta.json, no temporary file left
    [folder] = [p for p in tmp_path.iterdir() if p.is_dir()]
    assert sorted(p.name for p in folder.iterdir()) == ["array.npy", "meta.json"]
    assert [p.name for p in tmp_path.iterdir()] == [folder.name]


@pytest.mark.parametrize("bad", [{"token_grid": -1}, {"tile_token_grid": -2}, {"lr_search": [1e-3, 0.0]}])
def test_bad_token_grid_and_lr_search_are_refused(bad):
    with pytest.raises(ValueError, match="stage.params"):
        SparParams.parse(bad)


def _token_entries(cache) -> list[str]:
    return sorted(p.name for p in cache.iterdir() if fmt.is_entry(p))


def test_frozen_tokens_are_keyed_by_the_recipe_not_the_description(tmp_path, monkeypatch):
    """Issue 56 item 2: the token cache is an array entry keyed by the encoder's recipe like every
    feature entry. Editing an encoder's description keeps its cached tokens; a new major version of
    torch (part of every recipe) makes new ones."""
    s = _tile_samples(n=2)
    spec = enc.get("vit_b32_in1k").replace(**VIT16)

    def tokens(**changes):
        run = EncoderRun(enc.load(spec.replace(**changes), device="cpu"), s, {}, Setup(), CPU, tmp_path, "word")
        return np.asarray(run._frozen_source("localization", "word", s)[0])

    first = tokens()
    [key] = _token_entries(tmp_path)
    fields = fmt.open_entry(tmp_path / key).meta.fields
    assert fields["encoder"] == spec.name and fields["library_major"]["torch"] == recipe_mod.library_major("torch")
    assert np.array_equal(tokens(description="edited: a new description"), first)
    assert _token_entries(tmp_path) == [key]  # the same entry served
    real = recipe_mod.library_versions
    monkeypatch.setattr(recipe_mod, "library_versions", lambda: {**real(), "torch": "99.0.0"})
    tokens()
    assert len(_token_entries(tmp_path)) == 2 and key in _token_entries(tmp_path)


def test_verify_reports_a_corrupted_token_file(tmp_path):
    images = np.random.default_rng(1).integers(0, 255, (5, 6, 6), dtype=np.uint8)
    cached_tokens(Tokens(), lambda r: images[r], 5, {"encoder": "tiny", "cohort": "c"}, tmp_path, 2, tiles=False)
    [folder] = _token_entries(tmp_path)
    array = tmp_path / folder / fmt.ARRAY_NAME
    [rep] = verify_cache(tmp_path)
    assert rep.ok and rep.path == tmp_path / folder and rep.n_rows == 5
    data = bytearray(array.read_bytes())
    data[-3] ^= 0x40  # a value of the last token: still a readable array
    array.write_bytes(bytes(data))
    [rep] = verify_cache(tmp_path)
    assert not rep.ok and len(rep.problems) == 1
    assert str(array) in rep.problems[0] and "does not match" in rep.problems[0] and "\n" not in rep.problems[0]
    old = tmp_path / "old-name.npy"  # an array of the earlier layout (no meta.json), truncated
    np.save(old, np.zeros((4, 3), np.float16))
    old.write_bytes(old.read_bytes()[:-5])
    [rep] = [r for r in verify_cache(tmp_path) if r.path == old]
    assert not rep.ok and "truncated" in rep.problems[0]
