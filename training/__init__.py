"""Training utilities: synthetic task data and tokenizer construction."""
