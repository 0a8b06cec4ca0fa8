"""The LLM's prompt sets (`backend.prompts`): each is one module whose class implements
`PromptSet` (csclip.extract.prompt_sets.base); this registry names them.

Light on purpose: the config validates `backend.prompts` against PROMPT_SET_NAMES without
pyarrow, Ray or torch; a prompt set's module is imported when `get_prompt_set` asks for it.
A new prompt set is one module plus one line in PROMPT_SETS.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from csclip.extract.prompt_sets.base import PromptSet

__all__ = ["DEFAULT_PROMPT_SET", "PROMPT_SETS", "PROMPT_SET_NAMES", "get_prompt_set"]

# name -> "module:class" of its implementation (imported on first use).
PROMPT_SETS: dict[str, str] = {
    # Ours: one call per caption (units and foils), one repair call (csclip.extract.prompts).
    "csclip": "csclip.extract.prompt_sets.csclip:CsclipPromptSet",
    # The authors' three calls, prompts, sampling and filters (csclip.extract.authors_prompts).
    "authors": "csclip.extract.prompt_sets.authors:AuthorsPromptSet",
}
PROMPT_SET_NAMES: tuple[str, ...] = tuple(PROMPT_SETS)
# The prompt set of outputs written before there were others: their manifest names none.
DEFAULT_PROMPT_SET = "csclip"

_LOADED: dict[str, PromptSet] = {}  # name -> its instance, once imported


def get_prompt_set(name: str) -> PromptSet:
    """The prompt set registered as `name`. Raises KeyError for an unknown name (the
    config refuses those first)."""
    if name not in _LOADED:
        module_name, class_name = PROMPT_SETS[name].split(":")
        _LOADED[name] = getattr(importlib.import_module(module_name), class_name)()
    return _LOADED[name]

