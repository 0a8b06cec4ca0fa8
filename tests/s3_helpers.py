"""The local S3 server for every S3 test (moto on 127.0.0.1, port 0) and a fresh bucket on
it: conftest's s3_endpoint fixture, the cluster harness and the tests' buckets use these."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager


@contextmanager
def moto_server() -> Iterator[str]:
    """A moto S3 server (server mode, so other processes reach it too) on 127.0.0.1 and a
    free port; yields its endpoint URL and stops it afterwards."""
    from moto.server import ThreadedMotoServer

    server = ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
    server.start()
    try:
        host, port = server.get_host_and_port()
        yield f"http://{host}:{port}"
    finally:
        server.stop()


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
