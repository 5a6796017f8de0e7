"""Conversations: multi-turn rows with tool calls, the leaf the renderer, the data and the agents read (rendering them
into token ids with a trained mask is `distill.rendering`; the tool-call loop that runs them is `distill.agents`).

- `tool_calls.py`: the calls' format in datasets (transformers'), the Hermes format distill writes and parses
  where a chat template has no tool support, the tools' schemas.
- `turn_checks.py`: a dataset conversation's turns checked as it loads: no trained assistant turn without text or
  calls, each `tool` message answering a call of the turn before it (by `tool_call_id` where the row gives ids).
- `layout.py`: which completion ids are the model's and which the environment's, with what the environment said
  (its messages, observation, reward): what another tokenizer's teacher, a reward and a self-teacher read.
- `tools.py`, `environments.py`: the run's tools (import paths) and environments (a factory per row); a failed
  call becomes a message, counted by kind.
- `calls.py`: where a conversation's calls run: tool worker processes (`workers.py`, the trainer's side;
  `worker_process.py`, the worker's), each call bounded by a timeout that kills its worker, or `distill doctor`'s
  stand-in.
- `fields.py`: the conversations part's settings.
"""
