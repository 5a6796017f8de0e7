"""Agents: the tool-call loop a model runs against tools and environments (`distill.conversations` holds what it reads).

- `loop.py`: the tool-call loop (token-in, token-out), its trajectories and metrics.
- `setup.py`, `support.py`: the loop built from a config; what runs take conversations, checked before models load.
- `feature.py`: the conversations part (its settings' rules and reads).
"""
