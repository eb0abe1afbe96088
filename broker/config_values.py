"""Configuration values any layer may read: the error that names a key, and sizes.

`ConfigError` is what an impossible setting raises at start, its message naming the
RabbitMQ key; `parse_size` reads a byte count or a string with RabbitMQ's units
("50MB", "1GiB"). Pure, and imported by the settings (config.py) and by the layers
below them that validate their own keys (raft/storage/config.py), so neither
imports the other's module.
"""

from __future__ import annotations

import re


class ConfigError(ValueError):
    pass


_SIZE_UNITS = {"": 1, "kb": 1000, "mb": 1000 ** 2, "gb": 1000 ** 3,
               "kib": 1024, "mib": 1024 ** 2, "gib": 1024 ** 3,
               "k": 1024, "m": 1024 ** 2, "g": 1024 ** 3}


def parse_size(key: str, value) -> int:
    """An integer byte count or a string like "50MB" / "1GiB" (RabbitMQ's units)."""
    if isinstance(value, bool):
        raise ConfigError(f"{key}: expected a size, got {value!r}")
    if isinstance(value, int):
        return value
    match = re.fullmatch(r"\s*(\d+)\s*([a-zA-Z]*)\s*", str(value))
    if not match or match.group(2).lower() not in _SIZE_UNITS:
        raise ConfigError(f"{key}: cannot read {value!r} as a size (examples: 1048576, "
                          "\"50MB\", \"2GiB\")")
    return int(match.group(1)) * _SIZE_UNITS[match.group(2).lower()]
