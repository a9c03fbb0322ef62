"""Typed scalar values of the SELIS type system (int, float/double, boolean, string).

The seed's own clients send every value as a JSON string with a separate `type`, so a value is
converted by its declared type; a value that cannot be converted is the client's error.
"""

from __future__ import annotations

import math

from veil.protocol.errors import ProtocolError
from veil.protocol.limits import check_int

Scalar = int | float | bool | str

TYPE_ALIASES = {
    "int": "int",
    "integer": "int",
    "long": "int",
    "float": "float",
    "double": "float",
    "boolean": "boolean",
    "bool": "boolean",
    "string": "string",
    "str": "string",
}


def canonical_type(name: object, field: str) -> str:
    if not isinstance(name, str) or name.lower() not in TYPE_ALIASES:
        raise ProtocolError(field, f"unknown type {name!r}; use one of int, float, double, boolean, string")
    return TYPE_ALIASES[name.lower()]


def type_of(value: object) -> str | None:
    """The SELIS type a JSON value carries by itself, None for values that are not scalars."""
    if isinstance(value, bool):
        return "boolean"
    if isinstance(value, int):
        return "int"
    if isinstance(value, float):
        return "float"
    if isinstance(value, str):
        return "string"
    return None


def convert(value: object, type_name: str, field: str) -> Scalar:
    """Convert a JSON value to the declared canonical type, or raise a 400 naming `field`."""
    if type_name == "int":
        return _to_int(value, field)
    if type_name == "float":
        return _to_float(value, field)
    if type_name == "boolean":
        return _to_bool(value, field)
    return _to_string(value, field)


def _to_int(value: object, field: str) -> int:
    if isinstance(value, bool):
        raise ProtocolError(field, f"{value!r} is a boolean, not an int")
    if isinstance(value, int):
        return check_int(value, field)
    if isinstance(value, float) and value.is_integer():
        return check_int(int(value), field)
    if isinstance(value, str) and value.strip().isascii():
        try:
            return check_int(int(value.strip()), field)
        except ValueError:
            pass
    raise ProtocolError(field, f"{value!r} is not an int")


def _to_float(value: object, field: str) -> float:
    if isinstance(value, bool):
        raise ProtocolError(field, f"{value!r} is a boolean, not a float")
    if isinstance(value, int | float):
        result = float(value)
    elif isinstance(value, str):
        try:
            result = float(value.strip())
        except ValueError:
            raise ProtocolError(field, f"{value!r} is not a float") from None
    else:
        raise ProtocolError(field, f"{value!r} is not a float")
    if not math.isfinite(result):
        raise ProtocolError(field, f"{value!r} is not a finite number")
    return result


def _to_bool(value: object, field: str) -> bool:
    if isinstance(value, bool):
        return value
    if isinstance(value, str) and value.strip().lower() in ("true", "false"):
        return value.strip().lower() == "true"
    raise ProtocolError(field, f"{value!r} is not a boolean (true or false)")


def _to_string(value: object, field: str) -> str:
    if isinstance(value, str):
        return value
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int | float):
        return str(value)
    raise ProtocolError(field, f"{value!r} is not a string")
