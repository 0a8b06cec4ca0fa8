"""The world's vocabulary (colors, shapes, sizes, spatial predicates) and its typed config."""

from __future__ import annotations

from pydantic import Field, field_validator, model_validator

from csclip.config.base import StrictModel
from csclip.errors import ConfigError

# Few, well-separated colors: a tiny ViT on 64 px images must tell them apart at a glance.
PALETTE: dict[str, tuple[int, int, int]] = {
    "red": (230, 25, 25),
    "green": (30, 200, 40),
    "blue": (40, 90, 255),
    "yellow": (250, 230, 20),
    "purple": (170, 50, 230),
    "orange": (255, 140, 0),
    "white": (245, 245, 245),
}
SHAPES: tuple[str, ...] = ("circle", "square", "triangle", "cross")
SIZES: tuple[str, ...] = ("small", "large")
BACKGROUND: tuple[int, int, int] = (20, 20, 20)

# Spatial predicates as they appear in relation units, and their antonyms (SPEC §2).
LEFT, RIGHT, ABOVE, BELOW = "is left of", "is right of", "is above", "is below"
PREDICATES: tuple[str, ...] = (LEFT, RIGHT, ABOVE, BELOW)
ANTONYMS: dict[str, str] = {LEFT: RIGHT, RIGHT: LEFT, ABOVE: BELOW, BELOW: ABOVE}
SPLITS: tuple[str, ...] = ("train", "val", "test")


class WorldConfig(StrictModel):
    """How the synthetic world is generated. Same config, same bytes."""

    seed: int = 0
    image_size: int = Field(64, ge=32, le=96)  # pixels per side
    grid_size: int = Field(3, ge=2, le=4)  # objects sit in cells of a grid_size x grid_size grid
    num_train: int = Field(5000, ge=0)
    num_val: int = Field(500, ge=0)
    num_test: int = Field(500, ge=0)
    min_objects: int = Field(2, ge=2, le=4)
    max_objects: int = Field(4, ge=2, le=4)
    colors: tuple[str, ...] = ("red", "green", "blue", "yellow", "purple")
    shapes: tuple[str, ...] = SHAPES
    # Probability that an entity mention names the object's size ("large red circle");
    # otherwise it is "red circle". Either way the mention picks out exactly one object.
    size_mention_prob: float = Field(0.5, ge=0.0, le=1.0)
    max_relations: int = Field(2, ge=1, le=2)  # relations stated per caption (1..this)
    # Longest caption in CLIP BPE tokens, start/end tokens included (every world word is
    # one token, so it is counted exactly without a tokenizer). Default: the context length
    # of csclip-tiny, so no caption (and no in-place foil at its end) is truncated.
    # A longer caption drops its second relation; one that is still too long (a very small
    # limit) keeps its shortest phrasing.
    max_caption_tokens: int = Field(32, ge=16, le=77)
    # Random shift of an object inside its cell, as a fraction of the free room; it never
    # leaves the cell, so grid-based relations stay unambiguous.
    position_jitter: float = Field(0.5, ge=0.0, le=1.0)

    @field_validator("colors")
    @classmethod
    def _known_colors(cls, colors: tuple[str, ...]) -> tuple[str, ...]:
        unknown = [c for c in colors if c not in PALETTE]
        if unknown:
            raise ValueError(f"unknown colors {unknown}; choose from {sorted(PALETTE)}")
        if len(set(colors)) != len(colors) or len(colors) < 2:
            raise ValueError("need at least 2 distinct colors (attribute foils change the color)")
        return colors

    @field_validator("shapes")
    @classmethod
    def _known_shapes(cls, shapes: tuple[str, ...]) -> tuple[str, ...]:
        unknown = [s for s in shapes if s not in SHAPES]
        if unknown:
            raise ValueError(f"unknown shapes {unknown}; choose from {list(SHAPES)}")
        if len(set(shapes)) != len(shapes) or len(shapes) < 2:
            raise ValueError("need at least 2 distinct shapes (object foils change the shape)")
        return shapes

    @model_validator(mode="after")
    def _objects_fit(self) -> WorldConfig:
        if self.max_objects < self.min_objects:
            raise ValueError(f"max_objects ({self.max_objects}) must be >= min_objects "
                             f"({self.min_objects})")
        if self.max_objects > self.grid_size**2:
            raise ValueError(f"max_objects ({self.max_objects}) does not fit a "
                             f"{self.grid_size}x{self.grid_size} grid; raise grid_size")
        # Each (color, shape) pair is unique in a scene, and foils need a free pair.
        if len(self.colors) * len(self.shapes) <= self.max_objects:
            raise ValueError("colors x shapes must exceed max_objects; add colors or shapes")
        return self

    def num_samples(self, split: str) -> int:
        """How many samples `split` has."""
        counts = {"train": self.num_train, "val": self.num_val, "test": self.num_test}
        if split not in counts:
            raise ConfigError(f"unknown world split {split!r}; use one of {list(SPLITS)}")
        return counts[split]
