"""MkDocs hooks (mkdocs.yml: `hooks`): the generated reference pages (`reference_pages.PAGES`) join the site
when it is built, so they always describe the code being documented."""

from __future__ import annotations

import sys
from pathlib import Path

from mkdocs.structure.files import File

sys.path.insert(0, str(Path(__file__).parent))

from reference_pages import PAGES  # noqa: E402


ROOT = Path(__file__).resolve().parents[1]


def on_files(files, config):
    for path, render in PAGES.items():
        files.append(File.generated(config, path, content=render()))
    for picture in sorted((ROOT / "benchmarks" / "results").glob("*.png")):  # the guides show the benchmarks' plots
        files.append(File.generated(config, f"benchmarks/results/{picture.name}", abs_src_path=str(picture)))
    return files
