"""Errors that cross module boundaries (kept free of heavy imports so the CLI can catch them cheaply)."""


class TeacherServerError(RuntimeError):
    """The teacher server could not give a usable answer after every retry (or refused the request)."""
