"""Parsing of the human quantities in lab files: rates, durations, sizes, percentages.

Rates follow the field's habit, not tc's: `Mbit`, `Mbps` and `Mb/s` all mean megabits per
second (tc reads `mbps` as megabytes, which surprises everyone). Every parser raises
ValueError with a message that says what forms are accepted; the spec layer adds the field.
"""

from __future__ import annotations

import math
import re
import reprlib

_NUMBER = r"(?P<num>(?:\d+(?:\.\d*)?|\.\d+)(?:[eE][+-]?\d+)?)"  # 2.5, .5, 1e3, 2.5e-3
# what float() reads as not finite, spelled in a quantity (`infs` is YAML's .inf plus a unit)
_NON_FINITE = r"(?P<sign>[+-]?)(?P<word>inf(?:inity)?|nan)\s*(?P<unit>[a-zA-Zµ/]*)"

# The longest interval (parse_interval) and the furthest time a fault timeline plans: a
# day. Its callers are a fault's duration (`--for`, a timeline's `for`) and a flap's period;
# nothing a lab does lasts longer, and a typo (1e12s) is refused rather than waited out.
MAX_INTERVAL = 86_400.0

_RATE_UNITS = {
    "": 1, "bit": 1, "bps": 1, "b/s": 1,
    "k": 1e3, "kbit": 1e3, "kbps": 1e3, "kb/s": 1e3,
    "m": 1e6, "mbit": 1e6, "mbps": 1e6, "mb/s": 1e6,
    "g": 1e9, "gbit": 1e9, "gbps": 1e9, "gb/s": 1e9,
    "t": 1e12, "tbit": 1e12, "tbps": 1e12, "tb/s": 1e12,
}

_TIME_UNITS = {"ns": 1e-9, "us": 1e-6, "µs": 1e-6, "ms": 1e-3, "s": 1.0}

_SIZE_UNITS = {
    "": 1, "b": 1,
    "k": 2**10, "kb": 2**10, "kib": 2**10,
    "m": 2**20, "mb": 2**20, "mib": 2**20,
    "g": 2**30, "gb": 2**30, "gib": 2**30,
}

_ANY_UNIT = set(_RATE_UNITS) | set(_TIME_UNITS) | set(_SIZE_UNITS)


class _ShortRepr(reprlib.Repr):
    """reprlib with room for a quantity, and no int repr of thousands of digits (Python
    refuses those, and a YAML file can hold one)."""

    def __init__(self, width: int) -> None:
        super().__init__()
        self.maxstring = self.maxother = self.maxlong = width
        self.maxlevel, self.maxlist, self.maxtuple, self.maxdict = 2, 3, 3, 3

    def repr_int(self, x: int, level: int) -> str:
        if x.bit_length() > 200:  # ~60 digits: say how long, do not print it
            return f"<a {'negative ' if x < 0 else ''}number of ~{int(x.bit_length() * 0.30103)} digits>"
        return super().repr_int(x, level)


def shown(value: object, width: int = 40) -> str:
    """A user's value for an error message: its repr, on one line, cut to about `width`
    characters, in time that does not grow with the value (a 1 MiB string or a list of
    100,000 items costs as little as `3`)."""
    text = _ShortRepr(width).repr(value)
    text = "".join(c if c.isprintable() else repr(c)[1:-1] for c in text)
    return text if len(text) <= width + 5 else text[:width] + "..."


def _finite(number: float, value: object, example: str) -> None:
    """Refuse NaN and ±infinity, saying which (`.nan` and `.inf` are YAML floats)."""
    if math.isnan(number):
        raise ValueError(f"{shown(value)} is not a number (NaN): write e.g. {example}")
    if math.isinf(number):
        raise ValueError(f"{shown(value)} is infinite: a quantity must be finite, e.g. {example}")


def _split(value: object, example: str) -> tuple[float, str]:
    """(number, lower-case unit) of `value`; a bare int or float has unit ''."""
    if isinstance(value, bool):
        raise ValueError(f"{shown(value)} is not a quantity: write e.g. {example}")
    if isinstance(value, (int, float)):
        try:
            number, unit = float(value), ""
        except OverflowError:  # an int beyond any float
            number, unit = (math.inf if value > 0 else -math.inf), ""
        else:
            _finite(number, value, example)
    else:
        text = str(value).strip()
        match = re.fullmatch(_NUMBER + r"\s*(?P<unit>[a-zA-Zµ/]*)", text)
        if not match:
            odd = re.fullmatch(_NON_FINITE, text, re.IGNORECASE)
            if odd and odd["unit"].lower() in _ANY_UNIT:  # `infs`, `nan ms`; not `nanoseconds`
                _finite(float(f"{odd['sign']}{odd['word']}"), value, example)
            raise ValueError(f"{shown(value)} is not a number with a unit: write e.g. {example}")
        number, unit = float(match["num"]), match["unit"].lower()
    if number < 0:
        raise ValueError(f"{shown(value)} must be a finite, non-negative quantity, e.g. {example}")
    if math.isinf(number):  # an int or a text of 400 digits, or 1e999
        raise ValueError(f"{shown(value)} is far too large: write e.g. {example}")
    return number, unit


def _scaled(number: float, scale: float, value: object, example: str) -> float:
    """number × scale, refused if that overflows (`999...9Tbit` with 300 nines)."""
    product = number * scale
    if not math.isfinite(product):
        raise ValueError(f"{shown(value)} is far too large: write e.g. {example}")
    return product


def parse_rate(value: str | int | float) -> int:
    """Bits per second from `100Mbit`, `1Gbit`, `1.5Gbps`, `500kbit` or a bare number."""
    number, unit = _split(value, "100Mbit or 1Gbit")
    if unit not in _RATE_UNITS:
        raise ValueError(f"unknown rate unit in {shown(value)}: use e.g. 100Mbit, 1Gbit, 10Gbit")
    bits = int(round(_scaled(number, _RATE_UNITS[unit], value, "100Mbit or 1Gbit")))
    if bits <= 0:
        raise ValueError(f"rate must be positive, got {shown(value)}")
    return bits


def parse_duration(value: str | int | float) -> float:
    """Seconds from `0ms`, `1.5ms`, `20us`, `2s`; a bare number is milliseconds (tc's habit)."""
    number, unit = _split(value, "2ms")
    if unit == "":
        return number / 1000.0
    if unit not in _TIME_UNITS:
        raise ValueError(f"unknown time unit in {shown(value)}: use ns, us, ms or s, e.g. 2ms")
    return number * _TIME_UNITS[unit]


def seconds(value: str | int | float, example: str = "5s or 500ms") -> float:
    """Seconds, maybe negative (the caller says what range it takes), from a number of
    seconds or a duration with a unit (`5s`, `500ms`, `1e3ms`); a quoted bare number is
    refused rather than read as tc's milliseconds; NaN and infinity are refused by name."""
    if isinstance(value, bool):
        raise ValueError(f"{shown(value)} is not a duration: write e.g. {example}")
    if isinstance(value, (int, float)):
        try:
            number = float(value)
        except OverflowError:  # an int beyond any float: far too long, or far below zero
            return math.inf if value > 0 else -math.inf
        _finite(number, value, example)
        return number
    if isinstance(value, str) and re.fullmatch(_NUMBER, value.strip()):
        raise ValueError(f"{shown(value)}: give a unit, e.g. {example}")
    return parse_duration(value)


def parse_interval(value: str | int | float) -> float:
    """Positive seconds, at most MAX_INTERVAL (a day), from a duration the user types (`5s`,
    `500ms`, `1e3ms`) or a number of seconds; a quoted bare number is refused rather than
    read as tc's milliseconds. For a fault's duration and a flap's period."""
    interval = seconds(value)
    if interval <= 0:
        raise ValueError(f"{shown(value)} must be longer than zero")
    if interval > MAX_INTERVAL:
        raise ValueError(f"{shown(value)} is longer than a day ({MAX_INTERVAL:,.0f} s), the most a fault lasts "
                         "or waits: give at most 86400s")
    return interval


def parse_size(value: str | int) -> int:
    """Bytes from `512M`, `1G`, `64k`, `1GiB` or a bare number of bytes (binary multiples)."""
    number, unit = _split(value, "512M or 1G")
    if unit not in _SIZE_UNITS:
        raise ValueError(f"unknown size unit in {shown(value)}: use e.g. 512M, 1G")
    size = int(_scaled(number, _SIZE_UNITS[unit], value, "512M or 1G"))
    if size <= 0:
        raise ValueError(f"size must be positive, got {shown(value)}")
    return size


def parse_percent(value: str | int | float) -> float:
    """A percentage from `1`, `0.5`, `1%`; must lie in [0, 100]."""
    if isinstance(value, int) and not isinstance(value, bool):
        number = float(value) if abs(value) <= 1000 else math.inf  # str() of a huge int raises
    else:
        text = str(value).strip()
        if text.endswith("%"):
            text = text[:-1]
        try:
            number = float(text)
        except ValueError:
            raise ValueError(f"{shown(value)} is not a percentage: use e.g. 0.1 or 1%") from None
    if not isinstance(value, bool) and math.isnan(number):
        raise ValueError(f"{shown(value)} is not a number (NaN): give a percentage, e.g. 0.1 or 1%")
    if isinstance(value, bool) or not 0.0 <= number <= 100.0:
        raise ValueError(f"percentage must lie between 0 and 100, got {shown(value)}")
    return number


def format_rate(bits_per_second: float) -> str:
    """`1Gbit`, `100Mbit`, `1.5Gbit`: the short form people write."""
    for unit, scale in (("Tbit", 1e12), ("Gbit", 1e9), ("Mbit", 1e6), ("kbit", 1e3)):
        if bits_per_second >= scale:
            return f"{bits_per_second / scale:g}{unit}"
    return f"{bits_per_second:g}bit"
