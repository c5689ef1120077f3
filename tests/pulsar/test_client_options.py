"""The ``pulsar.client.*`` options (streamoffload/pulsar/client_options.py): ``pulsar.Client`` keyword arguments,
the direct connection's settings and the service URL, with errors that name the option."""

from __future__ import annotations

import pulsar
import pytest

from streamoffload.errors import ConfigError
from streamoffload.pulsar.client_options import (
    ConnectionConfig,
    ServiceAddress,
    client_kwargs,
    client_options,
    token_from_options,
)


def test_client_options_map_java_names_case_insensitively() -> None:
    opts = client_options(
        {
            "serviceurl": "x",
            "pulsar.client.operationtimeoutseconds": "7",
            "pulsar.client.tlsAllowInsecureConnection": "true",
            "pulsar.client.tls_trust_certs_file_path": "/ca.pem",
            "pulsar.client.authToken": "abc",
        }
    )
    kwargs = client_kwargs(opts)
    assert kwargs["operation_timeout_seconds"] == 7
    assert kwargs["tls_allow_insecure_connection"] is True
    assert kwargs["tls_trust_certs_file_path"] == "/ca.pem"
    assert isinstance(kwargs["authentication"], pulsar.AuthenticationToken)
    plugin = client_kwargs(
        {
            "authPluginClassName": "org.apache.pulsar.client.impl.auth.AuthenticationToken",
            "authParams": "token:xyz",
        }
    )
    assert isinstance(plugin["authentication"], pulsar.AuthenticationToken)


@pytest.mark.parametrize(
    ("options", "message"),
    [
        ({"noSuchThing": "1"}, "pulsar.client.noSuchThing: pulsar.Client has no such parameter"),
        ({"ioThreads": "many"}, "pulsar.client.ioThreads: expected an integer"),
        ({"tlsValidateHostname": "maybe"}, "expected true or false"),
        ({"logLevel": "loud"}, "logLevel: expected one of"),
    ],
)
def test_bad_client_options_name_the_option(options: dict[str, str], message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        client_kwargs(options)


def test_service_address_parsing() -> None:
    assert ServiceAddress.parse("pulsar://h:1234") == ServiceAddress("h", 1234, False)
    assert ServiceAddress.parse("pulsar+ssl://a:1,b:2/") == ServiceAddress("a", 1, True)
    assert ServiceAddress.parse("pulsar://h") == ServiceAddress("h", 6650, False)
    with pytest.raises(ConfigError, match="expected pulsar://HOST:PORT"):
        ServiceAddress.parse("http://h:80")


def test_connection_config_reads_auth_tls_and_timeouts() -> None:
    config = ConnectionConfig.parse(
        "pulsar+ssl://h:6651",
        {
            "authToken": "abc",
            "tlsAllowInsecureConnection": "on",
            "tlsValidateHostname": "no",
            "connectionTimeoutMs": "1500",
            "operationTimeoutSeconds": "7",
        },
    )
    assert (config.auth_method, config.auth_data) == ("token", b"abc")
    assert config.tls_allow_insecure and not config.tls_validate_hostname
    assert (config.connect_timeout_s, config.operation_timeout_s) == (1.5, 7.0)
    basic = ConnectionConfig.parse(
        "pulsar://h", {"authPluginClassName": "x.AuthenticationBasic", "authParams": '{"userId": "u", "password": "p"}'}
    )
    assert (basic.auth_method, basic.auth_data) == ("basic", b"u:p")


@pytest.mark.parametrize(
    ("options", "message"),
    [
        ({"tlsValidateHostname": "maybe"}, "option pulsar.client.tlsValidateHostname: expected true or false"),
        ({"authPluginClassName": "x.AuthenticationOauth2"}, "raw-entry reader supports token, basic and TLS"),
        ({"authPluginClassName": "x.AuthenticationTls", "authParams": "tlsCertFile:/c"}, "needs tlsCertFile"),
        ({"connectionTimeoutMs": "soon"}, "option pulsar.client.connectiontimeoutms: expected a number"),
    ],
)
def test_bad_connection_options_name_the_option(options: dict[str, str], message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        ConnectionConfig.parse("pulsar://h", options)


def test_token_from_a_file(tmp_path: pytest.TempPathFactory) -> None:
    path = tmp_path / "token"  # type: ignore[operator]
    path.write_text("secret\n")
    plugin = "org.apache.pulsar.client.impl.auth.AuthenticationToken"
    assert token_from_options({"authPluginClassName": plugin, "authParams": f"file:{path}"}) == "secret"
    assert token_from_options({"auth_token": "t"}) == "t"
    assert token_from_options({}) is None
