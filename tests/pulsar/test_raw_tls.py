"""``pulsar+ssl://`` and TLS client-certificate authentication of the raw-entry reader, against the real
broker behind a TLS-terminating proxy (``tests/fixtures/tls_proxy.py``; pulsar-lite has no TLS).

Covered: the server verified against the CA that signed it (``tlsTrustCertsFilePath``), hostname
checked or not; a server whose CA is not trusted refused at once with an error naming the address and
trust file; a proxy that requires a client certificate accepting the reader's
``AuthenticationTls`` certificate and refusing a reader without one, again with a clear error. Through
the proxy the lookup answer names only the broker's plain ``pulsar://`` URL, so the reader stays on
its TLS connection (it never connects around the proxy).
"""

from __future__ import annotations

import time
from collections.abc import Iterator

import pytest

from streamoffload.embedded_broker import EmbeddedBroker
from streamoffload.errors import ConfigError
from streamoffload.produce import produce
from streamoffload.pulsar import raw_reader as rr
from streamoffload.pulsar.exactly_once import PulsarIOError
from tests.fixtures.broker import unique_topic
from tests.fixtures.tls_proxy import Pki, TlsProxy, make_pki
from tests.pulsar.readers import check_messages
from tests.pulsar.test_raw_reader import read_all

pytestmark = [pytest.mark.broker]

TLS_AUTH = "org.apache.pulsar.client.impl.auth.AuthenticationTls"


@pytest.fixture(scope="module")
def pki(tmp_path_factory: pytest.TempPathFactory) -> Pki:
    return make_pki(tmp_path_factory.mktemp("pki"))


@pytest.fixture(scope="module")
def tls_topic(pulsar_broker: EmbeddedBroker) -> str:
    topic = unique_topic("raw-tls")
    produce(pulsar_broker.service_url, topic, 40, 30, properties={"src": "io"}, batching=True, batch_size=8)
    return topic


def _backend(broker: EmbeddedBroker) -> tuple[str, int]:
    host, port = broker.service_url.removeprefix("pulsar://").rsplit(":", 1)
    return host, int(port)


@pytest.fixture
def proxy(pulsar_broker: EmbeddedBroker, pki: Pki) -> Iterator[TlsProxy]:
    with TlsProxy(pki, _backend(pulsar_broker)) as p:
        yield p


@pytest.fixture
def mtls_proxy(pulsar_broker: EmbeddedBroker, pki: Pki) -> Iterator[TlsProxy]:
    with TlsProxy(pki, _backend(pulsar_broker), client_ca=pki.ca) as p:
        yield p


def test_server_verified_against_its_ca(proxy: TlsProxy, pki: Pki, tls_topic: str) -> None:
    raw = rr.RawClient(proxy.url, {"tlsTrustCertsFilePath": pki.ca})
    assert check_messages(read_all(raw, tls_topic), tls_topic, 30) == 40
    # The lookup answer (pulsar-lite's plain URL only) keeps the reader on the proxy's connection.
    conn = raw.connect_for(tls_topic)
    try:
        assert (conn.address.port, conn.address.tls) == (proxy.port, True)
    finally:
        conn.close()
    # By IP address the certificate still matches (it names 127.0.0.1 too).
    by_ip = rr.RawClient(f"pulsar+ssl://127.0.0.1:{proxy.port}", {"tlsTrustCertsFilePath": pki.ca})
    assert rr.latest_position_raw(by_ip, tls_topic) is not None
    assert proxy.refused == []


def test_hostname_mismatch_refused_unless_validation_is_off(
    pulsar_broker: EmbeddedBroker, pki: Pki, tls_topic: str
) -> None:
    with TlsProxy(pki, _backend(pulsar_broker), misnamed=True) as proxy:  # a certificate for elsewhere.example
        with pytest.raises(PulsarIOError, match=r"TLS: the certificate of localhost:\d+ is not trusted .*mismatch"):
            rr.latest_position_raw(rr.RawClient(proxy.url, {"tlsTrustCertsFilePath": pki.ca}), tls_topic)
        relaxed = rr.RawClient(proxy.url, {"tlsTrustCertsFilePath": pki.ca, "tlsValidateHostname": "false"})
        assert rr.latest_position_raw(relaxed, tls_topic) is not None


def test_wrong_ca_is_refused_at_once_with_a_clear_error(proxy: TlsProxy, pki: Pki, tls_topic: str) -> None:
    wrong = rr.RawClient(proxy.url, {"tlsTrustCertsFilePath": pki.other_ca})
    expected = (
        rf"TLS: the certificate of localhost:{proxy.port} is not trusted "
        rf"\(tlsTrustCertsFilePath={pki.other_ca}\): .*certificate verify failed"
    )
    with pytest.raises(PulsarIOError, match=expected):
        rr.latest_position_raw(wrong, tls_topic)
    # In a range read too: not retried for the whole retry budget, a configuration error does not heal.
    with pytest.raises(PulsarIOError, match=expected):
        list(rr.read_range_raw(wrong, tls_topic, (-1, -1), (0, 3)))
    # The system trust store does not know the test CA either.
    with pytest.raises(PulsarIOError, match=r"not trusted \(system trust store\)"):
        rr.latest_position_raw(rr.RawClient(proxy.url), tls_topic)
    # Insecure mode skips verification altogether (the test CA is not given).
    insecure = rr.RawClient(proxy.url, {"tlsAllowInsecureConnection": "true"})
    assert rr.latest_position_raw(insecure, tls_topic) is not None


def test_client_certificate_accepted_and_required(mtls_proxy: TlsProxy, pki: Pki, tls_topic: str) -> None:
    with_cert = rr.RawClient(
        mtls_proxy.url,
        {
            "tlsTrustCertsFilePath": pki.ca,
            "authPluginClassName": TLS_AUTH,
            "authParams": f"tlsCertFile:{pki.client_cert},tlsKeyFile:{pki.client_key}",
        },
    )
    assert with_cert.config.auth_method == "tls"
    assert check_messages(read_all(with_cert, tls_topic), tls_topic, 30) == 40
    assert mtls_proxy.refused == []

    without = rr.RawClient(mtls_proxy.url, {"tlsTrustCertsFilePath": pki.ca})
    with pytest.raises(
        PulsarIOError,
        match=rf"TLS: localhost:{mtls_proxy.port} refused the connection: "
        r".*(; the server requires|if the server requires) a client certificate",
    ):
        rr.latest_position_raw(without, tls_topic)
    # The proxy's thread records the refusal once its side of the handshake fails, which under TLS 1.3 can come
    # just after the client has read the alert: wait for it rather than race it.
    deadline = time.monotonic() + 10
    while not mtls_proxy.refused and time.monotonic() < deadline:
        time.sleep(0.02)
    assert mtls_proxy.refused, "the proxy saw no certificate"


def test_unreadable_tls_files_are_a_config_error(proxy: TlsProxy, pki: Pki, tls_topic: str) -> None:
    with pytest.raises(ConfigError, match="AuthenticationTls needs tlsCertFile"):
        rr.RawClient(proxy.url, {"authPluginClassName": TLS_AUTH, "authParams": "tlsCertFile:x"})
    missing_key = rr.RawClient(
        proxy.url,
        {
            "tlsTrustCertsFilePath": pki.ca,
            "authPluginClassName": TLS_AUTH,
            "authParams": f"tlsCertFile:{pki.client_cert},tlsKeyFile:/nonexistent/missing.key",
        },
    )
    with pytest.raises(ConfigError, match=r"cannot load tlsCertFile .* tlsKeyFile /nonexistent/missing\.key"):
        rr.latest_position_raw(missing_key, tls_topic)
    with pytest.raises(ConfigError, match=r"tlsTrustCertsFilePath: cannot load /nonexistent/ca\.pem"):
        rr.latest_position_raw(rr.RawClient(proxy.url, {"tlsTrustCertsFilePath": "/nonexistent/ca.pem"}), tls_topic)
