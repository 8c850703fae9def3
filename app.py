"""MARS Playground entry point.

The Gradio playground is not built yet; until it lands this decodes one prompt with AR and MARS
on a model folder and prints what each produced and its tokens per forward.

    python app.py [MODEL_FOLDER_OR_HUB_ID]
"""
from __future__ import annotations

import os
import sys

from mars_core import DecodeConfig, generate, load_model

DEFAULT_MODEL = os.path.join(os.path.dirname(os.path.abspath(__file__)), "assets", "models", "tiny-mars-b4")


def main(argv: list[str]) -> int:
    name = argv[0] if argv else os.environ.get("MARS_MODEL", DEFAULT_MODEL)
    if name == DEFAULT_MODEL and not os.path.isdir(name):
        print("The bundled default models are not built yet. Build them with\n"
              "  python -m training.build_default --output runs/default --install assets/models\n"
              "or pass a model folder / hub id: python app.py FOLDER", file=sys.stderr)
        return 2
    try:
        model, tok = load_model(name)
    except ValueError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    prompt = "Tom has 45 apples and buys 23 more. How many apples does he have now?"
    for cfg in (DecodeConfig(mode="ar"), DecodeConfig(mode="mars", tau=0.95)):
        res = generate(model, tok, [prompt], cfg)
        print(f"{cfg.mode}: {res.stats.tokens_per_forward:.2f} tokens/forward\n{res.texts[0]}\n")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
