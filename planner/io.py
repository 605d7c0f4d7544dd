"""Files a user keeps: written atomically (temp file + rename), run records appended."""

from __future__ import annotations

import json
import os
import tempfile
from pathlib import Path
from typing import Any


def check_output_file(path: str | Path, what: str = "output file") -> Path:
    """`path` as a file that can be written (its missing folders are made on write), or
    SpecError in one line: empty, a directory, under a plain file, or in a folder that cannot
    be written."""
    from planner.errors import SpecError

    text = str(path)
    if not text.strip() or text.strip() == ".":
        raise SpecError(f"{what}: no file name (the path is empty or '.')")
    if "\0" in text:
        raise SpecError(f"{what} {text!r}: a path cannot hold a NUL byte")
    path = Path(path)
    try:
        if path.is_dir():
            raise SpecError(f"{what} {path}: is a directory, not a file")
        for folder in path.parents:  # the nearest existing ancestor must be a writable folder
            if folder.exists():
                if not folder.is_dir():
                    raise SpecError(f"{what} {path}: {folder} is a file, not a folder")
                if not os.access(folder, os.W_OK | os.X_OK):
                    raise SpecError(f"{what} {path}: folder {folder} is not writable")
                break
        if path.exists() and not os.access(path, os.W_OK):
            raise SpecError(f"{what} {path}: the file is not writable")
    except OSError as exc:  # a name too long for the file system, a loop of links
        raise SpecError(f"{what} {path}: {exc.strerror or exc}") from None
    return path


def write_text_atomic(path: str | Path, text: str) -> None:
    """Write `text` to `path` so a reader sees the old file or the new one, never half."""
    path = check_output_file(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "w") as f:
            f.write(text)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def write_bytes_atomic(path: str | Path, data: bytes) -> None:
    """Write `data` to `path` atomically (figures: PNG, SVG)."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def append_jsonl(path: str | Path, record: dict[str, Any]) -> None:
    """Append one JSON object as a line; earlier lines are never rewritten. The line goes out in
    one write(2) on an O_APPEND descriptor, so concurrent appenders (ranks, the launcher) and an
    interrupt leave whole lines; a last line left without its newline (a writer killed mid-line)
    is closed first, so the new record stays on a line of its own."""
    path = check_output_file(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    data = (json.dumps(record, default=str) + "\n").encode()
    fd = os.open(path, os.O_RDWR | os.O_APPEND | os.O_CREAT, 0o666)
    try:
        size = os.fstat(fd).st_size
        if size and os.pread(fd, 1, size - 1) != b"\n":
            data = b"\n" + data
        view = memoryview(data)
        while view:
            view = view[os.write(fd, view):]
        os.fsync(fd)
    finally:
        os.close(fd)


def read_jsonl(path: str | Path) -> list[dict[str, Any]]:
    """All records of a JSON-lines file (blank lines skipped). Each is what its line holds (a
    caller that needs objects checks, so one bad line need not refuse the file); SpecError
    naming the file for a file that cannot be read, is not UTF-8 text, or has a line that is
    not JSON."""
    from planner.errors import SpecError

    text = read_text(path, "runs file")
    out = []
    for i, line in enumerate(text.splitlines(), 1):
        if line.strip():
            try:
                out.append(json.loads(line))
            except json.JSONDecodeError as exc:
                raise SpecError(f"{path}:{i}: invalid JSON: {exc.msg}") from None
            except RecursionError:
                raise SpecError(f"{path}:{i}: JSON nested too deeply") from None
    return out


def read_text(path: str | Path, what: str = "file") -> str:
    """The UTF-8 text of a user's file, or SpecError in one line naming it: missing, a folder,
    unreadable, or not text (a binary file, a Latin-1 byte)."""
    from planner.errors import SpecError

    path = Path(path)
    try:
        data = path.read_bytes()
    except IsADirectoryError:
        raise SpecError(f"{what} {path}: is a directory, not a file") from None
    except FileNotFoundError:
        raise SpecError(f"{what} not found: {path}") from None
    except OSError as exc:
        raise SpecError(f"cannot read {path}: {exc.strerror or exc}") from None
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise SpecError(f"{path}: not UTF-8 text (byte 0x{data[exc.start]:02x} at offset "
                        f"{exc.start}); save it as UTF-8") from None
