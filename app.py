"""MARS Playground (placeholder until the Gradio app lands): decodes one prompt with AR and MARS."""
from __future__ import annotations

import sys

from mars_core import DecodeConfig, generate, load_model


def main(model_path: str) -> int:
    model, tok = load_model(model_path)
    prompt = "Tom has 12 apples and buys 30 more. How many apples does he have?"
    for cfg in (DecodeConfig(mode="ar"), DecodeConfig(mode="mars", tau=0.95)):
        res = generate(model, tok, [prompt], cfg)
        print(f"{cfg.mode}: {res.stats.tokens_per_forward:.2f} tokens/forward\n{res.texts[0]}\n")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1] if len(sys.argv) > 1 else "assets/models/tiny-mars-b4"))
