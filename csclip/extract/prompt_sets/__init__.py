"""The LLM's prompt sets (`backend.prompts`): each is one module whose class implements
`PromptSet` (csclip.extract.prompt_sets.base); this registry names them.

The registry itself, PROMPT_SETS (name -> "module:Class"), sits in csclip.config.extract,
which validates `backend.prompts` against it without pyarrow, Ray or torch; a prompt set's
module is imported when `get_prompt_set` asks for it. A new prompt set is one module plus
one line in PROMPT_SETS.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING

from csclip.config.extract import DEFAULT_PROMPT_SET, PROMPT_SET_NAMES, PROMPT_SETS

if TYPE_CHECKING:
    from csclip.extract.prompt_sets.base import PromptSet

__all__ = ["DEFAULT_PROMPT_SET", "PROMPT_SETS", "PROMPT_SET_NAMES", "get_prompt_set"]

_LOADED: dict[str, PromptSet] = {}  # name -> its instance, once imported


def get_prompt_set(name: str) -> PromptSet:
    """The prompt set registered as `name`. Raises KeyError for an unknown name (the
    config refuses those first)."""
    if name not in _LOADED:
        module_name, class_name = PROMPT_SETS[name].split(":")
        _LOADED[name] = getattr(importlib.import_module(module_name), class_name)()
    return _LOADED[name]

