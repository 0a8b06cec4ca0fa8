"""A fresh bucket on the local S3 server (conftest's s3_endpoint), for the S3 fixtures."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager


@contextmanager
def fresh_bucket(endpoint: str, monkeypatch, bucket: str, **env: str) -> Iterator:
    """Credentials and endpoint through the usual AWS variables (plus `env`); yields a boto3
    client with `bucket` made, and empties and deletes it afterwards."""
    import boto3

    for key, value in {"AWS_ACCESS_KEY_ID": "testing", "AWS_SECRET_ACCESS_KEY": "testing",
                       "AWS_DEFAULT_REGION": "us-east-1", "AWS_ENDPOINT_URL": endpoint,
                       **env}.items():
        monkeypatch.setenv(key, value)
    client = boto3.client("s3", endpoint_url=endpoint)
    client.create_bucket(Bucket=bucket)
    yield client
    for page in client.get_paginator("list_objects_v2").paginate(Bucket=bucket):
        for obj in page.get("Contents", []):
            client.delete_object(Bucket=bucket, Key=obj["Key"])
    client.delete_bucket(Bucket=bucket)
