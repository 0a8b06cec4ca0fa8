"""`csclip report`'s config: where the paper report's tables go and where they are logged."""

from __future__ import annotations

from csclip.config.base import StrictModel
from csclip.config.tracking import TrackingConfig

__all__ = ["ReportConfig", "ReportTrackingConfig"]


class ReportTrackingConfig(TrackingConfig):
    """The training `tracking` section (uri None: $MLFLOW_TRACKING_URI, else
    sqlite:///mlflow.db; enabled), with the report's own experiment."""

    experiment: str = "csclip-report"


class ReportConfig(StrictModel):
    """`csclip report`: where the tables go and where they are logged."""

    tracking: ReportTrackingConfig = ReportTrackingConfig()
    out_dir: str = "runs/paper-report"
