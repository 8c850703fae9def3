"""What the Playground's MARS side runs: the choice on the page, its default per model, and the
line that says what each mode gives on the loaded model.

On the real pair the MARS side starts in "exact, fastest here" (`mars_core.fastest_exact`'s
configuration): MARS at tau gives 1.1-1.3 tokens per forward on real text with today's masks (the
model card), so a first run in tau mode would show MARS doing little, while the exact mode pays (issue 52). On the
bundled tiny pair it starts in tau mode, where the tiny model shows what MARS's training does:
3.4 tokens per forward at tau 0.95 against 2.2 for the fastest exact configuration.
"""
from __future__ import annotations

from .core import Core
from .fastest import Entry, mode_line_html
from .models import Loaded

# (label on the page, the key the handlers and the API take: playground.duel.MARS_MODES)
# (short: the six fit two rows beside the prompt, which keeps the tau slider in view on a laptop after Generate)
MODE_CHOICES = [("exact, fastest here", "fastest"), ("MARS at tau", "mars"), ("lossless", "lossless"),
                ("lossless + lookup", "lookup"), ("lossless + tree", "tree"), ("spec", "spec")]


def is_real(loaded: Loaded | None) -> bool:
    """Is this model one of the named real models (`mars_core.packaged`)?"""
    from mars_core import packaged

    return loaded is not None and packaged.is_named(loaded.source)


def default_mode(loaded: Loaded) -> str:
    return "fastest" if is_real(loaded) else "mars"


def block_of(core: Core, loaded: Loaded) -> int:
    return loaded.trained_block_size or core.default_block


def sample_prompts(loaded: Loaded) -> list[str] | None:
    """What `fastest_exact` replays for this model: text like what the page will decode. The tiny
    synthetic models: the page's held-out examples (instructions would be nonsense to them); others:
    the library's sample instructions."""
    from .scope import training_data

    if training_data(loaded) == "synthetic":
        from .examples import tiny_examples

        return [q for [q] in tiny_examples()]
    return None


def fastest_entry(core: Core, loaded: Loaded) -> Entry:
    """The model's "fastest" configuration: ready, or being measured from now on in the background."""
    return core.fastest.start(loaded, sample_prompts(loaded), block_of(core, loaded))


def mode_line(core: Core, loaded: Loaded) -> str:
    return mode_line_html(core.fastest, loaded, block_of(core, loaded))


def measuring(core: Core, loaded: Loaded) -> bool:
    entry = core.fastest.get(loaded)
    return entry is not None and entry.state == "measuring"
