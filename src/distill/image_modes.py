"""A decoded image in 8-bit RGB as an image viewer shows it (`viewer_rgb`), whatever mode its file decodes to.

Image processors take 8-bit RGB. PIL's `convert("RGB")` gets there for most modes, but not as a viewer shows them:
it clips a 16-bit image's values to 0..255 (almost all of the picture turns white), drops an alpha channel (the
colours under transparent pixels show), and ignores an EXIF orientation (a phone photo lies on its side). So every
image distill reads, at the start checks and when a micro-batch needs its pixels, goes through `viewer_rgb`.
"""

from __future__ import annotations

from typing import Any

EXIF_ORIENTATION = 0x0112
SIXTEEN_BIT = ("I;16", "I;16L", "I;16B", "I;16N")  # unsigned 16-bit grey, of either byte order
CONVERTED_BY_PIL = ("1", "L", "P", "RGB", "RGBX", "CMYK", "YCbCr", "HSV")
PREMULTIPLIED = ("La", "RGBa")
BACKGROUND = 255  # transparent pixels are shown over white


class RefusedImage(ValueError):
    """An image `viewer_rgb` would show wrongly: `reason` says why, `fix` what to do about it."""

    def __init__(self, reason: str, fix: str):
        super().__init__(f"{reason}; {fix}")
        self.reason, self.fix = reason, fix


def viewer_rgb(image: Any) -> Any:
    """`image` (a PIL image, decoded) in 8-bit RGB as an image viewer shows it; `RefusedImage` (a ValueError) saying
    why and what to do for an image it would show wrongly.

    First the EXIF orientation (tag 274, or the XMP one) is applied, as `ImageOps.exif_transpose` does: orientations
    2-8 flip and/or turn the picture upright (6: turned 90 degrees clockwise to be upright; 8: counter-clockwise),
    so width and height swap for 5-8; a damaged EXIF block gives no orientation, as viewers treat it. Then, by mode
    (PIL's names):

    - RGB: as it is. 16-bit RGB files (PNG, TIFF) are decoded by PIL to their top 8 bits (v >> 8, within 1 of
      v * 255 / 65535).
    - 1 (bilevel), L (8-bit grey), P (palette), RGBX, CMYK, YCbCr, HSV: PIL's conversion. Grey is copied to the
      three channels; a palette index becomes its colour; CMYK becomes R = round((255 - C)(255 - K) / 255) (and so
      on for G, B; an embedded ICC profile is not applied); YCbCr by JPEG's (BT.601 full-range) matrix, in fixed
      point as JPEG decoders do (within 1 of the exact matrix); HSV by the hexcone formula.
    - LAB (CIE L*a*b*, a TIFF's CIELab): refused, since PIL's conversion to RGB (a littlecms lookup table) strays
      from the CIE definition by up to a tenth of the range: convert it to sRGB with a colour-managed tool.
    - I;16, I;16L, I;16B, I;16N (16-bit grey: 16-bit PNGs, TIFFs): scaled by the range of 16 bits,
      v -> round(v * 255 / 65535), then grey to RGB.
    - I (32-bit signed integers: PIL's mode for 16-bit samples it holds in 32 bits, or a 32-bit TIFF): when every
      value lies in 0..65535, as 16-bit grey; otherwise refused (a 32-bit integer image has no range a viewer agrees
      on): save it as an 8- or 16-bit image.
    - F (32-bit float): values in 0..1 (the float-image convention: 0 black, 1 white) become round(v * 255), then
      grey to RGB; a value outside 0..1, or not finite, is refused (a float image of 0..255 would otherwise clip to
      white): scale it into 0..1, or save it as an 8-bit image.
    - With transparency: LA, PA, RGBA, and P, L, RGB or 16-bit grey with a transparent colour or palette alphas
      (PNG's tRNS, GIF's transparent index): composited over white, c -> round(c * a / 255 + 255 * (1 - a / 255))
      per channel (a: the alpha, 0..255). White, not black, because that is what a page shows under a transparent
      picture; a fully opaque image keeps its exact values.
    - La, RGBa (premultiplied alpha, in-memory PIL images only): over white, c -> c + 255 - a.
    - Any other mode: refused, naming it.

    Multi-frame files (an animated GIF or PNG, a multi-page TIFF) give their first frame, as PIL opens it.
    """
    image = _upright(image)
    mode = image.mode
    if mode in SIXTEEN_BIT or mode == "I":
        return _grey_as_rgb(*_scaled_integer_grey(image))
    if mode == "F":
        return _grey_as_rgb(_scaled_float_grey(image), None)
    if mode in PREMULTIPLIED:
        return _premultiplied_over_white(image)
    if image.has_transparency_data:
        return _over_white(image.convert("RGBA"))
    if mode in CONVERTED_BY_PIL:
        return image.convert("RGB")
    if mode == "LAB":
        raise RefusedImage("it is a CIE L*a*b* image (mode 'LAB'), which PIL converts to RGB only approximately",
                           "convert it to sRGB (an RGB PNG or JPEG) with a colour-managed tool")
    raise RefusedImage(f"its mode {mode!r} is not one distill converts to RGB", "save it as an RGB (or grey) PNG or JPEG")


def _upright(image: Any) -> Any:
    """`image` turned by its EXIF orientation (the image itself when it has none, or orientation 1)."""
    from PIL import ImageOps

    if image.getexif().get(EXIF_ORIENTATION, 1) == 1:  # PIL reads a damaged EXIF block as empty (with a warning)
        return image
    return ImageOps.exif_transpose(image)


def _scaled_integer_grey(image: Any):
    """(grey 0..255 as uint8 H x W, alpha 0/255 or None) of a 16-bit grey image (or an `I` image whose values fit
    16 bits), v -> round(v * 255 / 65535); its transparent grey value (PNG's tRNS), when it has one, gets alpha 0."""
    import numpy as np

    values = np.asarray(image).astype(np.int64)
    if image.mode == "I" and values.size and (values.min() < 0 or values.max() > 65535):
        raise RefusedImage(f"it is a 32-bit integer image (mode 'I') with values from {values.min()} to {values.max()}, "
                           "outside 16 bits (0..65535), so it has no range to scale to 8 bits",
                           "save it as an 8- or 16-bit image (PNG)")
    grey = ((values * 255 + 32767) // 65535).astype(np.uint8)  # round(v * 255 / 65535): the quotient is never n + 1/2
    transparent = image.info.get("transparency")
    alpha = None if not isinstance(transparent, int) else np.where(values == transparent, 0, 255).astype(np.uint8)
    return grey, alpha


def _scaled_float_grey(image: Any):
    """Grey 0..255 (uint8 H x W) of a float image of values in 0..1, v -> round(v * 255)."""
    import numpy as np

    values = np.asarray(image).astype(np.float64)
    if values.size and not (np.isfinite(values).all() and values.min() >= 0.0 and values.max() <= 1.0):
        finite = values[np.isfinite(values)]
        seen = (f"values from {finite.min():g} to {finite.max():g}" if finite.size else "no finite value") + (
            "" if finite.size == values.size else ", and values that are not finite")
        raise RefusedImage(f"it is a float image (mode 'F') with {seen}, and a float image is read as 0 (black) to 1 "
                           "(white)", "scale it into 0..1, or save it as an 8-bit image")
    return np.rint(values * 255.0).astype(np.uint8)


def _grey_as_rgb(grey, alpha) -> Any:
    from PIL import Image

    if alpha is None:
        return Image.fromarray(grey, "L").convert("RGB")
    return _over_white(Image.merge("RGBA", [Image.fromarray(grey, "L")] * 3 + [Image.fromarray(alpha, "L")]))


def _over_white(rgba: Any) -> Any:
    """An RGBA image composited over opaque white, in RGB (PIL's `alpha_composite`: exact for an opaque background)."""
    from PIL import Image

    white = Image.new("RGBA", rgba.size, (BACKGROUND, BACKGROUND, BACKGROUND, 255))
    return Image.alpha_composite(white, rgba).convert("RGB")


def _premultiplied_over_white(image: Any) -> Any:
    """A premultiplied-alpha image (La, RGBa: each colour already times a / 255) over white: c + 255 - a."""
    import numpy as np
    from PIL import Image

    values = np.asarray(image).astype(np.int64)
    colour, alpha = values[..., :-1], values[..., -1:]
    shown = np.clip(colour + BACKGROUND - alpha, 0, 255).astype(np.uint8)
    if shown.shape[-1] == 1:
        return Image.fromarray(shown[..., 0], "L").convert("RGB")
    return Image.fromarray(shown, "RGB")
