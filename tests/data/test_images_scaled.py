"""Scaled JPEG decoding (robustbench_fm/data/images.py, issue 44): the DCT scale chosen for a
resize target is the largest that still leaves the target on the side the resize uses (checked on
libjpeg's actual decodes, and for every registered encoder's preprocessing), crop margins in
full-resolution pixels select exactly the same source pixels, every other format and
``need=None`` decode at full size, and the pixels after the resize stay within three grey levels
of the exact path's (mean under half a level)."""
from __future__ import annotations

import numpy as np
import pytest
from PIL import Image

from robustbench_fm import encoders
from robustbench_fm.core.errors import InvalidSetting
from robustbench_fm.data.images import (
    DRAFT_SCALES,
    REDUCING_GAP,
    Need,
    check_decode,
    draft_scale,
    need_of,
    read_image,
)


def _film(path, w: int, h: int, seed: int = 0, mode: str = "L", quality: int = 90) -> None:
    """A smooth film (a coarse random grid upsampled bicubic), JPEG: what chest films look like to libjpeg."""
    rng = np.random.default_rng(seed)
    shape = (max(2, h // 64), max(2, w // 64)) + ((3,) if mode == "RGB" else ())
    Image.fromarray(rng.integers(0, 256, shape, dtype=np.uint8)).resize((w, h), Image.BICUBIC).save(
        path, quality=quality)


def _meets(size, need: Need, gap: int = 1) -> bool:
    return min(size) >= gap * need.short and max(size) >= gap * need.long


@pytest.mark.parametrize("w,h", [(2048, 2500), (2048, 2048), (1001, 777), (3000, 1000), (512, 640), (456, 448)])
@pytest.mark.parametrize("need", [Need(short=224), Need(short=256), Need(short=518), Need(long=224),
                                  Need(short=448), Need(short=900)])
def test_the_scale_is_the_largest_whose_decode_still_holds_the_target(tmp_path, w, h, need):
    """libjpeg's decode at the chosen scale holds twice the target (none is used that would make
    the resize upsample, or leave it nearly nothing to filter); at the next larger reduction it
    would not (no scale is left on the table)."""
    _film(tmp_path / "f.jpg", w, h)
    d = draft_scale((w, h), need)
    im = read_image(tmp_path, {"path": "f.jpg"}, need)
    assert im.size == (-(-w // d), -(-h // d))
    assert _meets(im.size, need) or d == 1  # a film already smaller than the target: as it is
    assert _meets(im.size, need, REDUCING_GAP) or d == 1  # and twice the target (Pillow's reducing gap)
    s = 2 * d
    if s in DRAFT_SCALES:  # the next reduction is off the image's block grid or leaves less than twice the target
        assert w % s or h % s or not _meets((w // s, h // s), need, REDUCING_GAP)
    if d == 1:
        assert im.size == (w, h)


def test_every_registered_encoder_resizes_down_from_a_scaled_decode(tmp_path):
    """For each image encoder's preprocessing, the scaled decode of a 2,048 x 2,500 film leaves at
    least what its resize writes on the side it uses: the short side >= the resize size (shorter
    side + crop; squash both sides), the long side >= the input (longest side + pad). Fails if the
    rule ever lets an encoder upsample a decode it would have shrunk at full size."""
    _film(tmp_path / "f.jpg", 2048, 2500)
    cache = {}
    for name in encoders.names():
        spec = encoders.get(name)
        if spec.resize == "none":
            continue
        p = spec.preprocessing()
        need = need_of(p["resize"], p["input_size"], p["resize_size"])
        if need not in cache:
            cache[need] = read_image(tmp_path, {"path": "f.jpg"}, need).size
        w, h = cache[need]
        if p["resize"] == "longest_pad":
            assert max(w, h) >= p["input_size"], name
        elif p["resize"] == "squash":
            assert min(w, h) >= p["input_size"], name
        else:
            assert min(w, h) >= p["resize_size"], name
        assert (w, h) != (2048, 2500) or REDUCING_GAP * max(need.short, need.long) > 1024, name  # scaled when it can


def test_need_of_reads_each_resize_rule():
    assert need_of("shorter_center_crop", 224, 256) == Need(short=256)
    assert need_of("shorter_center_crop", 224, None) == Need(short=224)
    assert need_of("squash", 384) == Need(short=384)
    assert need_of("longest_pad", 518) == Need(long=518)
    assert draft_scale((4000, 4000), None) == 1
    with pytest.raises(InvalidSetting, match="extract.decode='fast'"):
        check_decode("fast")


@pytest.mark.parametrize("margins", [(20, 0, 0, 20), (8, 16, 24, 32), (3, 0, 0, 0), (0, 0, 5, 0), (0, 4, 0, 0)])
def test_crop_margins_select_the_same_source_pixels_at_every_scale(tmp_path, margins):
    """A crop box on the scale's block grid is divided by it; off the grid a smaller scale is
    used. Either way the scaled, cropped image is the scaled decode of exactly the cropped region:
    equal to a crop of the uncropped scaled decode at ``margin / d`` and, resized, within two grey
    levels of the exact crop resized the same way."""
    w, h = 2000, 1600
    _film(tmp_path / "f.jpg", w, h, seed=4)
    left, top, right, bottom = margins
    row = {"path": "f.jpg", "crop_left": left, "crop_top": top, "crop_right": right, "crop_bottom": bottom}
    need = Need(short=150)
    d = draft_scale((w, h), need, margins)
    for m in (left, top):
        assert m % d == 0
    if right:
        assert (w - right) % d == 0
    if bottom:
        assert (h - bottom) % d == 0
    got = read_image(tmp_path, row, need)
    assert got.size == ((w - left - right) // d, (h - top - bottom) // d)
    whole = read_image(tmp_path, {"path": "f.jpg"}, Need(short=(h - top - bottom) // d // REDUCING_GAP))
    assert whole.size == (-(-w // d), -(-h // d))
    np.testing.assert_array_equal(np.asarray(got), np.asarray(whole)[top // d:(h - bottom) // d,
                                                                      left // d:(w - right) // d])
    exact = read_image(tmp_path, row)
    assert exact.size == (w - left - right, h - top - bottom)
    a = np.asarray(exact.resize((150, 150), Image.BICUBIC), dtype=int)
    b = np.asarray(got.resize((150, 150), Image.BICUBIC), dtype=int)
    assert np.abs(a - b).max() <= 2
    assert d == (1 if margins in [(3, 0, 0, 0), (0, 0, 5, 0)] else 4)  # 2000 - 5 is odd; 4: 20 and 8/16/24/32


def test_other_formats_and_no_need_decode_at_full_size(tmp_path):
    _film(tmp_path / "f.jpg", 1200, 1000)
    Image.open(tmp_path / "f.jpg").save(tmp_path / "f.png")
    exact = read_image(tmp_path, {"path": "f.jpg"})
    with Image.open(tmp_path / "f.jpg") as im:
        np.testing.assert_array_equal(np.asarray(exact), np.asarray(im.convert("L")))
    assert read_image(tmp_path, {"path": "f.png"}, Need(short=64)).size == (1200, 1000)
    assert read_image(tmp_path, {"path": "f.jpg"}, Need(short=64)).size == (300, 250)  # 1/8 leaves < 2 x 64


@pytest.mark.parametrize("mode,size", [("L", (2048, 2500)), ("RGB", (1024, 1024)), ("L", (3000, 2400)),
                                       ("L", (2048, 2504))])
def test_pixels_after_the_resize_stay_within_three_grey_levels(tmp_path, mode, size):
    """The agreement the default rests on (docs/datasets.md "Scaled decoding"): decoded at the
    DCT scale then resized to 224 bicubic against the full decode resized the same way. 2,048 x
    2,500 decodes at 1/4 (2,500 is off the 1/8 grid: a partial last block there shifted the
    geometry, 20 grey levels), 2,048 x 2,504 at 1/8."""
    _film(tmp_path / "f.jpg", *size, seed=7, mode=mode)
    need = need_of("squash", 224)
    a = np.asarray(read_image(tmp_path, {"path": "f.jpg"}).resize((224, 224), Image.BICUBIC), dtype=int)
    b = np.asarray(read_image(tmp_path, {"path": "f.jpg"}, need).resize((224, 224), Image.BICUBIC), dtype=int)
    assert read_image(tmp_path, {"path": "f.jpg"}, need).size[0] < size[0]  # the scaled path ran
    assert np.abs(a - b).max() <= 3 and np.abs(a - b).mean() < 0.5
