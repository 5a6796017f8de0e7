"""What the start checks of a dataset's images cost: each image decoded whole once (`ImageRef.check`: PIL's
`verify`, a second open and `load`, then `viewer_rgb`), against the header read alone (what the checks did
before) and against the full decode without `verify`.

Two sets of PNGs written to a temporary folder: 10,000 small images (64 x 64, the size of easy-vqa's) and 100
larger ones (512 x 512), each a filled shape on a gradient with some noise (so they compress like drawings, not
like noise). Each way is timed over the whole set, in one process and one thread, `--repeats` times (the best is
reported, in CPU seconds of the process, with the wall seconds beside them; the files are in the page cache after
the first pass, so the times are decoding, not disk reads). The
last two ways run the real start path, `examples_from_dataset` over a JSON Lines file with one row per image (the
rows' own checks included), with each image's header read (before) and with each image decoded (now).

    python benchmarks/image_checks.py                  # about three minutes on one core
    python benchmarks/image_checks.py --small 1000     # a quicker look

Writes benchmarks/results/image_checks.json (with the versions of Python, PIL, numpy, torch and the git commit) and
prints a table.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from pathlib import Path

from provenance import write_result

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "src"))


def write_images(folder: Path, count: int, side: int, seed: int) -> list[Path]:
    """`count` PNGs of `side` x `side`: a shape of a random colour on a gradient, with noise on a tenth of the pixels."""
    import numpy as np
    from PIL import Image, ImageDraw

    rng = np.random.default_rng(seed)
    folder.mkdir(parents=True, exist_ok=True)
    ramp = np.linspace(0, 255, side, dtype=np.float64)
    paths = []
    for i in range(count):
        base = np.stack([np.add.outer(ramp, ramp) / 2, np.tile(ramp, (side, 1)), np.tile(ramp[:, None], (1, side))], -1)
        image = Image.fromarray((base * rng.uniform(0.3, 1.0)).astype(np.uint8), "RGB")
        left, top = rng.integers(0, side // 2, 2)
        ImageDraw.Draw(image).ellipse((left, top, left + side // 3, top + side // 3), fill=tuple(rng.integers(0, 256, 3).tolist()))
        pixels = np.asarray(image).copy()
        noisy = rng.random((side, side)) < 0.1
        pixels[noisy] = rng.integers(0, 256, (int(noisy.sum()), 3))
        path = folder / f"{i:05d}.png"
        Image.fromarray(pixels).save(path)
        paths.append(path)
    return paths


def header_only(paths: list[Path]) -> None:
    from PIL import Image

    for path in paths:
        with Image.open(path) as image:
            image.size  # noqa: B018  (the header is read by open)


def decode_without_verify(paths: list[Path]) -> None:
    from PIL import Image

    from distill.image_modes import viewer_rgb

    for path in paths:
        with Image.open(path) as image:
            image.load()
            viewer_rgb(image)


def full_check(paths: list[Path]) -> None:
    from distill.images import ImageRef

    for path in paths:
        ImageRef(path=str(path)).check()


def header_size(self) -> tuple[int, int]:
    """What `ImageRef.check` did before: the size from the header, nothing decoded."""
    from PIL import Image

    with Image.open(self.path) as image:
        return image.size


def rows_read(paths: list[Path], header_only: bool = False) -> None:
    """The real start path: `examples_from_dataset` over a JSON Lines dataset with one image per row (loaded before
    the clock starts); with `header_only`, as it was before (each image's header read)."""
    from distill.data import examples_from_dataset
    from distill.images import ImageRef

    dataset = _dataset(paths)
    checked = ImageRef.check
    ImageRef.check = header_size if header_only else checked  # type: ignore[method-assign]
    try:
        examples_from_dataset(dataset, "dataset", paths[0].parent)
    finally:
        ImageRef.check = checked  # type: ignore[method-assign]


_DATASETS: dict[Path, object] = {}


def _dataset(paths: list[Path]):
    import datasets

    folder = paths[0].parent
    if folder not in _DATASETS:
        rows = folder / "rows.jsonl"
        block = [{"type": "image"}, {"type": "text", "text": "What is it?"}]
        rows.write_text("".join(json.dumps({"prompt": [{"role": "user", "content": block}], "images": [path.name]}) + "\n"
                                for path in paths))
        _DATASETS[folder] = datasets.load_dataset("json", data_files=str(rows), split="train",
                                                  cache_dir=str(folder.parent / "datasets-cache"))
    return _DATASETS[folder]


WAYS = {  # id: (what the table says, the function)
    "header": ("header only (before)", header_only),
    "decode": ("decode, no verify", decode_without_verify),
    "check": ("full check (ImageRef.check, now)", full_check),
    "rows_before": ("rows read, header only (before)", lambda paths: rows_read(paths, header_only=True)),
    "rows_now": ("rows read, full check (now)", rows_read),
}


def best_seconds(way, paths: list[Path], repeats: int) -> tuple[float, float]:
    """The fastest of `repeats` passes: (wall seconds, CPU seconds of this process). The work is one thread, so the
    CPU seconds are what it costs on an idle core, even on a machine shared with other work."""
    walls, cpus = [], []
    for _ in range(repeats):
        wall, cpu = time.perf_counter(), time.process_time()
        way(paths)
        walls.append(time.perf_counter() - wall)
        cpus.append(time.process_time() - cpu)
    return min(walls), min(cpus)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--small", type=int, default=10_000, help="how many 64 x 64 images")
    parser.add_argument("--large", type=int, default=100, help="how many 512 x 512 images")
    parser.add_argument("--repeats", type=int, default=5, help="passes over each set; the fastest is kept")
    parser.add_argument("--out", type=Path, default=ROOT / "benchmarks" / "results" / "image_checks.json")
    args = parser.parse_args()
    os.environ.setdefault("HF_DATASETS_DISABLE_PROGRESS_BARS", "1")
    results = []
    with tempfile.TemporaryDirectory() as temporary:
        for name, count, side, seed in (("small", args.small, 64, 0), ("large", args.large, 512, 1)):
            paths = write_images(Path(temporary) / name, count, side, seed)
            megabytes = sum(path.stat().st_size for path in paths) / 1e6
            for way_id, (way_name, way) in WAYS.items():
                wall, seconds = best_seconds(way, paths, args.repeats)
                results.append({"set": name, "images": count, "side": side, "megabytes": round(megabytes, 2),
                                "way": way_id, "label": way_name, "seconds": round(seconds, 4),
                                "wall_seconds": round(wall, 4), "ms_per_image": round(1e3 * seconds / count, 4),
                                "ns_per_pixel": round(1e9 * seconds / (count * side * side), 2)})
                print(f"{name:6s} {count:6d} x {side:3d}px  {way_name:34s} {seconds:8.3f} s CPU ({wall:7.3f} s wall)  "
                      f"{1e3 * seconds / count:7.3f} ms/image  {1e9 * seconds / (count * side * side):7.2f} ns/pixel",
                      flush=True)
    write_result(args.out, {"repeats": args.repeats, "threads": 1, "results": results})
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
