"""Every mode PIL decodes an image to, in RGB as a viewer shows it (`viewer_rgb`), against a conversion written here
from the definition in float64 numpy; the modes distill refuses are refused with the reason and the fix."""

from __future__ import annotations

import colorsys
import io

import numpy as np
import pytest
from PIL import Image

from distill.image_modes import viewer_rgb
from distill.images import ImageRef
from tests.helpers.images import GREY, GREY_ALPHA, RGB, RGBA, chunk, png_bytes

SIDE = 24


def _opened(data: bytes) -> Image.Image:
    image = Image.open(io.BytesIO(data))
    image.load()
    return image


def _saved(image: Image.Image, format: str, **options) -> bytes:
    buffer = io.BytesIO()
    image.save(buffer, format=format, **options)
    return buffer.getvalue()


def _shown(image: Image.Image) -> np.ndarray:
    shown = viewer_rgb(image)
    assert shown.mode == "RGB"
    return np.asarray(shown).astype(np.int64)


def _grey_rgb(grey: np.ndarray) -> np.ndarray:
    return np.repeat(grey[..., None], 3, axis=-1).astype(np.int64)


def _over_white(colour: np.ndarray, alpha: np.ndarray) -> np.ndarray:
    """The definition of compositing over white: c * a + 255 * (1 - a), a = alpha / 255, rounded."""
    a = alpha.astype(np.float64)[..., None] / 255.0
    return np.round(colour.astype(np.float64) * a + 255.0 * (1.0 - a)).astype(np.int64)


def _scaled16(values: np.ndarray) -> np.ndarray:
    return np.round(values.astype(np.float64) * 255.0 / 65535.0).astype(np.int64)


def _gradient16() -> np.ndarray:
    """SIDE x SIDE 16-bit values: a ramp over the whole range, and the values where rounding turns (v = 257 k +- 128)."""
    ramp = np.linspace(0, 65535, SIDE * SIDE).round().astype(np.int64)
    ramp[:6] = [0, 1, 128, 129, 32767, 65535]
    return ramp.reshape(SIDE, SIDE).astype(np.uint16)


def test_a_16_bit_grey_png_is_scaled_by_the_range_of_16_bits_not_clipped():
    values = _gradient16()
    image = _opened(_saved(Image.fromarray(values), "PNG"))
    assert image.mode == "I;16"
    shown = _shown(image)
    assert np.array_equal(shown, _grey_rgb(_scaled16(values)))
    assert (np.asarray(image.convert("RGB")) == 255).mean() > 0.95  # what a bare convert("RGB") shows: white
    assert shown[..., 0].min() == 0 and shown[..., 0].max() == 255 and 100 < shown.mean() < 155


@pytest.mark.parametrize("mode, dtype", [("I;16B", ">u2"), ("I;16L", "<u2")])
def test_16_bit_grey_of_either_byte_order_is_scaled_alike(mode, dtype):
    values = _gradient16()
    image = Image.frombytes(mode, (SIDE, SIDE), values.astype(dtype).tobytes())
    assert np.array_equal(_shown(image), _grey_rgb(_scaled16(values)))


def test_a_16_bit_grey_png_with_a_transparent_value_shows_white_there():
    values = _gradient16()
    transparent = int(values[3, 5])
    data = png_bytes(values, GREY, 16, before_data=chunk(b"tRNS", transparent.to_bytes(2, "big")))
    alpha = np.where(values == transparent, 0, 255)
    expected = _over_white(_grey_rgb(_scaled16(values)), alpha)
    shown = _shown(_opened(data))
    assert np.array_equal(shown, expected) and (shown[3, 5] == 255).all()


def test_16_bit_colour_pngs_keep_their_top_8_bits_within_1_of_the_exact_scaling():
    rng = np.random.default_rng(0)
    rgb = rng.integers(0, 65536, (SIDE, SIDE, 3)).astype(np.uint16)
    shown = _shown(_opened(png_bytes(rgb, RGB, 16)))
    assert np.array_equal(shown, rgb.astype(np.int64) >> 8)  # PIL decodes a 16-bit sample to its top byte
    assert np.abs(shown - _scaled16(rgb)).max() <= 1
    rgba = rng.integers(0, 65536, (SIDE, SIDE, 4)).astype(np.uint16)
    shown = _shown(_opened(png_bytes(rgba, RGBA, 16)))
    assert np.array_equal(shown, _over_white(rgba[..., :3] >> 8, rgba[..., 3] >> 8))
    grey_alpha = rng.integers(0, 65536, (SIDE, SIDE, 2)).astype(np.uint16)
    shown = _shown(_opened(png_bytes(grey_alpha, GREY_ALPHA, 16)))
    assert np.array_equal(shown, _over_white(_grey_rgb(grey_alpha[..., 0] >> 8), grey_alpha[..., 1] >> 8))


def test_a_32_bit_integer_image_is_read_as_16_bit_when_its_values_fit_and_refused_otherwise():
    values = _gradient16().astype(np.int32)
    image = _opened(_saved(Image.fromarray(values), "TIFF"))
    assert image.mode == "I"
    assert np.array_equal(_shown(image), _grey_rgb(_scaled16(values)))
    values[0, 0] = 70000
    with pytest.raises(ValueError, match=r"mode 'I'\) with values from \d+ to 70000, outside 16 bits .*save it as an 8- "
                                         "or 16-bit image"):
        viewer_rgb(Image.fromarray(values))
    values[0, 0] = -1
    with pytest.raises(ValueError, match="values from -1 to"):
        viewer_rgb(Image.fromarray(values))


def test_a_float_image_reads_0_as_black_and_1_as_white_and_other_values_are_refused():
    rng = np.random.default_rng(1)
    values = rng.random((SIDE, SIDE)).astype(np.float32)
    values[0, :2] = [0.0, 1.0]
    image = _opened(_saved(Image.fromarray(values), "TIFF"))
    assert image.mode == "F"
    expected = np.round(values.astype(np.float64) * 255.0).astype(np.int64)
    assert np.array_equal(_shown(image), _grey_rgb(expected))
    with pytest.raises(ValueError, match=r"float image \(mode 'F'\) with values from 0 to 255, and a float image is read as 0 \(black\) to 1 \(white\); "
                                         "scale it into 0..1, or save it as an 8-bit image"):
        viewer_rgb(Image.fromarray((values * 255).round().astype(np.float32)))
    values[1, 1] = np.nan
    with pytest.raises(ValueError, match="and values that are not finite"):
        viewer_rgb(Image.fromarray(values))


def _palette_image(rng) -> tuple[Image.Image, np.ndarray, np.ndarray]:
    indices = rng.integers(0, 8, (SIDE, SIDE)).astype(np.uint8)
    palette = rng.integers(0, 256, (8, 3)).astype(np.uint8)
    image = Image.fromarray(indices, "P")
    image.putpalette(palette.reshape(-1).tolist())
    return image, indices, palette


def test_a_palette_png_with_alphas_per_entry_and_a_gif_with_a_transparent_index_are_composited_over_white():
    rng = np.random.default_rng(2)
    image, indices, palette = _palette_image(rng)
    alphas = np.array([0, 40, 128, 255, 255, 7, 200, 255], dtype=np.uint8)
    shown = _shown(_opened(_saved(image, "PNG", transparency=alphas.tobytes())))
    assert np.array_equal(shown, _over_white(palette[indices], alphas[indices]))
    shown = _shown(_opened(_saved(image, "GIF", transparency=2)))  # one transparent index
    assert np.array_equal(shown, _over_white(palette[indices], np.where(indices == 2, 0, 255)))
    opaque = _shown(_opened(_saved(image, "PNG")))  # no transparency: each index its colour
    assert np.array_equal(opaque, palette[indices].astype(np.int64))


def test_grey_with_alpha_and_rgba_are_composited_over_white_and_opaque_pixels_keep_their_values():
    rng = np.random.default_rng(3)
    rgba = rng.integers(0, 256, (SIDE, SIDE, 4)).astype(np.uint8)
    rgba[0, :3, 3] = [0, 255, 1]
    shown = _shown(_opened(_saved(Image.fromarray(rgba, "RGBA"), "PNG")))
    assert np.array_equal(shown, _over_white(rgba[..., :3], rgba[..., 3]))
    assert (shown[0, 0] == 255).all() and np.array_equal(shown[0, 1], rgba[0, 1, :3])
    grey_alpha = rgba[..., 1:3].copy()
    shown = _shown(_opened(_saved(Image.fromarray(grey_alpha, "LA"), "PNG")))
    assert np.array_equal(shown, _over_white(_grey_rgb(grey_alpha[..., 0]), grey_alpha[..., 1]))
    opaque = rgba.copy()
    opaque[..., 3] = 255
    assert np.array_equal(_shown(Image.fromarray(opaque, "RGBA")), opaque[..., :3].astype(np.int64))


def test_premultiplied_alpha_is_composited_over_white():
    rng = np.random.default_rng(4)
    alpha = rng.integers(0, 256, (SIDE, SIDE)).astype(np.int64)
    colour = rng.integers(0, 256, (SIDE, SIDE, 3)).astype(np.int64)
    premultiplied = np.round(colour * alpha[..., None] / 255.0)  # what RGBa holds: each colour times a / 255
    data = np.concatenate([premultiplied, alpha[..., None]], axis=-1).astype(np.uint8)
    # Over white: c * a / 255 + 255 - a, with the first term what the image holds.
    assert np.array_equal(_shown(Image.frombytes("RGBa", (SIDE, SIDE), data.tobytes())), premultiplied.astype(np.int64) + 255 - alpha[..., None])
    grey = data[..., [0, 3]]
    expected = _grey_rgb(grey[..., 0].astype(np.int64) + 255 - grey[..., 1])
    assert np.array_equal(_shown(Image.frombytes("La", (SIDE, SIDE), grey.tobytes())), expected)


def test_a_cmyk_jpeg_is_converted_by_the_cmyk_formula():
    rng = np.random.default_rng(5)
    cmyk = rng.integers(0, 256, (SIDE, SIDE, 4)).astype(np.uint8)
    image = _opened(_saved(Image.fromarray(cmyk, "CMYK"), "JPEG", quality=95))
    assert image.mode == "CMYK"
    decoded = np.asarray(image).astype(np.float64)  # the file's CMYK samples, as its decoder gives them
    expected = np.round((255.0 - decoded[..., :3]) * (255.0 - decoded[..., 3:]) / 255.0).astype(np.int64)
    assert np.array_equal(_shown(image), expected)


def test_ycbcr_is_converted_by_the_jpeg_matrix_within_1():
    rng = np.random.default_rng(6)
    ycbcr = rng.integers(0, 256, (SIDE, SIDE, 3)).astype(np.uint8)
    y, cb, cr = (ycbcr[..., i].astype(np.float64) for i in range(3))
    exact = np.stack([y + 1.402 * (cr - 128), y - 0.344136 * (cb - 128) - 0.714136 * (cr - 128), y + 1.772 * (cb - 128)], -1)
    expected = np.clip(np.round(exact), 0, 255)
    # PIL converts in fixed point, as JPEG decoders do: within 1 of the exact matrix.
    assert np.abs(_shown(Image.fromarray(ycbcr, "YCbCr")) - expected).max() <= 1


def test_hsv_bilevel_grey_and_rgb_are_converted_as_their_definitions_say():
    rng = np.random.default_rng(7)
    hsv = rng.integers(0, 256, (SIDE, SIDE, 3)).astype(np.uint8)
    expected = np.array([[colorsys.hsv_to_rgb(*(pixel / 255.0)) for pixel in row] for row in hsv.astype(np.float64)])
    assert np.array_equal(_shown(Image.fromarray(hsv, "HSV")), np.round(expected * 255.0).astype(np.int64))
    bits = rng.integers(0, 2, (SIDE, SIDE)).astype(bool)
    assert np.array_equal(_shown(_opened(_saved(Image.fromarray(bits), "PNG"))), _grey_rgb(bits.astype(np.int64) * 255))
    grey = rng.integers(0, 256, (SIDE, SIDE)).astype(np.uint8)
    assert np.array_equal(_shown(_opened(_saved(Image.fromarray(grey), "PNG"))), _grey_rgb(grey))
    rgb = rng.integers(0, 256, (SIDE, SIDE, 3)).astype(np.uint8)  # the common case: the very values, unchanged
    assert np.array_equal(_shown(_opened(_saved(Image.fromarray(rgb), "PNG"))), rgb.astype(np.int64))
    padded = np.concatenate([rgb, np.zeros((SIDE, SIDE, 1), np.uint8)], -1)
    assert np.array_equal(_shown(Image.frombytes("RGBX", (SIDE, SIDE), padded.tobytes())), rgb.astype(np.int64))


def test_a_lab_image_is_refused_saying_how_to_convert_it():
    with pytest.raises(ValueError, match=r"CIE L\*a\*b\* image \(mode 'LAB'\).*convert it to sRGB"):
        viewer_rgb(Image.new("LAB", (4, 4)))


def _quadrants(width: int, height: int) -> np.ndarray:
    """An image whose every quarter is another colour (turns and flips all show)."""
    pixels = np.zeros((height, width, 3), np.uint8)
    pixels[: height // 2, : width // 2] = (255, 0, 0)
    pixels[: height // 2, width // 2:] = (0, 255, 0)
    pixels[height // 2:, : width // 2] = (0, 0, 255)
    pixels[height // 2:, width // 2:] = (255, 255, 0)
    return pixels


@pytest.mark.parametrize("orientation, turns", [(6, -1), (8, 1), (3, 2), (1, 0)])
def test_an_exif_orientation_turns_the_picture_upright(orientation, turns):
    exif = Image.Exif()
    exif[0x0112] = orientation
    data = _saved(Image.fromarray(_quadrants(40, 24)), "JPEG", quality=95, exif=exif)
    stored = np.asarray(_opened(data).convert("RGB")).astype(np.int64)  # the samples as the file stores them
    expected = np.rot90(stored, k=turns)  # 6: turned 90 degrees clockwise to be upright, 8: counter-clockwise
    assert np.array_equal(_shown(_opened(data)), expected)
    ref = ImageRef(data=data)
    assert ref.check() == (expected.shape[1], expected.shape[0])  # the size the processor sees: 24 x 40 for 6 and 8
    assert np.array_equal(np.asarray(ref.load()), expected)


def test_an_exif_orientation_applies_before_the_mode_conversion():
    values = _gradient16()[:, : SIDE // 2]
    exif = Image.Exif()
    exif[0x0112] = 6
    image = _opened(_saved(Image.fromarray(values), "PNG", exif=exif))
    assert image.mode == "I;16"
    assert np.array_equal(_shown(image), _grey_rgb(np.rot90(_scaled16(values), k=-1)))


def test_a_damaged_exif_block_gives_the_picture_as_stored():
    cut = b"Exif\x00\x00MM\x00\x2a\x00\x00\x00\x08\x00\x05\x01\x12\x00\x03"  # an orientation entry cut short
    with pytest.warns(UserWarning, match="Corrupt EXIF data"):  # PIL reads it as no EXIF, saying so
        data = _saved(Image.fromarray(_quadrants(40, 24)), "JPEG", quality=95, exif=cut)
        stored = np.asarray(_opened(data).convert("RGB")).astype(np.int64)
        assert np.array_equal(_shown(_opened(data)), stored)
