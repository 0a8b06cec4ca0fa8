"""csclip: Component-Supervised CLIP. Imports nothing heavy; import submodules directly."""

__version__ = "0.1.0"

__all__ = ["__version__"]
