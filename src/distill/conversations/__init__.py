"""Conversations: multi-turn rows with tool calls and the tool-call loop (rendering them into token ids with a trained
mask is `distill.rendering`).

- `tool_calls.py`: the calls' format in datasets (transformers'), the Hermes format distill writes and parses
  where a chat template has no tool support, the tools' schemas.
- `layout.py`: which completion ids are the model's and which the environment's, with what the environment said
  (its messages, observation, reward): what another tokenizer's teacher, a reward and a self-teacher read.
- `tools.py`, `environments.py`: the run's tools (import paths) and environments (a factory per row), run with
  timeouts; failures become messages, counted by kind.
- `loop.py`: the tool-call loop (token-in, token-out), its trajectories and metrics.
- `setup.py`, `support.py`: the loop built from a config; what runs take conversations, checked before models load.
"""
