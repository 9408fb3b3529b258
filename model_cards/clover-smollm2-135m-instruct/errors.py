"""User errors: a bad argument, file or setting, reported as one line that says what is wrong.

`UserError` marks an error whose message is the whole story. The ``cerberus-hf`` command prints it as
one line (``cerberus-hf <command>: error: <message>``) and exits with status 2, without a traceback
(``--debug`` or ``CERBERUS_HF_DEBUG=1`` shows one). It is a ValueError, so library callers that catch
ValueError keep catching it. The checks below raise it for settings given as arguments or in a config.
"""

from __future__ import annotations

import math
import numbers


class UserError(ValueError):
    """A bad argument, file or setting; the message names it and says what is wrong, in one line."""


def check_int(name: str, value, minimum: int, optional: bool = False) -> int | None:
    """``value`` as an int when it is an integer (not a bool) >= ``minimum`` (or None when ``optional``)."""
    if value is None and optional:
        return None
    if isinstance(value, bool) or not isinstance(value, numbers.Integral) or value < minimum:
        raise UserError(f"{name} must be an integer >= {minimum}{' or None' if optional else ''}, got {value!r}.")
    return int(value)


def check_number(name: str, value, minimum: float | None = None, maximum: float | None = None,
                 optional: bool = False) -> float | None:
    """``value`` as a float when it is a real number (not a bool, not NaN) in [``minimum``, ``maximum``]
    (or None when ``optional``)."""
    if value is None and optional:
        return None
    if isinstance(value, bool) or not isinstance(value, numbers.Real):
        raise UserError(f"{name} must be a number{' or None' if optional else ''}, got {value!r}.")
    if math.isnan(value):
        raise UserError(f"{name} must be a number{' or None' if optional else ''}, not NaN.")
    if (minimum is not None and value < minimum) or (maximum is not None and value > maximum):
        low = "-inf" if minimum is None else f"{minimum:g}"
        high = "inf" if maximum is None else f"{maximum:g}"
        raise UserError(f"{name} must be in [{low}, {high}], got {value!r}.")
    return float(value)
