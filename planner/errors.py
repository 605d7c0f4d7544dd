"""Errors a user can cause. The CLI catches PlannerError once and prints one line (exit 2)."""

from __future__ import annotations


class PlannerError(ValueError):
    """Base class for every user-facing error (bad input, impossible request)."""

    exit_code = 2


class SpecError(PlannerError):
    """A model spec, GPU profile, cluster string, job or layout is malformed or unknown."""


class LayoutError(PlannerError):
    """Degrees that do not multiply to the GPU count or do not divide heads/layers/batch."""


class InfeasibleError(PlannerError):
    """No layout fits; `diagnosis` holds the readable reasons (exit 1)."""

    exit_code = 1

    def __init__(self, message: str, diagnosis: list[str] | None = None) -> None:
        super().__init__(message)
        self.diagnosis = diagnosis or []


def suggest(name: str, known: list[str], n: int = 3) -> str:
    """Return ' (did you mean: a, b?)' with the nearest known names, or ''."""
    import difflib

    close = difflib.get_close_matches(name.lower(), [k.lower() for k in known], n=n, cutoff=0.5)
    lower_to_real = {k.lower(): k for k in known}
    if not close:
        return ""
    return " (did you mean: " + ", ".join(lower_to_real[c] for c in close) + "?)"


def run_script(main) -> None:
    """Exit with a script's main() code; a PlannerError is one `error:` line and exit 2 (the
    benchmarks' entry point, as the CLI treats bad input)."""
    import sys

    try:
        code = main()
    except PlannerError as exc:
        print(f"error: {exc}", file=sys.stderr)
        sys.exit(2)
    sys.exit(code)
