"""Write src/distill/recipes/data/easy_vqa/: a slice of easy-VQA (MIT licence, github.com/vzhou842/easy-VQA), the
bundled visual question answering task (`dataset: bundled:easy-vqa`) of the `vision_teacher` and `vision` recipes.

easy-VQA's images are 64 x 64 PNGs of one shape (circle, rectangle or triangle) in one of eight colours on a tinted
background; its questions ask for the shape, the colour, or yes/no about either, in one word. The slice takes the
first TRAIN_IMAGES images of easy-VQA's train split ("train") and the first HELD_OUT_IMAGES of its test split
("heldout": images no training row shows) that have an open question (what shape, what colour: 11 answers), with
every open question of each.
The yes/no questions are left out: half of them are right by chance, which would hide what a model sees.
Row (rows.jsonl, images/ beside it; the `images` paths are relative to the file's folder):

    {"split": "train" | "heldout",
     "prompt": [{"role": "user", "content": [{"type": "image"}, {"type": "text", "text": QUESTION}]}],
     "images": ["images/train-17.png"], "completion": ANSWER, "answer": ANSWER}

Reads the installed package (`pip install easy-vqa`, needed only to rebuild the slice), copies its licence beside
the slice, and is deterministic: `python scripts/make_easy_vqa.py` overwrites the folder.
"""

from __future__ import annotations

import argparse
import json
import shutil
from importlib import metadata
from pathlib import Path

OUTPUT = Path(__file__).resolve().parent.parent / "src" / "distill" / "recipes" / "data" / "easy_vqa"
TRAIN_IMAGES = 400
HELD_OUT_IMAGES = 100


def rows(split: str, source: str, images: int, out: Path) -> list[dict]:
    import easy_vqa

    texts, answers, image_ids = (easy_vqa.get_train_questions if source == "train" else easy_vqa.get_test_questions)()
    paths = (easy_vqa.get_train_image_paths if source == "train" else easy_vqa.get_test_image_paths)()
    by_image: dict[int, list[tuple[str, str]]] = {}
    for text, answer, image in zip(texts, answers, image_ids):
        if answer not in ("yes", "no"):
            by_image.setdefault(image, []).append((text, answer))
    found = []
    for image in sorted(by_image)[:images]:
        name = f"images/{source}-{image}.png"
        shutil.copyfile(paths[image], out / name)
        for text, answer in by_image[image]:
            found.append({"split": split, "prompt": [{"role": "user", "content": [{"type": "image"}, {"type": "text", "text": text}]}],
                          "images": [name], "completion": answer, "answer": answer})
    return found


def licence() -> str:
    files = metadata.files("easy-vqa") or []
    found = next((f for f in files if f.name.upper().startswith("LICENSE")), None)
    if found is None:
        raise SystemExit("the installed easy-vqa has no licence file; reinstall it (pip install easy-vqa)")
    return found.read_text()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", type=Path, default=OUTPUT)
    parser.add_argument("--train-images", type=int, default=TRAIN_IMAGES)
    parser.add_argument("--held-out-images", type=int, default=HELD_OUT_IMAGES)
    args = parser.parse_args()
    if args.out.exists():
        shutil.rmtree(args.out)
    (args.out / "images").mkdir(parents=True)
    found = rows("train", "train", args.train_images, args.out)
    found += rows("heldout", "test", args.held_out_images, args.out)
    (args.out / "rows.jsonl").write_text("".join(json.dumps(row, separators=(",", ":")) + "\n" for row in found))
    (args.out / "LICENSE").write_text(licence())
    size = sum(p.stat().st_size for p in args.out.rglob("*") if p.is_file())
    print(f"{args.out}: {len(found)} rows, {args.train_images} + {args.held_out_images} images, {size / 1024:.0f} KiB")


if __name__ == "__main__":
    main()
