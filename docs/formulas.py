"""Formulas as MathML when the site is built: pymdownx.arithmatex's `\\( \\)` and `\\[ \\]` become <math> elements
(latex2mathml), which browsers render natively, so the site shows its formulas offline, with no script. Used by
docs/hooks.py; a test converts every formula of the guides (it needs latex2mathml, in the test and docs extras)."""

from __future__ import annotations

import html
import re

from latex2mathml.converter import convert

FORMULA = re.compile(r'<(span|div) class="arithmatex">(.*?)</\1>', re.S)


def mathml(content: str, where: str) -> str:
    """`content` with every arithmatex formula as MathML (a display formula as a block); a formula latex2mathml
    cannot read is an error naming the page."""
    def one(match: re.Match) -> str:
        tag, body = match.groups()
        tex = html.unescape(body).strip()
        if tex[:2] in ("\\(", "\\["):
            tex = tex[2:-2]
        try:
            return convert(tex, display="block" if tag == "div" else "inline")
        except Exception as error:  # noqa: BLE001  (any failure of the converter stops the build, named)
            raise ValueError(f"{where}: the formula {tex[:60]!r} cannot be rendered as MathML: {error}") from None

    return FORMULA.sub(one, content)
