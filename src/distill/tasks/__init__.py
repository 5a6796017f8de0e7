"""Bundled tasks with tools: CPU-sized environments written for the project (`lookup`: an invented registry)."""
