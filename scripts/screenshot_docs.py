"""Every page of the built documentation site, photographed in headless Chromium at desktop and phone width.

The strict build catches broken links, not what a reader sees: text cut off at the edge, tables or code running out
of their box, raw TeX, a page wider than the phone. This script opens every page of `site/` (build it first with
`mkdocs build`) from a local server, takes a full-page screenshot at each width, and reports the pages whose content
is wider than the window (horizontal scrolling), the elements that overflow, and any TeX left unrendered. Look at
the screenshots too: the report finds only what can be measured.

    mkdocs build && python scripts/screenshot_docs.py [--out screenshots] [--widths 1280 390]

Needs Chromium (Debian's package `chromium`) and the Python package `playwright` (its own browser download is not
needed: Chromium is launched from /usr/bin/chromium). Prints one line per page and width; exit status 1 when a page
overflows.
"""

from __future__ import annotations

import argparse
import functools
import http.server
import json
import sys
import threading
from pathlib import Path

CHROMIUM_FLAGS = ["--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run", "--disable-background-networking",
                  "--disable-component-update", "--disable-sync"]

# Measured in the page: the document's width against the window's, the elements whose box runs past the window's
# right edge (outside a scrolling container, which is how wide tables and code are meant to be read), and TeX
# delimiters left in the text.
MEASURE = """() => {
  const width = window.innerWidth;
  const scrolls = el => { for (let p = el; p; p = p.parentElement) { const s = getComputedStyle(p);
      if (p !== el && (s.overflowX === 'auto' || s.overflowX === 'scroll')) return true; } return false; };
  const over = [];
  for (const el of document.querySelectorAll('.md-content *')) {
    const r = el.getBoundingClientRect();
    if (r.width > 0 && r.right > width + 1 && !scrolls(el)) over.push(el.tagName.toLowerCase() + (el.className ? '.' +
        String(el.className).split(' ')[0] : '') + ': ' + (el.textContent || '').trim().slice(0, 60));
  }
  const text = document.querySelector('.md-content')?.innerText || '';
  return {document_width: document.documentElement.scrollWidth, window_width: width, overflowing: over.slice(0, 5),
          raw_tex: (text.match(/\\\\(frac|sum|mathrm|log)\\b|\\$\\$/g) || []).length};
}"""


def pages(site: Path) -> list[str]:
    return sorted(str(p.relative_to(site)) for p in site.rglob("index.html") if "assets" not in p.parts)


class QuietHandler(http.server.SimpleHTTPRequestHandler):
    def log_message(self, format, *args) -> None:  # noqa: A002  (the base class's name)
        pass


def serve(site: Path) -> tuple[http.server.ThreadingHTTPServer, int]:
    handler = functools.partial(QuietHandler, directory=str(site))
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    return server, server.server_address[1]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--site", type=Path, default=Path("site"))
    parser.add_argument("--out", type=Path, default=Path("screenshots"))
    parser.add_argument("--widths", type=int, nargs="+", default=[1280, 390])
    parser.add_argument("--chromium", default="/usr/bin/chromium")
    args = parser.parse_args()
    if not (args.site / "index.html").is_file():
        parser.error(f"{args.site}/index.html not found: build the site first (mkdocs build)")
    from playwright.sync_api import sync_playwright

    server, port = serve(args.site)
    report, failed = [], False
    with sync_playwright() as playwright:
        browser = playwright.chromium.launch(executable_path=args.chromium, args=CHROMIUM_FLAGS)
        for width in args.widths:
            page = browser.new_page(viewport={"width": width, "height": 900})
            for path in pages(args.site):
                url = f"http://127.0.0.1:{port}/{path[: -len('index.html')]}"
                page.goto(url, wait_until="load")
                found = page.evaluate(MEASURE)
                name = path[: -len("/index.html")].replace("/", "_") or "home"
                shot = args.out / str(width) / f"{name}.png"
                shot.parent.mkdir(parents=True, exist_ok=True)
                page.screenshot(path=str(shot), full_page=True)
                wide = found["document_width"] > found["window_width"]
                failed |= wide or bool(found["overflowing"]) or bool(found["raw_tex"])
                report.append({"page": path, "width": width, **found})
                print(f"{width:5} {path:45} {'WIDER THAN THE WINDOW ' if wide else ''}"
                      f"{'overflow: ' + '; '.join(found['overflowing']) if found['overflowing'] else ''}"
                      f"{' raw TeX: ' + str(found['raw_tex']) if found['raw_tex'] else ''}".rstrip())
            page.close()
        browser.close()
    server.shutdown()
    (args.out / "report.json").write_text(json.dumps(report, indent=2) + "\n")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
