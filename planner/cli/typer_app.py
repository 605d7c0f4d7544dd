"""The typer application object that every command module registers on, and typer's value
coercion without pydantic for the values that need none (_install_fast_coercion)."""

import re
from enum import Enum
from typing import Any

import typer

_DIGITS = re.compile(r"[0-9]{1,15}")
_DECIMAL = re.compile(r"[0-9]{1,15}(\.[0-9]{1,15})?")


def _install_fast_coercion() -> None:
    """typer (0.2x) coerces every option's value through a pydantic TypeAdapter built per
    option, on every run: importing typer._adapters (pydantic's validation machinery) and
    building the adapters took ~0.1 s of `planner solve`'s start-up (42 options) and ~0.05 s of
    `planner clusters`. Most values need no adapter: an option left unset (None), a flag's
    bool, a str for a str option, a default already of the option's type, plain digits for an
    int option within its range. Those are answered as the adapter answers them; any other
    value (a malformed or out-of-range number, a choice given as text, a path, a list) goes
    to typer's own adapter, built on first use, so its errors and conversions are typer's.
    A typer without this layer (older or newer internals) is left as it is."""
    try:
        from typer import _coercion, core
    except ImportError:
        return
    base = getattr(_coercion, "RuntimeParam", None)
    build = getattr(core, "build_runtime_param", None)
    if base is None or build is None or getattr(build, "planner_fast", False):
        return

    class _LazyParam(base):  # type: ignore[misc, valid-type]
        """A RuntimeParam answering simple values itself, typer's for the rest."""

        def __init__(self, descriptor: Any) -> None:
            object.__setattr__(self, "parameter_info", descriptor.parameter_info)
            object.__setattr__(self, "annotation", descriptor.annotation)
            object.__setattr__(self, "_descriptor", descriptor)
            object.__setattr__(self, "_typer", None)

        def _coerce_value(self, value: Any, param: Any, ctx: Any) -> Any:
            done, out = _simple(self._descriptor, value)
            if done:
                return out
            if self._typer is None:
                object.__setattr__(self, "_typer", build(self._descriptor))
            return self._typer._coerce_value(value, param=param, ctx=ctx)

    def fast_build(descriptor: Any) -> Any:
        if descriptor.file_annotation is not None:
            return build(descriptor)
        return _LazyParam(descriptor)

    fast_build.planner_fast = True  # type: ignore[attr-defined]
    core.build_runtime_param = fast_build


def _simple(descriptor: Any, value: Any) -> tuple[bool, Any]:
    """(True, what typer's adapter returns) for a value that needs no adapter, else (False,
    None). Only exact types: pydantic reads True as the int 1, which is left to it."""
    info, kind = descriptor.parameter_info, descriptor.annotation
    if info.parser is not None or getattr(info, "click_type", None) is not None:
        return False, None
    if kind is bool and type(value) is bool:
        return True, value
    if kind is str and type(value) is str and not descriptor.is_choice:
        return True, value
    if isinstance(kind, type) and issubclass(kind, Enum) and type(value) is kind:
        return True, value  # a default already of the option's choices
    if kind in (int, float) and not getattr(info, "clamp", False):
        number: Any = None
        if type(value) is kind:
            number = value
        elif type(value) is str and kind is int and _DIGITS.fullmatch(value):
            number = int(value)
        elif type(value) is str and kind is float and _DECIMAL.fullmatch(value):
            number = float(value)
        if number is not None and (info.min is None or number >= info.min) and (
                info.max is None or number <= info.max):
            return True, number
    return False, None


_install_fast_coercion()

app = typer.Typer(
    name="planner",
    help="3D-parallelism planner for LLM training: ranked, memory-safe layouts with predicted "
    "step time, and the tools to check them (validate, profile, calibrate). Piped output is "
    "drawn 160 columns wide: set COLUMNS (e.g. COLUMNS=220) to widen help and tables.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
)


@app.callback()
def _group() -> None:
    """Keeps `planner COMMAND` a group when main() has registered only the command being run
    (typer runs a lone command without its name otherwise)."""
