"""bench/bfcl: tool calling on the edge, scored by the Berkeley Function Calling Leaderboard's own checker."""
