"""Input components whose values the handlers validate.

Gradio's own checks on a slider, number, dropdown or radio answer an out-of-range API value with
"Value 999 is greater than maximum value 16." (no field name; the value echoed into an HTML
toast) and a traceback in the server log. These components pass the value through unchanged, so
that `playground.validate` answers with the field's name and range. (An instance attribute, not
a subclass: Gradio writes a .pyi file next to the module of every component subclass.)
"""
from __future__ import annotations

import gradio as gr


def _passthrough(payload):
    return payload


def _checked_by_handler(component):
    component.preprocess = _passthrough
    return component


def Slider(*args, **kwargs) -> gr.Slider:  # noqa: N802 - used like the component class
    return _checked_by_handler(gr.Slider(*args, **kwargs))


def Number(*args, **kwargs) -> gr.Number:  # noqa: N802
    return _checked_by_handler(gr.Number(*args, **kwargs))


def Dropdown(*args, **kwargs) -> gr.Dropdown:  # noqa: N802
    return _checked_by_handler(gr.Dropdown(*args, **kwargs))


def Radio(*args, **kwargs) -> gr.Radio:  # noqa: N802
    return _checked_by_handler(gr.Radio(*args, **kwargs))
