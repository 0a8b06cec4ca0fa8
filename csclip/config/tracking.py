"""The `tracking` section: where MLflow runs go."""

from __future__ import annotations

from csclip.config.base import StrictModel

__all__ = ["TrackingConfig"]


class TrackingConfig(StrictModel):
    """The `tracking` section: where MLflow runs go."""

    uri: str | None = None  # None: $MLFLOW_TRACKING_URI, else sqlite:///mlflow.db (see resolve_uri)
    experiment: str = "csclip"
    enabled: bool = True
