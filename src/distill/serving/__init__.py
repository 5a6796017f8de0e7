"""Serving a teacher over HTTP (`distill serve-teacher`): request limits and parsing (`limits`), scoring and
batching (`scoring`), the app (`app`)."""
