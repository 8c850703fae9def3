"""MARS (Mask AutoRegression): several tokens per forward from a stock causal LM.

    from mars_core import load_model, generate, DecodeConfig
    model, tok = load_model("assets/models/tiny-mars-b4")
    out = generate(model, tok, ["What is 12 + 30?"], DecodeConfig(tau=0.95, block_size=4))
    out.texts[0], out.stats.tokens_per_forward
"""
from .acceptance import accept
from .config import DecodeConfig, TauControl
from .custom_generate import mars_decoding
from .decoding import DecodeStats, StepEvent
from .fastest import fastest_exact
from .generate import GenerateResult, decode_steps, generate, stream
from .loading import load_model
from .loss import MarsLoss, mars_loss
from .masks import mars_training_mask

__all__ = [
    "DecodeConfig", "DecodeStats", "GenerateResult", "MarsLoss", "StepEvent", "TauControl",
    "accept", "decode_steps", "fastest_exact", "generate", "load_model", "mars_decoding", "mars_loss", "mars_training_mask",
    "stream",
]
