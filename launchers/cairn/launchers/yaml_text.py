"""Block-style YAML for plain data (dicts, lists, str, int, bool, None), without a dependency.

Strings stay plain where YAML reads them back as the same string, and are written as JSON
strings (valid YAML double-quoted scalars) where it would read another type ("true", "8",
"2x4" and the like); multi-line strings without trailing blanks become literal blocks (`|-`).
"""

from __future__ import annotations

import json
import re
from typing import Any

_PLAIN = re.compile(r"(-+[A-Za-z]|[A-Za-z_/])[A-Za-z0-9_./=@+-]*(:[A-Za-z0-9_./=@+-]+)*")
_RESERVED = {"true", "false", "yes", "no", "on", "off", "y", "n", "null", "~"}


def _scalar(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int):
        return str(value)
    if value is None:
        return "null"
    if isinstance(value, str):
        if _PLAIN.fullmatch(value) and value.lower() not in _RESERVED:
            return value
        return json.dumps(value)  # a JSON string is a YAML double-quoted scalar
    raise TypeError(f"cannot write {type(value).__name__} {value!r} as YAML")


def _block(value: Any) -> bool:
    """A multi-line string that a literal block (`|-`) keeps exactly."""
    return (
        isinstance(value, str)
        and "\n" in value
        and not value.endswith("\n")
        and value[:1] not in " \n"
        and all(line == line.rstrip() and line.isprintable() for line in value.split("\n"))
    )


def _emit(value: Any, indent: int, out: list) -> None:
    pad = "  " * indent
    items = value.items() if isinstance(value, dict) else ((None, v) for v in value)
    for key, item in items:
        head = f"{pad}{_scalar(key)}:" if isinstance(value, dict) else f"{pad}-"
        if isinstance(item, (dict, list)) and item:
            if isinstance(value, dict):
                out.append(head)
                _emit(item, indent + 1, out)
            else:  # a list item: its first line follows the dash
                start = len(out)
                _emit(item, indent + 1, out)
                out[start] = f"{head} {out[start].lstrip()}"
        elif _block(item):
            out.append(f"{head} |-")
            out.extend(f"{pad}  {line}" if line else "" for line in item.split("\n"))
        else:
            out.append(f"{head} {'{}' if item == {} else '[]' if item == [] else _scalar(item)}")


def to_yaml(value: dict, header: str = "") -> str:
    """`value` as block-style YAML, each line of `header` as a comment first."""
    out = [f"# {line}".rstrip() for line in header.splitlines()]
    _emit(value, 0, out)
    return "\n".join(out) + "\n"
