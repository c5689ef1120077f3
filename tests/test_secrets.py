"""Secrets never reach an error, a log line or a log file others can read: a store URL with ``user:secret@`` or a
presigned query, a Pulsar service URL with credentials, botocore's signed request headers at DEBUG, Pulsar tokens
(``streamoffload.redaction``). Plain Python: no store server, no broker (the debug run against a real S3 endpoint
is ``tests/storage/test_debug_log_secrets.py``)."""

from __future__ import annotations

import io
import logging
import os
import stat
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from streamoffload.cli import main
from streamoffload.cli_common import LogSettings, configure_logging, log_settings
from streamoffload.errors import ConfigError
from streamoffload.pulsar.client_options import ConnectionConfig, ServiceAddress
from streamoffload.redaction import RedactingFilter, redact, register_secret
from streamoffload.storage.location import open_store
from streamoffload.streaming.job import session
from streamoffload.streaming.job.health import HealthTracker
from tests.commands.test_cli_errors import one_error_line

SECRET = "hunter2secret"
KEY_ID = "AKIAEXAMPLEKEYID0042"
SIGNATURE = "6b5e0a53b0fa9bd8c0a4d7d8e7b7f6e5d4c3b2a1908f7e6d5c4b3a2918f7e6d5"
TOKEN = "IQoJb3JpZ2luX2VjEXAMPLESESSIONTOKEN"
JWT = "eyJhbGciOiJIUzI1NiJ9.eyJzdWIiOiJvZmZsb2FkIn0.c2lnbmF0dXJlLW9mLWEtdG9rZW4"
SECRETS = (SECRET, KEY_ID, SIGNATURE, TOKEN, JWT)

PRESIGNED_QUERY = (
    f"X-Amz-Algorithm=AWS4-HMAC-SHA256&X-Amz-Credential={KEY_ID}%2F20261201%2Fus-east-1%2Fs3%2Faws4_request"
    f"&X-Amz-Date=20261201T000000Z&X-Amz-Expires=900&X-Amz-SignedHeaders=host&X-Amz-Security-Token={TOKEN}"
    f"&X-Amz-Signature={SIGNATURE}"
)
SHOWN_QUERY = (
    "X-Amz-Algorithm=AWS4-HMAC-SHA256&X-Amz-Credential=***&X-Amz-Date=20261201T000000Z&X-Amz-Expires=900"
    "&X-Amz-SignedHeaders=host&X-Amz-Security-Token=***&X-Amz-Signature=***"
)


@pytest.fixture(autouse=True)
def restore_logging() -> Iterator[None]:
    before = log_settings()
    yield
    configure_logging(before)


@pytest.mark.parametrize(
    ("url", "message"),
    [
        (
            f"s3://{KEY_ID}:{SECRET}@bucket/prefix",
            "store URL s3://***@bucket/prefix: credentials in s3:// URLs are not allowed "
            "(use options or the AWS chain)",
        ),
        (
            f"file://user:{SECRET}@host/dir",
            "store URL file://***@host/dir: file URLs name a local path (file:///dir), not host 'host'",
        ),
        (
            f"https://user:{SECRET}@example.com/dir",
            "store URL https://***@example.com/dir: unsupported scheme 'https' (use file:///dir or s3://bucket/prefix)",
        ),
        (
            f"s3://bucket/seg/data?{PRESIGNED_QUERY}",
            f"store URL s3://bucket/seg/data?{SHOWN_QUERY}: s3 URLs take no query or fragment",
        ),
        (
            f"https://bucket.s3.amazonaws.com/seg/data?{PRESIGNED_QUERY}",
            f"store URL https://bucket.s3.amazonaws.com/seg/data?{SHOWN_QUERY}: unsupported scheme 'https' "
            "(use file:///dir or s3://bucket/prefix)",
        ),
    ],
)
def test_a_bad_store_url_is_named_without_its_secrets(
    url: str, message: str, capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(ConfigError) as err:
        open_store(url)
    assert str(err.value) == message
    assert main(["status", "--store", url]) == 1
    err_text = capsys.readouterr().err
    assert one_error_line(err_text, "status") == f"streamoffload status: error: {message}"
    for secret in SECRETS:
        assert secret not in err_text


def test_a_service_url_with_credentials_is_refused_without_them() -> None:
    url = f"pulsar://admin:{SECRET}@broker.example:6650"
    expected = (
        "serviceUrl 'pulsar://***@broker.example:6650': credentials do not go in the service URL "
        "(use pulsar.client.authToken or authPluginClassName and authParams)"
    )
    for parse in (ServiceAddress.parse, ConnectionConfig.parse):
        with pytest.raises(ConfigError) as err:
            parse(url)
        assert str(err.value) == expected
    with pytest.raises(ConfigError) as bad_port:
        ServiceAddress.parse(f"pulsar://broker.example:66x50/?token={JWT}")
    assert str(bad_port.value) == "serviceUrl 'pulsar://broker.example:66x50/?token=***': bad port '66x50'"


def test_the_job_health_record_in_the_store_keeps_no_credentials() -> None:
    health = HealthTracker(None, f"pulsar+ssl://svc:{SECRET}@broker.example:6651")
    down = health.broker_down(f"cannot connect to pulsar+ssl://svc:{SECRET}@broker.example:6651: refused", 5.0)
    assert (down.broker_url, down.cause) == (
        "pulsar+ssl://***@broker.example:6651",
        "cannot connect to pulsar+ssl://***@broker.example:6651: refused",
    )


@pytest.mark.parametrize(
    ("text", "shown"),
    [
        # botocore.endpoint at DEBUG: the prepared request's headers.
        (
            f"headers={{'X-Amz-Date': b'20261201T000000Z', 'X-Amz-Security-Token': b'{TOKEN}', 'Authorization': "
            f"b'AWS4-HMAC-SHA256 Credential={KEY_ID}/20261201/us-east-1/s3/aws4_request, "
            f"SignedHeaders=host;x-amz-date, Signature={SIGNATURE}'}}",
            "headers={'X-Amz-Date': b'20261201T000000Z', 'X-Amz-Security-Token': b'***', 'Authorization': b'***'}",
        ),
        # botocore.auth at DEBUG: the canonical request and the signature.
        (
            f"CanonicalRequest:\nGET\n/b\n\nhost:127.0.0.1:9000\nx-amz-security-token:{TOKEN}\n\nhost",
            "CanonicalRequest:\nGET\n/b\n\nhost:127.0.0.1:9000\nx-amz-security-token:***\n\nhost",
        ),
        (f"Signature:\n{SIGNATURE}", "Signature:\n***"),
        # The same header parameters outside a quoted header.
        (
            f"Authorization: AWS4-HMAC-SHA256 Credential={KEY_ID}/20261201/us-east-1/s3/aws4_request\nnext line",
            "Authorization: ***\nnext line",
        ),
        (
            f"send: b'GET / HTTP/1.1\\r\\nAuthorization: Bearer {JWT}\\r\\n'",
            "send: b'GET / HTTP/1.1\\r\\nAuthorization: ***\\r\\n'",
        ),
        # Pulsar: authParams, a token, basic credentials in JSON, a URL with a password.
        (f"pulsar.client.authParams=token:{JWT} next", "pulsar.client.authParams=*** next"),
        (f"params token:{JWT}, more", "params token:***, more"),
        (f"a bare {JWT} token", "a bare *** token"),
        (
            f'{{"userId": "offload", "password": "{SECRET}", "topic": "t"}}',
            '{"userId": "offload", "password": "***", "topic": "t"}',
        ),
        (
            f"spark.hadoop.fs.s3a.secret.key={SECRET} spark.master=local[2]",
            "spark.hadoop.fs.s3a.secret.key=*** spark.master=local[2]",
        ),
        (f"endpoint http://u:{SECRET}@127.0.0.1:9000 down", "endpoint http://***@127.0.0.1:9000 down"),
        (f"key id {KEY_ID} refused", "key id *** refused"),
        # What must stay: object keys, ordinary URLs and names, "=" in other values.
        (
            "GET http://127.0.0.1:9000/b/p/_meta/segments/x?list-type=2&prefix=p%2F {'Key': 'p/a/b'} max=5",
            "GET http://127.0.0.1:9000/b/p/_meta/segments/x?list-type=2&prefix=p%2F {'Key': 'p/a/b'} max=5",
        ),
    ],
)
def test_redact_masks_secrets_and_only_them(text: str, shown: str) -> None:
    assert redact(text) == shown
    assert redact(shown) == shown


def test_a_registered_secret_is_masked_wherever_it_appears() -> None:
    echoed = "ZXhhbXBsZS1yZWdpc3RlcmVkLXNlY3JldA"
    assert redact(f"<Message>key {echoed} failed</Message>") == f"<Message>key {echoed} failed</Message>"
    register_secret(echoed, "short", None)
    assert redact(f"<Message>key {echoed} failed</Message>") == "<Message>key *** failed</Message>"
    assert redact("a short word stays") == "a short word stays"  # under MIN_REGISTERED: not registered
    assert redact("a short word", secrets=["short"]) == "a *** word"


def test_the_filter_redacts_message_arguments_and_the_traceback() -> None:
    record = logging.LogRecord("botocore.endpoint", logging.DEBUG, __file__, 1, "request to %s: %r", None, None)
    record.args = (f"http://u:{SECRET}@h:9000/b", {"Authorization": f"Bearer {JWT}"})
    try:
        raise RuntimeError(f"refused pulsar://u:{SECRET}@h:6650")
    except RuntimeError:
        record.exc_info = sys.exc_info()
    assert RedactingFilter().filter(record) is True
    text = logging.Formatter("%(name)s: %(message)s").format(record)
    assert text.splitlines()[0] == "botocore.endpoint: request to http://***@h:9000/b: {'Authorization': '***'}"
    assert text.splitlines()[-1] == "RuntimeError: refused pulsar://***@h:6650"
    assert SECRET not in text and JWT not in text


def test_a_log_file_is_created_private_and_every_line_redacted(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    log_file = tmp_path / "logs" / "so.log"
    old = os.umask(0o022)  # what would make a plain open() create it 0644
    try:
        configure_logging(LogSettings(level="DEBUG", log_file=str(log_file)))
    finally:
        os.umask(old)
    assert stat.S_IMODE(log_file.stat().st_mode) == 0o600
    logging.getLogger("botocore.endpoint").debug("Sending http request: headers={'Authorization': b'%s'}", SIGNATURE)
    logging.getLogger("streamoffload.test").error("broker pulsar://u:%s@h:6650 unreachable", SECRET)
    lines = [line.split(" ", 2)[2] for line in log_file.read_text().splitlines()]
    assert lines == [
        "DEBUG botocore.endpoint: Sending http request: headers={'Authorization': b'***'}",
        "ERROR streamoffload.test: broker pulsar://***@h:6650 unreachable",
    ]
    # The terminal (errors only, with a log file) gets the same redacted line.
    assert (
        capsys.readouterr()
        .err.splitlines()[-1]
        .endswith("ERROR streamoffload.test: broker pulsar://***@h:6650 unreachable")
    )


def test_spark_output_is_written_private_and_redacted(tmp_path: Path, capfd: pytest.CaptureFixture[str]) -> None:
    jvm = (
        f"2026-12-01 10:00:00,000 WARN org.apache.spark.SparkConf: spark.hadoop.fs.s3a.secret.key={SECRET}\n"
        f"2026-12-01 10:00:01,000 ERROR worker: cannot reach http://u:{SECRET}@127.0.0.1:9000\n"
    ).encode()
    log_file = tmp_path / "logs" / "spark.log"
    old = os.umask(0o022)
    try:
        session._pump(io.BytesIO(jvm), session.SparkLogging("WARN", str(log_file)))
    finally:
        os.umask(old)
    assert stat.S_IMODE(log_file.stat().st_mode) == 0o600
    assert log_file.read_text().splitlines() == [
        "2026-12-01 10:00:00,000 WARN org.apache.spark.SparkConf: spark.hadoop.fs.s3a.secret.key=***",
        "2026-12-01 10:00:01,000 ERROR worker: cannot reach http://***@127.0.0.1:9000",
    ]
    session._pump(io.BytesIO(jvm), session.SparkLogging("WARN", None))  # no log file: the terminal
    assert capfd.readouterr().err.splitlines() == [
        "2026-12-01 10:00:00,000 WARN org.apache.spark.SparkConf: spark.hadoop.fs.s3a.secret.key=***",
        "2026-12-01 10:00:01,000 ERROR worker: cannot reach http://***@127.0.0.1:9000",
    ]
