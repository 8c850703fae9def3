"""Tasks: the synthetic GSM8K-style problems and their scorer (ground floor: imports nothing of ours)."""
