"""Leaf settings of the parts that modules below the part read (the teacher locations' fields, read by a method's
rules; gold's fields, read by the cross-tokenizer teacher): dataclasses only, importing nothing but `distill.config.io`.

- `locations.py`: the server, cache and remote teacher's fields.
- `gold.py`: gold's fields (the ULD variant across tokenizers).
"""
