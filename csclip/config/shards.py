"""The shard-writing config (`csclip shards`): the captions to read (as `csclip extract`
reads them), where the webdataset shards go and how their images are encoded."""

from __future__ import annotations

from typing import Literal

from pydantic import Field, model_validator

from csclip.config.base import StrictModel
from csclip.config.extract import InputConfig
from csclip.config.model import ModelSource

__all__ = ["ShardEncoding", "ShardsConfig", "ShardsOutputConfig"]

# original: the source file's bytes (jpg, png, webp; any other format becomes a lossless
# png); jpeg: re-encoded as JPEG (img2dataset's default); pixels: the model's transformed
# (3, H, W) uint8 image as .npy, decoded and resized once here instead of every epoch.
ShardEncoding = Literal["jpeg", "original", "pixels"]


class ShardsOutputConfig(StrictModel):
    """Where the shards go and what they hold."""

    uri: str | None = None  # local folder or s3://bucket/prefix (required)
    samples_per_shard: int = Field(1000, ge=1)  # captions cut into each shard, before rejections
    # Seeds the one permutation of the samples before they are cut into shards: a reader's
    # bounded shuffle buffer cannot scatter the captions of one image the source keeps
    # together (COCO's five).
    seed: int = 0
    encoding: ShardEncoding = "jpeg"
    jpeg_quality: int = Field(95, ge=1, le=100)  # encoding jpeg (img2dataset's default: 95)
    endpoint_url: str | None = None  # S3 endpoint override (else AWS_ENDPOINT_URL)


class ShardsConfig(StrictModel):
    """`csclip shards` / pipelines/shards.py: one config, sections mirror the YAML."""

    input: InputConfig = InputConfig()
    output: ShardsOutputConfig = ShardsOutputConfig()
    # encoding pixels: the model whose preprocessing transforms the images (its eval
    # transform up to the uint8 pixels, csclip.preprocess.image_pixels). Only then.
    model: ModelSource | None = None

    @model_validator(mode="after")
    def _consistent(self) -> ShardsConfig:
        if self.input.format == "webdataset":
            raise ValueError("input.format=webdataset is shards already; csclip shards reads "
                             "captions files and the synthetic world")
        if not self.output.uri:
            raise ValueError("output.uri is required: the folder the shards go to (--out)")
        if self.output.encoding == "pixels" and self.model is None:
            raise ValueError("output.encoding=pixels needs model.name (--model): the model "
                             "whose preprocessing makes the pixels")
        if self.output.encoding != "pixels" and self.model is not None:
            raise ValueError(f"model is used by output.encoding=pixels only; with "
                             f"{self.output.encoding} leave it unset")
        return self
