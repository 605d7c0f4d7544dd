"""typer's option coercion without pydantic for the values that need none
(planner.cli.typer_app._simple): every value it answers is answered as typer's own adapter
answers it (same value, same type), on a grid of option kinds and values; the rest go to
typer's adapter."""

from __future__ import annotations

from pathlib import Path

import pytest

typer_coercion = pytest.importorskip("typer._coercion")

from typer.models import OptionInfo  # noqa: E402

from planner.cli.options import PrecisionChoice  # noqa: E402
from planner.cli.typer_app import _simple  # noqa: E402

KINDS = [
    (int, OptionInfo()), (int, OptionInfo(min=1, max=16384)), (int, OptionInfo(min=0, max=3)),
    (float, OptionInfo(min=0.01, max=1024)), (float, OptionInfo()), (str, OptionInfo()),
    (bool, OptionInfo()), (PrecisionChoice, OptionInfo()), (Path, OptionInfo()),
    (int, OptionInfo(min=1, max=8, clamp=True)),
]
VALUES = [0, 1, 3, 8, 10, 16384, 16385, -2, True, False, 0.5, 2.0, 1e9, "0", "1", "007", "8",
          "16384", "16385", "-3", "+4", " 5", "5.0", "1_0", "1e3", "0.25", "2048.5", "",
          "abc", "bf16", PrecisionChoice.fp8, "x.yaml"]


def _typer(kind, info, value):
    descriptor = typer_coercion.resolve_type_descriptor(kind, info)
    runtime = typer_coercion.build_runtime_param(descriptor)
    try:
        return True, runtime._coerce_value(value, param=None, ctx=None)
    except Exception:  # typer refuses it (BadParameter) or needs a real param
        return False, None


@pytest.mark.parametrize("kind,info", KINDS)
def test_simple_values_are_typers_answers(kind, info) -> None:
    descriptor = typer_coercion.resolve_type_descriptor(kind, info)
    answered = 0
    for value in VALUES:
        done, got = _simple(descriptor, value)
        if not done:
            continue
        answered += 1
        ok, want = _typer(kind, info, value)
        assert ok and type(got) is type(want) and got == want, (kind, value, got, want)
    if kind is not Path and not info.clamp:  # (those go to typer's adapter)
        assert answered  # the fast path is taken for this kind of option


def test_installed_on_typers_builder() -> None:
    import typer.core

    import planner.cli.typer_app  # noqa: F401  (installs it)

    assert getattr(typer.core.build_runtime_param, "planner_fast", False)
