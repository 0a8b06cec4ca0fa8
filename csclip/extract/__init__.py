"""Unit extraction: caption files -> the units table, on Ray Data (pipeline), with the
rules, gold, authors-file, replay or LLM backends (the LLM's prompt sets in prompt_sets/).

Importing the package imports none of its modules; `__all__` names the public ones.
"""

__all__ = ["answers", "authors", "authors_prompts", "backends", "captions", "lexicon",
           "pipeline", "prompt_sets", "prompts", "quality", "rules", "shards", "swap_negatives",
           "vllm"]
