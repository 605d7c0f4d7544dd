"""Field types that encode physics, shared by the schemas: whole counts and finite reals with
their bounds (planner.limits), booleans refused where a number is meant (pydantic's lax mode
would read `"vocab_size": true` as 1)."""

from __future__ import annotations

from typing import Annotated, Any

from pydantic import BeforeValidator, Field


def _not_bool(value: Any) -> Any:
    if isinstance(value, bool):
        raise ValueError(f"expected a number, got the boolean {str(value).lower()}")
    return value


def _bounded(upper: float, what: str) -> Any:
    """Refuse a number past `upper` with the bound in the message (pydantic's own message for
    10**30 in an int field is 'exceeded maximum size', which does not say the bound)."""

    def check(value: Any) -> Any:
        value = _not_bool(value)
        if isinstance(value, int | float) and value == value and value > upper:
            bound = int(upper) if float(upper).is_integer() else upper
            raise ValueError(f"{value:.6g} is more than {bound}, the largest {what} accepted")
        return value

    return BeforeValidator(check)


def count(upper: int, lower: int = 1) -> Any:
    """A whole number in [lower, upper] (the bound is named in the error)."""
    floor = {"gt": 0} if lower == 1 else {"ge": lower}  # "greater than 0" for a positive count
    return Annotated[int, _bounded(upper, "count"), Field(le=upper, **floor)]


def real(upper: float, *, gt: float | None = 0.0, ge: float | None = None) -> Any:
    """A finite real in (gt, upper] (or [ge, upper]); inf and NaN are refused."""
    bounds = {"ge": ge} if ge is not None else {"gt": gt}
    return Annotated[float, _bounded(upper, "value"),
                     Field(le=upper, allow_inf_nan=False, **bounds)]


Fraction = real(1.0)  # an efficiency or share of a peak: (0, 1]
UnitInterval = real(1.0, ge=0.0)  # [0, 1]
