"""``S3Target``: backups in S3 or any S3-compatible store, through boto3 (``fusee[s3]``).

Every upload carries the MD5 of its body (``Content-MD5``): the server refuses
a body that arrived different (``BadDigest``), so an object stored is the one
sent. Credentials, region and endpoint come from the keyword options or from
boto3's usual sources (``AWS_ACCESS_KEY_ID``, ``AWS_SECRET_ACCESS_KEY``,
``AWS_REGION``, ``AWS_ENDPOINT_URL``, ``~/.aws``).
"""

from __future__ import annotations

import base64
import hashlib
import os
from typing import Any

from fusee.errors import BackupUnavailable


class S3Target:
    """Objects under ``s3://bucket/prefix``."""

    def __init__(self, url: str, *, endpoint_url: str | None = None, region: str | None = None,
                 access_key_id: str | None = None, secret_access_key: str | None = None,
                 session_token: str | None = None, timeout: float = 30.0) -> None:
        if not url.startswith("s3://") or not url[5:].split("/", 1)[0]:
            raise BackupUnavailable(f"{url!r} is not an s3://bucket/prefix URL")
        bucket, _, prefix = url[5:].partition("/")
        self.bucket = bucket
        self.prefix = prefix.strip("/") + "/" if prefix.strip("/") else ""
        self.name = url
        try:
            import boto3
            from botocore.config import Config
        except ImportError:
            raise BackupUnavailable("an s3:// backup target needs boto3: pip install 'fusee[s3]'") from None
        config = Config(retries={"max_attempts": 3, "mode": "standard"}, connect_timeout=min(timeout, 10),
                        read_timeout=timeout)
        self._client: Any = boto3.client(
            "s3", endpoint_url=endpoint_url or os.environ.get("AWS_ENDPOINT_URL") or None,
            region_name=region or os.environ.get("AWS_REGION") or os.environ.get("AWS_DEFAULT_REGION")
            or "us-east-1",
            aws_access_key_id=access_key_id, aws_secret_access_key=secret_access_key,
            aws_session_token=session_token, config=config)
        from botocore.exceptions import ClientError

        self._client_error = ClientError

    def _code(self, e: BaseException) -> str:
        return str(getattr(e, "response", {}).get("Error", {}).get("Code", ""))

    def put(self, key: str, data: bytes) -> None:
        md5 = base64.b64encode(hashlib.md5(data, usedforsecurity=False).digest()).decode()
        try:
            self._client.put_object(Bucket=self.bucket, Key=self.prefix + key, Body=data, ContentMD5=md5)
        except self._client_error as e:
            if self._code(e) in ("NoSuchBucket", "AccessDenied", "InvalidAccessKeyId",
                                 "SignatureDoesNotMatch"):
                raise BackupUnavailable(f"{self.name}: {e}") from None
            raise OSError(f"uploading {key} to {self.name}: {e}") from None

    def get(self, key: str) -> bytes:
        try:
            answer = self._client.get_object(Bucket=self.bucket, Key=self.prefix + key)
        except self._client_error as e:
            if self._code(e) in ("NoSuchKey", "404"):
                raise FileNotFoundError(f"{self.name}: no object {key}") from None
            raise OSError(f"reading {key} from {self.name}: {e}") from None
        return bytes(answer["Body"].read())

    def exists(self, key: str) -> bool:
        try:
            self._client.head_object(Bucket=self.bucket, Key=self.prefix + key)
        except self._client_error as e:
            if self._code(e) in ("404", "NoSuchKey", "NotFound"):
                return False
            raise OSError(f"looking for {key} in {self.name}: {e}") from None
        return True

    def list(self, prefix: str) -> list[str]:
        out: list[str] = []
        try:
            pages = self._client.get_paginator("list_objects_v2").paginate(
                Bucket=self.bucket, Prefix=self.prefix + prefix)
            for page in pages:
                out.extend(o["Key"][len(self.prefix):] for o in page.get("Contents", ()))
        except self._client_error as e:
            raise OSError(f"listing {prefix} in {self.name}: {e}") from None
        return sorted(out)

    def __repr__(self) -> str:
        return f"S3Target({self.name!r})"
