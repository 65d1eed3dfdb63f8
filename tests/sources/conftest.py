"""Fixtures of the source tests: a real S3-compatible server (moto's, in a thread of this process)
on a free localhost port, stopped after the module."""

from __future__ import annotations

import logging

import pytest


@pytest.fixture(scope="module")
def s3_server():
    """A moto S3 server on a free localhost port, stopped after the module; yields storage_options."""
    pytest.importorskip("moto.server")
    pytest.importorskip("s3fs")
    boto3 = pytest.importorskip("boto3")
    from moto.server import ThreadedMotoServer

    logging.getLogger("werkzeug").setLevel(logging.ERROR)
    server = ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
    server.start()
    try:
        host, port = server.get_host_and_port()
        url = f"http://{host}:{port}"
        boto3.client("s3", endpoint_url=url, aws_access_key_id="testing", aws_secret_access_key="testing",
                     region_name="us-east-1").create_bucket(Bucket="data")
        yield {"endpoint_url": url, "key": "testing", "secret": "testing", "skip_instance_cache": True,
               "client_kwargs": {"region_name": "us-east-1"}}
    finally:
        server.stop()
