"""The ``pulsar.client.*`` options, parsed once for every way this package talks to Pulsar: the keyword
arguments of a ``pulsar.Client`` (:func:`client_kwargs`), and the :class:`ConnectionConfig` of a direct
binary-protocol connection (``streamoffload/pulsar/broker_connection.py``: the raw-entry reader, topic listing).
Also the service URL (:class:`ServiceAddress`) and the Python logger the C++ client logs to."""

from __future__ import annotations

import inspect
import json
import logging
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlsplit

from streamoffload.errors import ConfigError
from streamoffload.redaction import redact, register_secret

# The C++ client's logger; also this package's name, so its modules' loggers are children of it and take the
# level the command line sets on it (cli_common.configure_logging).
PULSAR_LOGGER = "streamoffload.pulsar"

# The words of a switch: in the pulsar.client.* options and in every data source option (source/option_values).
TRUE_WORDS = ("true", "1", "yes", "on")
FALSE_WORDS = ("false", "0", "no", "off")


def parse_bool(text: str, name: str) -> bool:
    """A switch: ``true``/``1``/``yes``/``on`` or ``false``/``0``/``no``/``off``, any letter case. ``name``
    is the option's full name (``failOnDataLoss``, ``pulsar.client.tlsAllowInsecureConnection``)."""
    lowered = text.strip().lower()
    if lowered in TRUE_WORDS:
        return True
    if lowered in FALSE_WORDS:
        return False
    raise ConfigError(f"option {name}: expected true or false, got {text!r}")


def pulsar_logger() -> logging.Logger:
    """The Python logger to give ``pulsar.Client(logger=...)``: the C++ client's lines then go where every other
    log line goes (never to stdout, where they would break ``produce --json | jq``)."""
    return logging.getLogger(PULSAR_LOGGER)


@dataclass(frozen=True)
class ServiceAddress:
    """Where a ``serviceUrl`` points: the first host of ``pulsar://`` or ``pulsar+ssl://`` (TLS)."""

    host: str
    port: int
    tls: bool

    @classmethod
    def parse(cls, service_url: str) -> ServiceAddress:
        parts = urlsplit(service_url.strip())
        if parts.scheme not in ("pulsar", "pulsar+ssl"):
            raise ConfigError(
                f"serviceUrl {redact(service_url)!r}: expected pulsar://HOST:PORT or pulsar+ssl://HOST:PORT"
            )
        if "@" in parts.netloc:
            raise ConfigError(
                f"serviceUrl {redact(service_url)!r}: credentials do not go in the service URL "
                f"(use {CLIENT_OPTION_PREFIX}authToken or authPluginClassName and authParams)"
            )
        tls = parts.scheme == "pulsar+ssl"
        first = parts.netloc.split(",")[0]  # a multi-host URL: the first host answers as well as any
        host, _, port_text = first.rpartition(":")
        if not host:
            host, port_text = first, ""
        try:
            port = int(port_text) if port_text else (6651 if tls else 6650)
        except ValueError as err:
            raise ConfigError(f"serviceUrl {redact(service_url)!r}: bad port {port_text!r}") from err
        return cls(host.strip("[]"), port, tls)


# ---------------------------------------------------------------------------------------------
# the pulsar.client.* options and pulsar.Client's keyword arguments

CLIENT_OPTION_PREFIX = "pulsar.client."
_EXCLUDED_PARAMS = ("self", "service_url", "authentication", "logger")


def normalized_name(key: str) -> str:
    """Option names compare without case, ``_`` or ``-``: Spark lower-cases data source option
    names, so ``operationTimeoutSeconds`` arrives as ``operationtimeoutseconds``."""
    return key.replace("_", "").replace("-", "").lower()


def normalized(options: Mapping[str, str]) -> dict[str, tuple[str, str]]:
    """``{normalized name: (name as given, value)}``: see :func:`normalized_name`."""
    return {normalized_name(k): (k, v) for k, v in options.items()}


def token_from_options(options: Mapping[str, str]) -> str | None:
    """The token of ``authToken`` or of the token plugin's ``authParams`` (``token:...``, ``file:...``), if any.
    It is registered with ``redaction.register_secret``: no log line or error of this process shows it."""
    token = _token(options)
    register_secret(token)
    return token


def _token(options: Mapping[str, str]) -> str | None:
    opts = {k: v for k, (_orig, v) in normalized(options).items()}
    if "authtoken" in opts:
        return opts["authtoken"]
    plugin = opts.get("authpluginclassname", "")
    if plugin.endswith("AuthenticationToken"):
        params = opts.get("authparams", "")
        if params.startswith("token:"):
            return params[len("token:") :]
        if params.startswith("file:"):
            with open(params[len("file:") :], encoding="utf-8") as fh:
                return fh.read().strip()
        return params
    return None


def client_options(options: Mapping[str, str]) -> dict[str, str]:
    """The ``pulsar.client.*`` entries of a source's options, without the prefix."""
    prefix = CLIENT_OPTION_PREFIX.lower()
    return {k[len(prefix) :]: v for k, v in options.items() if k.lower().startswith(prefix)}


def client_kwargs(options: Mapping[str, str]) -> dict[str, Any]:
    """Keyword arguments for ``pulsar.Client`` from ``pulsar.client.*`` options (prefix removed).

    Names match the Python client's parameters without regard to case or underscores, so Java-style
    names work (``operationTimeoutSeconds`` -> ``operation_timeout_seconds``,
    ``tlsTrustCertsFilePath``, ``connectionTimeoutMs``, ``ioThreads``, ...); values are converted to
    the parameter's type. Authentication: ``authToken``, or Pulsar's ``authPluginClassName`` +
    ``authParams`` (the token, TLS, basic and OAuth2 plugins by class name; any other name is loaded
    as a C++ plugin library path). ``logLevel`` (debug|info|warn|error) sets the client's console log
    level (default warn). An unknown name raises :class:`ConfigError`.
    """
    import pulsar

    signature = inspect.signature(pulsar.Client.__init__)
    params = {normalized_name(name): name for name in signature.parameters if name not in _EXCLUDED_PARAMS}
    special = {"authtoken", "authpluginclassname", "authparams", "loglevel"}
    opts = normalized(options)
    kwargs: dict[str, Any] = {}
    for norm, (key, text) in opts.items():
        if norm in special:
            continue
        name = params.get(norm)
        if name is None:
            raise ConfigError(
                f"option {CLIENT_OPTION_PREFIX}{key}: pulsar.Client has no such parameter "
                f"(known: {', '.join(sorted(params.values()))}, plus authToken, authPluginClassName, "
                "authParams, logLevel)"
            )
        default = signature.parameters[name].default
        try:
            if isinstance(default, bool):
                kwargs[name] = parse_bool(text, CLIENT_OPTION_PREFIX + key)
            elif isinstance(default, int):
                kwargs[name] = int(text)
            else:
                kwargs[name] = text
        except ValueError as err:
            raise ConfigError(f"option {CLIENT_OPTION_PREFIX}{key}: expected an integer, got {text!r}") from err

    token = token_from_options(options)
    plugin = opts.get("authpluginclassname", ("", ""))[1]
    auth_params = opts.get("authparams", ("", ""))[1]
    if token is not None:
        kwargs["authentication"] = pulsar.AuthenticationToken(token)
    elif plugin.endswith("AuthenticationTls"):
        parts = dict(item.split(":", 1) for item in auth_params.split(",") if ":" in item)
        kwargs["authentication"] = pulsar.AuthenticationTLS(parts.get("tlsCertFile", ""), parts.get("tlsKeyFile", ""))
    elif plugin.endswith("AuthenticationBasic"):
        kwargs["authentication"] = pulsar.AuthenticationBasic(auth_params_string=auth_params)
    elif plugin.lower().endswith("authenticationoauth2"):
        kwargs["authentication"] = pulsar.AuthenticationOauth2(auth_params)
    elif plugin:
        kwargs["authentication"] = pulsar.Authentication(plugin, auth_params)

    levels = {
        "debug": pulsar.LoggerLevel.Debug,
        "info": pulsar.LoggerLevel.Info,
        "warn": pulsar.LoggerLevel.Warn,
        "error": pulsar.LoggerLevel.Error,
    }
    level = opts.get("loglevel", ("", "warn"))[1].strip().lower()
    if level not in levels:
        raise ConfigError(f"option {CLIENT_OPTION_PREFIX}logLevel: expected one of {', '.join(levels)}, got {level!r}")
    kwargs["logger"] = pulsar.ConsoleLogger(levels[level])
    return kwargs


# ---------------------------------------------------------------------------------------------
# a direct binary-protocol connection's settings


@dataclass(frozen=True)
class ConnectionConfig:
    """How to reach and authenticate to a cluster: parsed once from the ``pulsar.client.*`` options."""

    service: ServiceAddress
    auth_method: str | None = None
    auth_data: bytes | None = None
    tls_trust_certs_file: str | None = None
    tls_allow_insecure: bool = False
    tls_validate_hostname: bool = True
    tls_cert_file: str | None = None
    tls_key_file: str | None = None
    connect_timeout_s: float = 10.0
    operation_timeout_s: float = 30.0

    @classmethod
    def parse(cls, service_url: str, options: Mapping[str, str] | None = None) -> ConnectionConfig:
        options = options or {}
        opts = {k: v for k, (_orig, v) in normalized(options).items()}
        service = ServiceAddress.parse(service_url)
        method: str | None = None
        data: bytes | None = None
        cert = key = None
        token = token_from_options(options)
        plugin = opts.get("authpluginclassname", "")
        params = opts.get("authparams", "")
        if token is not None:
            method, data = "token", token.encode()
        elif plugin.endswith("AuthenticationBasic"):
            method, data = "basic", _basic_credentials(params)
        elif plugin.endswith("AuthenticationTls"):
            parts = dict(item.split(":", 1) for item in params.split(",") if ":" in item)
            cert, key = parts.get("tlsCertFile"), parts.get("tlsKeyFile")
            if not cert or not key:
                raise ConfigError(
                    f"option {CLIENT_OPTION_PREFIX}authParams: AuthenticationTls needs tlsCertFile:...,tlsKeyFile:..."
                )
            method = "tls"
        elif plugin:
            raise ConfigError(
                f"option {CLIENT_OPTION_PREFIX}authPluginClassName: the raw-entry reader supports token, basic and "
                f"TLS authentication, not {plugin}; use the pulsar-client reader for it"
            )

        def number(name: str, default: float, scale: float) -> float:
            if name not in opts:
                return default
            try:
                return float(opts[name]) * scale
            except ValueError as err:
                raise ConfigError(
                    f"option {CLIENT_OPTION_PREFIX}{name}: expected a number, got {opts[name]!r}"
                ) from err

        return cls(
            service=service,
            auth_method=method,
            auth_data=data,
            tls_trust_certs_file=opts.get("tlstrustcertsfilepath") or None,
            tls_allow_insecure=parse_bool(
                opts.get("tlsallowinsecureconnection", "false"), f"{CLIENT_OPTION_PREFIX}tlsAllowInsecureConnection"
            ),
            tls_validate_hostname=parse_bool(
                opts.get("tlsvalidatehostname", "true"), f"{CLIENT_OPTION_PREFIX}tlsValidateHostname"
            ),
            tls_cert_file=cert,
            tls_key_file=key,
            connect_timeout_s=number("connectiontimeoutms", 10.0, 0.001),
            operation_timeout_s=number("operationtimeoutseconds", 30.0, 1.0),
        )


def _basic_credentials(params: str) -> bytes:
    """``userId:password``, Pulsar's basic auth data, from the plugin's JSON or ``k:v,k:v`` params."""
    user = password = None
    text = params.strip()
    if text.startswith("{"):
        try:
            parsed = json.loads(text)
        except ValueError as err:
            raise ConfigError(f"option {CLIENT_OPTION_PREFIX}authParams: not valid JSON: {err}") from err
        user = parsed.get("userId", parsed.get("username"))
        password = parsed.get("password")
    else:
        parts = dict(item.split(":", 1) for item in text.split(",") if ":" in item)
        user = parts.get("userId", parts.get("username"))
        password = parts.get("password")
    if not user or password is None:
        raise ConfigError(
            f"option {CLIENT_OPTION_PREFIX}authParams: AuthenticationBasic needs userId and password "
            '(\'{"userId": "u", "password": "p"}\')'
        )
    register_secret(password)
    return f"{user}:{password}".encode()


__all__ = [
    "CLIENT_OPTION_PREFIX",
    "FALSE_WORDS",
    "PULSAR_LOGGER",
    "TRUE_WORDS",
    "ConnectionConfig",
    "ServiceAddress",
    "client_kwargs",
    "client_options",
    "normalized",
    "normalized_name",
    "parse_bool",
    "pulsar_logger",
    "token_from_options",
]
