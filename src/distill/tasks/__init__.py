"""Tasks with tools: CPU-sized environments written for the project (`lookup`: an invented registry), a public
benchmark (`bfcl`: the Berkeley Function Calling Leaderboard's questions, its scoring rules and its stateful
back-ends), and how an answer is checked (`answers`: a leaf that evaluation and rewards read)."""
