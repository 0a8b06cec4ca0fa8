"""Render a scene to a PNG: flat colored shapes on a plain dark background."""

from __future__ import annotations

import io

from PIL import Image, ImageDraw

from csclip.config.world import BACKGROUND, PALETTE
from csclip.world.scene import Scene, SceneObject, object_radius_fraction


def render_image(scene: Scene) -> Image.Image:
    """The scene as an RGB image of scene.image_size pixels per side."""
    image = Image.new("RGB", (scene.image_size, scene.image_size), BACKGROUND)
    draw = ImageDraw.Draw(image)
    cell = scene.image_size / scene.grid_size
    for obj in scene.objects:
        _draw_object(draw, obj, cell)
    return image


def render_png(scene: Scene) -> bytes:
    """The scene as PNG bytes. Deterministic: same scene, same bytes."""
    buffer = io.BytesIO()
    # Low compression: 64 px images are tiny anyway, and encoding dominates generation time.
    render_image(scene).save(buffer, format="PNG", compress_level=1)
    return buffer.getvalue()


def _draw_object(draw: ImageDraw.ImageDraw, obj: SceneObject, cell: float) -> None:
    cx = (obj.col + 0.5) * cell + obj.dx
    cy = (obj.row + 0.5) * cell + obj.dy
    r = object_radius_fraction(obj.size) * cell
    fill = PALETTE[obj.color]
    if obj.shape == "circle":
        draw.ellipse((cx - r, cy - r, cx + r, cy + r), fill=fill)
    elif obj.shape == "square":
        s = r * 0.85  # a bit smaller than the circle's box, so areas are comparable
        draw.rectangle((cx - s, cy - s, cx + s, cy + s), fill=fill)
    elif obj.shape == "triangle":
        draw.polygon([(cx, cy - r), (cx + r, cy + r * 0.8), (cx - r, cy + r * 0.8)], fill=fill)
    elif obj.shape == "cross":
        t = r * 0.35  # half the bar thickness
        draw.rectangle((cx - r, cy - t, cx + r, cy + t), fill=fill)
        draw.rectangle((cx - t, cy - r, cx + t, cy + r), fill=fill)
    else:
        raise ValueError(f"no renderer for shape {obj.shape!r}")  # config validation prevents this
