"""Conversations: multi-turn rows with tool calls, rendered into token ids with a trained mask.

- `tool_calls.py`: the calls' format in datasets (transformers'), the Hermes format distill writes and parses
  where a chat template has no tool support, the tools' schemas.
- `render.py`: `ConversationRenderer`: a conversation as the prompt's ids and the rest's ids with a trained mask
  (every assistant turn through its end of turn), rendered turn by turn as the template's differences; a template
  that does not preserve prefixes is refused for the row.
"""
