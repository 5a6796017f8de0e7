"""Conversations: multi-turn rows with tool calls, rendered into token ids with a trained mask, and the tool-call loop.

- `tool_calls.py`: the calls' format in datasets (transformers'), the Hermes format distill writes and parses
  where a chat template has no tool support, the tools' schemas.
- `render.py`: `ConversationRenderer`: a conversation as the prompt's ids and the rest's ids with a trained mask
  (every assistant turn through its end of turn), rendered turn by turn as the template's differences; a template
  that does not preserve prefixes is refused for the row.
- `layout.py`: which completion ids are the model's and which the environment's, with what the environment said
  (its messages, observation, reward): what another tokenizer's teacher, a reward and a self-teacher read.
- `tools.py`, `environments.py`: the run's tools (import paths) and environments (a factory per row), run with
  timeouts; failures become messages, counted by kind.
- `loop.py`: the tool-call loop (token-in, token-out), its trajectories and metrics.
- `setup.py`, `support.py`: the loop built from a config; what runs take conversations, checked before models load.
"""
