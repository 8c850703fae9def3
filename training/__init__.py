"""Training: tokenizer, data, AR SFT and MARS stages, evaluation, the default build."""
