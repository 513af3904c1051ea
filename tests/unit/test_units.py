"""orchestrator.units: rates, durations, sizes, percentages and the short rate format."""

from __future__ import annotations

import math

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from orchestrator import units

# -- rates ---------------------------------------------------------------------------------

@pytest.mark.parametrize(
    ("text", "bits"),
    [
        ("100Mbit", 100 * 10**6),
        ("1Gbit", 10**9),
        ("1.5Gbps", 1_500_000_000),
        ("500kbit", 500_000),
        ("10Gbit", 10 * 10**9),
        ("100Mbps", 100 * 10**6),  # the field's habit: Mbps is megabits, not tc's megabytes
        ("100Mb/s", 100 * 10**6),
        ("100mbit", 100 * 10**6),
        ("1GBIT", 10**9),
        ("1 Gbit", 10**9),
        ("  2Gbit ", 2 * 10**9),
        ("1G", 10**9),
        ("100M", 100 * 10**6),
        ("64k", 64_000),
        ("1Tbit", 10**12),
        ("0.5Mbit", 500_000),
        (".5Mbit", 500_000),
        ("1000bit", 1000),
        ("1000bps", 1000),
        ("1000", 1000),
        (1000, 1000),
        (2.5e6, 2_500_000),
    ],
)
def test_parse_rate_examples(text, bits):
    assert units.parse_rate(text) == bits
    assert isinstance(units.parse_rate(text), int)


@pytest.mark.parametrize(
    "bad",
    ["", "fast", "1Gbyte", "1 Gigabit", "Mbit", "-1Mbit", "1..5Gbit", "0", "0Mbit",
     0, -5, 0.0, -1.5, True, False, None],
)
def test_parse_rate_rejects(bad):
    with pytest.raises(ValueError):
        units.parse_rate(bad)


@pytest.mark.parametrize("bad", [math.inf, -math.inf, math.nan])
def test_parse_rate_rejects_non_finite_with_value_error(bad):
    # Regression: units.parse_rate(float('inf')) raises OverflowError ("cannot convert float infinity
    # to integer") instead of ValueError, so pydantic does not turn it into a field error and
    # a lab file with `bandwidth: .inf` crashes the loader with a traceback (see test_spec).
    with pytest.raises(ValueError):
        units.parse_rate(bad)


def test_parse_rate_unknown_unit_message_names_accepted_forms():
    with pytest.raises(ValueError, match="100Mbit"):
        units.parse_rate("1Gbyte")


RATE_SPELLINGS = [
    (spelling.format(prefix), scale)
    for prefix, scale in (("", 1), ("k", 10**3), ("M", 10**6), ("G", 10**9), ("T", 10**12))
    for spelling in ("{}bit", "{}bps", "{}b/s", "{}")
]


@settings(max_examples=200, deadline=None)
@given(
    mantissa=st.integers(min_value=1, max_value=999_999),
    unit=st.sampled_from(RATE_SPELLINGS),
    lower=st.booleans(),
)
def test_parse_rate_integer_mantissa(mantissa, unit, lower):
    name, scale = unit
    name = name.lower() if lower else name
    assert units.parse_rate(f"{mantissa}{name}") == mantissa * scale


@settings(max_examples=200, deadline=None)
@given(mantissa=st.integers(min_value=1, max_value=999_999), exponent=st.integers(0, 9))
def test_format_rate_round_trips(mantissa, exponent):
    """Any rate with at most six significant digits survives format -> parse exactly."""
    bits = mantissa * 10**exponent
    text = units.format_rate(bits)
    assert units.parse_rate(text) == bits
    assert text.endswith("bit")


@settings(max_examples=200, deadline=None)
@given(bits=st.integers(min_value=1, max_value=10**13))
def test_format_rate_is_close_and_short(bits):
    """`:g` keeps six significant digits, so the parse of the format is within 5e-6 relative."""
    text = units.format_rate(bits)
    back = units.parse_rate(text)
    assert abs(back - bits) <= bits * 5e-6 + 0.5
    number = float(text.rstrip("bitkMGT"))
    assert 1 <= number <= 1000  # 999_999_999 prints as "1000Mbit": six digits round up


@pytest.mark.parametrize(
    ("bits", "text"),
    [
        (10**9, "1Gbit"),
        (100 * 10**6, "100Mbit"),
        (1_500_000_000, "1.5Gbit"),
        (500_000, "500kbit"),
        (10 * 10**9, "10Gbit"),
        (2 * 10**12, "2Tbit"),
        (999, "999bit"),
        (1000, "1kbit"),
    ],
)
def test_format_rate_examples(bits, text):
    assert units.format_rate(bits) == text


# -- durations -----------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("value", "seconds"),
    [
        ("0ms", 0.0),
        ("1.5ms", 0.0015),
        ("20us", 20e-6),
        ("20µs", 20e-6),
        ("2s", 2.0),
        ("100ns", 100e-9),
        ("5", 0.005),  # a bare number is milliseconds, as in tc
        (5, 0.005),
        (2.5, 0.0025),
        (0, 0.0),
        ("10 ms", 0.010),
        ("1MS", 0.001),
    ],
)
def test_parse_duration_examples(value, seconds):
    assert units.parse_duration(value) == pytest.approx(seconds, rel=1e-12, abs=1e-15)


@pytest.mark.parametrize("bad", ["5m", "fast", "", "-1ms", "1h", "ms", True, None])
def test_parse_duration_rejects(bad):
    with pytest.raises(ValueError):
        units.parse_duration(bad)


@pytest.mark.parametrize("bad", [-5, -0.5, math.inf, math.nan])
def test_parse_duration_rejects_negative_and_non_finite_numbers(bad):
    # Regression: units.parse_duration only validates strings. A bare number is divided by 1000 and
    # returned unchecked: parse_duration(-5) == -0.005, parse_duration(inf) == inf,
    # parse_duration(nan) is nan. The string "-5ms" is rejected, the number -5 is not.
    with pytest.raises(ValueError):
        units.parse_duration(bad)


@settings(max_examples=200, deadline=None)
@given(
    amount=st.integers(min_value=0, max_value=10**6),
    unit=st.sampled_from([("ns", 1e-9), ("us", 1e-6), ("µs", 1e-6), ("ms", 1e-3), ("s", 1.0)]),
)
def test_parse_duration_units(amount, unit):
    name, scale = unit
    assert units.parse_duration(f"{amount}{name}") == pytest.approx(amount * scale, rel=1e-12)
    if name.isascii():  # units are case-insensitive ("µ".upper() is a Greek capital mu)
        upper = units.parse_duration(f"{amount}{name.upper()}")
        assert upper == pytest.approx(amount * scale, rel=1e-12)


@settings(max_examples=100, deadline=None)
@given(ms=st.integers(min_value=0, max_value=10**6))
def test_bare_number_means_milliseconds(ms):
    assert units.parse_duration(ms) == pytest.approx(units.parse_duration(f"{ms}ms"))
    assert units.parse_duration(str(ms)) == pytest.approx(ms / 1000)


# -- sizes ---------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("value", "size"),
    [
        ("512M", 512 * 2**20),
        ("1G", 2**30),
        ("64k", 64 * 2**10),
        ("1GiB", 2**30),
        ("1GB", 2**30),
        ("256MiB", 256 * 2**20),
        ("1024", 1024),
        ("1024b", 1024),
        (1024, 1024),
        ("1.5G", 3 * 2**29),
        ("512 m", 512 * 2**20),
    ],
)
def test_parse_size_examples(value, size):
    assert units.parse_size(value) == size


@pytest.mark.parametrize("bad", ["512X", "", "lots", "0", "0M", "-1M", 0, -1, True, None, "0.5"])
def test_parse_size_rejects(bad):
    with pytest.raises(ValueError):
        units.parse_size(bad)


@settings(max_examples=200, deadline=None)
@given(
    amount=st.integers(min_value=1, max_value=10**5),
    unit=st.sampled_from([("", 1), ("k", 2**10), ("M", 2**20), ("G", 2**30), ("KiB", 2**10),
                          ("MiB", 2**20), ("GiB", 2**30), ("MB", 2**20)]),
)
def test_parse_size_units(amount, unit):
    name, scale = unit
    assert units.parse_size(f"{amount}{name}") == amount * scale


# -- percentages ---------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("value", "percent"),
    [("1", 1.0), ("0.5", 0.5), ("1%", 1.0), (0, 0.0), (100, 100.0), ("100%", 100.0),
     (0.25, 0.25), (" 3 % ", 3.0), ("0", 0.0)],
)
def test_parse_percent_examples(value, percent):
    assert units.parse_percent(value) == percent


@pytest.mark.parametrize(
    "bad", [101, -0.1, "100.5", "x", "", "%", "1%%", "nan", "inf", "-inf", None, math.nan]
)
def test_parse_percent_rejects(bad):
    with pytest.raises(ValueError):
        units.parse_percent(bad)


@settings(max_examples=200, deadline=None)
@given(value=st.floats(min_value=0, max_value=100, allow_nan=False))
def test_parse_percent_in_range(value):
    assert units.parse_percent(value) == value
    assert units.parse_percent(f"{value!r}%") == value


@settings(max_examples=100, deadline=None)
@given(
    value=st.one_of(
        st.floats(max_value=-1e-9, allow_nan=False, allow_infinity=False),
        st.floats(min_value=100.000001, allow_nan=False, allow_infinity=False),
    )
)
def test_parse_percent_out_of_range(value):
    with pytest.raises(ValueError, match="between 0 and 100"):
        units.parse_percent(value)


# -- messages ------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "parser", [units.parse_rate, units.parse_duration, units.parse_size]
)
def test_unparseable_input_message_says_what_is_accepted(parser):
    # Regression: the module docstring promises "Every parser raises ValueError with a message that
    # says what forms are accepted", but input that is not `<number><unit>` at all (here
    # "fast") gets only "'fast' is not a number with a unit" from units._split, with no
    # example of an accepted form (contrast the unknown-unit messages, which say "e.g. ...").
    with pytest.raises(ValueError) as caught:
        parser("fast")
    message = str(caught.value)
    assert "'fast'" in message
    assert "e.g." in message


def test_doctor_says_which_tcp_congestion_control_labs_use_and_what_the_host_has():
    from pathlib import Path

    from orchestrator import doctor

    check = doctor._tcp_congestion()
    host = Path("/proc/sys/net/ipv4/tcp_congestion_control").read_text().strip()
    assert check.name == "tcp congestion" and "\n" not in check.detail
    assert check.detail.startswith("labs use cubic (servers.tcp_congestion)") and f"host default {host}" in check.detail
    assert check.ok == ("cubic" in Path("/proc/sys/net/ipv4/tcp_available_congestion_control").read_text().split())


# -- hostile values: ValueError with a short message, never another exception --------------


@pytest.mark.parametrize("parser", [units.parse_rate, units.parse_duration, units.parse_size, units.parse_percent])
@pytest.mark.parametrize(
    "value",
    [10**400, -(10**400), 2**20_000, "9" * 400 + "T", "9" * 400, "x" * 1_000_000, "1\n" * 1000, [1] * 100_000],
    ids=["int-400-digits", "negative-int", "int-6000-digits", "string-overflow", "string-400-digits",
         "megabyte-string", "lines", "list"],
)
def test_hostile_values_raise_value_error_with_a_short_line(parser, value):
    # Regression: an int beyond a float (a YAML number of 400 digits) raised OverflowError
    # (a traceback), and every message quoted the whole value with !r.
    with pytest.raises(ValueError) as caught:
        parser(value)
    message = str(caught.value)
    assert "\n" not in message and len(message) < 150, message[:300]


@pytest.mark.parametrize(("value", "text"), [
    ("100Mbit", "'100Mbit'"), (1.5, "1.5"), (True, "True"), (None, "None"), ("a\nb", "'a\\nb'"),
])
def test_shown_is_the_repr_of_small_values(value, text):
    assert units.shown(value) == text


@pytest.mark.parametrize(
    "value", ["x" * 1_000_000, 2**100_000, -(2**100_000), list(range(100_000)), {str(i): [i] * 100 for i in range(1000)},
              "\u2028" * 1000, b"\x00" * 1000],
    ids=["megabyte-string", "huge-int", "huge-negative-int", "long-list", "big-dict", "separators", "bytes"],
)
def test_shown_is_short_and_one_line_whatever_the_value(value):
    text = units.shown(value)
    assert len(text) <= 50 and text.isprintable(), text


@pytest.mark.parametrize("value,seconds", [("5s", 5.0), ("500ms", 0.5), (2, 2.0), (0.25, 0.25)])
def test_parse_interval_reads_durations_and_plain_numbers_as_seconds(value, seconds):
    assert units.parse_interval(value) == pytest.approx(seconds)


@pytest.mark.parametrize("bad,message", [("5", "give a unit"), ("0s", "longer than zero"), (0, "longer than zero"),
                                         (-1, "longer than zero"), ("5 parsecs", "unknown time unit")])
def test_parse_interval_refuses_bare_text_numbers_and_nothing(bad, message):
    with pytest.raises(ValueError, match=message):
        units.parse_interval(bad)


# -- exponents, NaN, infinity, and the interval's day ------------------------------------------


@pytest.mark.parametrize(("value", "seconds"), [("1e3ms", 1.0), ("2.5e-3s", 0.0025), ("1E2us", 1e-4),
                                                ("1e+1s", 10.0), (".5e1ms", 0.005)])
def test_durations_take_exponent_notation(value, seconds):
    # Regression: `--for 1e12s` said "is not a number with a unit": _NUMBER had no exponent.
    assert units.parse_duration(value) == pytest.approx(seconds)
    assert units.parse_interval(value) == pytest.approx(seconds)


@pytest.mark.parametrize(("value", "bits", "size"), [("1e3", 1000, 1000), ("1.5e3k", 1_500_000, 1_536_000)])
def test_rates_and_sizes_take_exponent_notation(value, bits, size):
    assert units.parse_rate(value) == bits
    assert units.parse_size(value) == size


@pytest.mark.parametrize("parser", [units.parse_duration, units.parse_interval, units.parse_rate, units.parse_size])
@pytest.mark.parametrize("value", [math.inf, -math.inf, "inf", "infs", "INFms", "-infs", "infinity"])
def test_infinity_is_refused_as_not_finite(parser, value):
    # Regression: YAML's .inf as a duration came out as "'infs' is not a number with a unit".
    with pytest.raises(ValueError, match="infinite: a quantity must be finite") as caught:
        parser(value)
    assert "not a number with a unit" not in str(caught.value)


@pytest.mark.parametrize(("parser", "value"), [
    *((parser, value) for parser in (units.parse_duration, units.parse_interval, units.parse_rate, units.parse_size)
      for value in (math.nan, "nan", "nans", "NaN ms")),
    (units.parse_percent, math.nan), (units.parse_percent, "nan"), (units.parse_percent, "NaN%")])
def test_nan_is_refused_as_not_a_number(parser, value):
    # Regression: NaN said "must not be negative" (a timeline) or "must lie between 0 and 100".
    with pytest.raises(ValueError, match=r"is not a number \(NaN\)"):
        parser(value)


def test_a_word_that_starts_like_nan_or_inf_is_not_mistaken_for_one():
    with pytest.raises(ValueError, match="is not a number with a unit"):
        units.parse_duration("nanoseconds")
    with pytest.raises(ValueError, match="is not a number with a unit"):
        units.parse_duration("information")


@pytest.mark.parametrize("value", ["1e12s", 1e12, 86_401, "86401s", "1e8ms", 10**400])
def test_an_interval_longer_than_a_day_is_refused_naming_the_bound(value):
    # Regression: `testbed fault LAB link-down A-B --for 1e12s` was accepted (once parsed).
    with pytest.raises(ValueError) as caught:
        units.parse_interval(value)
    message = str(caught.value)
    assert "longer than a day (86,400 s)" in message, message
    assert "\n" not in message and len(message) < 150


def test_an_interval_of_exactly_a_day_is_accepted():
    assert units.parse_interval("86400s") == units.parse_interval(86_400) == units.MAX_INTERVAL == 86_400.0


@pytest.mark.parametrize("value", ["1e3", "2.5e-3", " 7 "])
def test_a_quoted_bare_number_in_exponent_form_is_refused_as_an_interval(value):
    # "1e3" must not slip past the bare-number check and be read as tc's milliseconds
    with pytest.raises(ValueError, match="give a unit"):
        units.parse_interval(value)


def test_parse_interval_s_callers_are_fault_durations_and_periods_only():
    """The day's bound fits parse_interval because only fault durations (--for) and a
    flap's period use it; a new caller with longer intervals needs a bound of its own."""
    import re
    from pathlib import Path

    root = Path(units.__file__).parent
    users = sorted(str(p.relative_to(root)) for p in root.rglob("*.py")
                   if p.name != "units.py" and re.search(r"\bparse_interval\b", p.read_text()))
    assert users == ["cli.py", "faults/actions.py"], users
