"""Values of data source options, parsed in one way for every source: switches, byte counts, positive
numbers and topic names. Each error is one line naming the option and the value it refused. The switches'
grammar is the Pulsar client's (``pulsar.client_options.parse_bool``: the ``pulsar.client.*`` switches are
parsed below Spark), named here with the rest."""

from __future__ import annotations

from typing import overload

from streamoffload import units
from streamoffload.codecs.topics import TopicName, TopicNameError
from streamoffload.errors import ConfigError
from streamoffload.pulsar.client_options import FALSE_WORDS, TRUE_WORDS, parse_bool


def parse_size(text: str, name: str) -> int:
    """A whole number of bytes in the size grammar of ``streamoffload.units`` (``1048576``, ``64m``, ``1GiB``,
    ``1.5g``); errors name option ``name``."""
    try:
        size = units.parse_size(text)
    except ValueError:
        raise ConfigError(f"option {name}: expected a byte count like 1048576, 64m or 1GiB, got {text!r}") from None
    if size.denominator != 1:
        raise ConfigError(f"option {name}: expected a whole number of bytes, got {text!r}")
    return int(size)


@overload
def parse_positive(text: str, name: str) -> int: ...
@overload
def parse_positive(text: str, name: str, kind: type[float]) -> float: ...
def parse_positive(text: str, name: str, kind: type[int] | type[float] = int) -> int | float:
    """A number of type ``kind`` above zero; errors name option ``name``."""
    try:
        value = kind(text)
    except ValueError as err:
        raise ConfigError(f"option {name}: expected a positive number, got {text!r}") from err
    if value <= 0:
        raise ConfigError(f"option {name}: must be > 0, got {text!r}")
    return value


def parse_seconds(text: str, name: str) -> float:
    """A duration in seconds, zero or more; errors name option ``name``."""
    try:
        value = float(text)
    except ValueError as err:
        raise ConfigError(f"option {name}: expected a number of seconds, got {text!r}") from err
    if not value >= 0:  # also refuses NaN
        raise ConfigError(f"option {name}: must be >= 0, got {text!r}")
    return value


def parse_topic(text: str, where: str) -> str:
    """A topic name in its full form (short names are ``persistent://public/default/NAME``)."""
    try:
        return str(TopicName.parse(text))
    except TopicNameError as err:
        raise ConfigError(f"option {where}: {err}") from err


__all__ = ["FALSE_WORDS", "TRUE_WORDS", "parse_bool", "parse_positive", "parse_size", "parse_topic"]
