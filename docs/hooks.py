"""MkDocs hooks (mkdocs.yml: `hooks`): the generated reference pages (`reference_pages.PAGES`) join the site
when it is built, so they always describe the code being documented, and every written page's macros
(`macros.py`: benchmark tables and values from `benchmarks/results/*.json`, the methods' generated sections)
are expanded. Formulas (pymdownx.arithmatex's `\\( \\)` and `\\[ \\]`) become MathML when the site is built
(latex2mathml), which browsers render natively: the site shows its formulas offline, with no script."""

from __future__ import annotations

import sys
from pathlib import Path

from mkdocs.structure.files import File

sys.path.insert(0, str(Path(__file__).parent))

from formulas import mathml  # noqa: E402
from macros import render  # noqa: E402
from reference_pages import PAGES  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]


def on_files(files, config):
    for path, render_page in PAGES.items():
        files.append(File.generated(config, path, content=render_page()))
    for result in sorted((ROOT / "benchmarks" / "results").iterdir()):  # the plots, and the raw JSON
        if result.suffix in (".png", ".json"):                                        # the benchmark page links
            files.append(File.generated(config, f"benchmarks/results/{result.name}", abs_src_path=str(result)))
    return files


def on_page_markdown(markdown, page, config, files):
    return render(markdown, page.file.src_uri)


def on_page_content(content, page, config, files):
    return mathml(content, page.file.src_uri)
