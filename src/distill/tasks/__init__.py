"""Bundled tasks with tools: CPU-sized environments written for the project (`lookup`: an invented registry), and
how an answer is checked (`answers`: a leaf that evaluation and rewards read)."""
