"""A ``--log-level debug`` run against a real S3 endpoint (moto) with credentials from the AWS chain: aiobotocore and
botocore log every signed request (headers, canonical request, signature) into the log file. The file is created
0600 whatever the umask, and neither the secret access key, the session token, the access key id nor any request's
signature appears anywhere in it."""

from __future__ import annotations

import hashlib
import hmac
import os
import re
import stat
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.s3

REPO = Path(__file__).resolve().parents[2]
ACCESS_KEY = "AKIAIOSFODNN7DEBUGLG"
SECRET_KEY = "wJalrXUtnFEMI/K7MDENG/bPxRfiCYDEBUGLOGKEY"
SESSION_TOKEN = "IQoJb3JpZ2luX2VjEDEBUGLOGSESSIONTOKEN//////////wEaCXVzLWVhc3QtMSJHMEUCIQD"
STRING_TO_SIGN = re.compile(r"StringToSign:\n(AWS4-HMAC-SHA256\n\S+\n(\S+)\n[0-9a-f]{64})")


def _signature(string_to_sign: str, scope: str) -> str:
    """The SigV4 signature of ``string_to_sign`` with SECRET_KEY: what the request's Authorization header carried."""
    key = ("AWS4" + SECRET_KEY).encode()
    for part in scope.split("/"):  # date, region, service, "aws4_request"
        key = hmac.new(key, part.encode(), hashlib.sha256).digest()
    return hmac.new(key, string_to_sign.encode(), hashlib.sha256).hexdigest()


def test_a_debug_log_file_is_private_and_holds_no_credentials(moto_server: str, s3_bucket: str, tmp_path: Path) -> None:
    log_file = tmp_path / "logs" / "debug.log"
    command = [sys.executable, "-m", "streamoffload", "--log-level", "DEBUG", "--log-file", str(log_file)]
    command += ["status", "--no-broker", "--store", f"s3://{s3_bucket}/p", "--s3-endpoint", moto_server]
    command += ["--s3-region", "us-east-1"]
    env = {
        **os.environ,
        "AWS_ACCESS_KEY_ID": ACCESS_KEY,
        "AWS_SECRET_ACCESS_KEY": SECRET_KEY,
        "AWS_SESSION_TOKEN": SESSION_TOKEN,
    }
    shell = "umask 022; exec " + " ".join(f"'{arg}'" for arg in command)  # a umask that makes open() 0644
    done = subprocess.run(["sh", "-c", shell], cwd=REPO, env=env, capture_output=True, text=True, timeout=300)
    assert (done.returncode, done.stdout, done.stderr) == (0, "no offloaded topics in this store yet\n", "")
    assert stat.S_IMODE(log_file.stat().st_mode) == 0o600
    text = log_file.read_text()
    # The requests were logged, signed, and each signature is known from its string to sign.
    operations = re.findall(r"Making request for OperationModel\(name=(\w+)\)", text)
    assert operations == ["ListObjectsV2", "ListObjectsV2", "GetObject"]  # segments, set-aside records, job health
    signed = STRING_TO_SIGN.findall(text)
    assert len(signed) == len(operations)
    assert text.count("'Authorization': b'***'") == text.count("Signature:\n***") == len(operations)
    for secret in (SECRET_KEY, SESSION_TOKEN, ACCESS_KEY, *(_signature(s, scope) for s, scope in signed)):
        assert secret not in text
