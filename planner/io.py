"""Files a user keeps: one writer for every output (write_output: through links, in place for
devices and FIFOs, atomic temp file + rename for regular files, "-" = stdout), run records
appended, and the readers of a user's text and JSON-lines files."""

from __future__ import annotations

import contextlib
import json
import os
import stat
import sys
import tempfile
from pathlib import Path
from typing import Any

STDOUT = "-"  # an output path of "-" means standard output


def output_target(path: str | Path) -> Path:
    """Where writing `path` lands: the file at the end of its symbolic links (a dangling link
    names the file it will create). The link itself is never replaced."""
    return Path(os.path.realpath(path))


def check_output_file(path: str | Path, what: str = "output file") -> Path:
    """`path` as a file that can be written (its missing folders are made on write), or
    SpecError in one line: empty, a directory, under a plain file, in a folder that cannot be
    written, or a name the file system refuses (too long). "-" (stdout) passes; a link is
    checked at its target; a device or FIFO is written in place, so it must be writable."""
    from planner.errors import SpecError

    text = str(path)
    if text == STDOUT:
        return Path(text)
    if not text.strip() or text.strip() == ".":
        raise SpecError(f"{what}: no file name (the path is empty or '.')")
    if "\0" in text:
        raise SpecError(f"{what} {text!r}: a path cannot hold a NUL byte")
    path = Path(path)
    try:
        target = output_target(path)
        if target.is_dir():
            raise SpecError(f"{what} {path}: is a directory, not a file")
        _check_name(target)
        for folder in target.parents:  # the nearest existing ancestor must be a writable folder
            if folder.exists():
                if not folder.is_dir():
                    raise SpecError(f"{what} {path}: {folder} is a file, not a folder")
                if not target.exists() and not _can_create_in(folder):
                    raise SpecError(f"{what} {path}: folder {folder} is not writable")
                break
        try:
            os.stat(target)
        except FileNotFoundError:
            pass
        if target.exists() and not os.access(target, os.W_OK):
            raise SpecError(f"{what} {path}: the file is not writable")
        if (target.exists() and stat.S_ISREG(target.stat().st_mode)
                and not _can_create_in(target.parent)):
            raise SpecError(f"{what} {path}: folder {target.parent} is not writable (the file "
                            "is replaced whole, through a new file beside it)")
    except OSError as exc:  # a name too long for the file system, a loop of links
        raise SpecError(f"{what} {path}: {exc.strerror or exc}") from None
    return path


def check_records_file(path: str | Path, what: str = "runs file") -> Path:
    """check_output_file for a JSON-lines file of run records, which is appended to and read
    back: also refuse "-" and a target that is not a regular file (a device, a FIFO)."""
    from planner.errors import SpecError

    if str(path) == STDOUT:
        raise SpecError(f"{what} -: run records are appended to a file and read back; give a "
                        "file name")
    path = check_output_file(path, what)
    target = output_target(path)
    if target.exists() and not target.is_file():
        raise SpecError(f"{what} {path}: not a regular file (run records are appended to a "
                        "file and read back)")
    return path


def check_output_folder(path: str | Path, what: str = "output folder") -> Path:
    """`path` as a folder files can be written into (made, with its parents, on write), or
    SpecError in one line: empty, an existing file, under a plain file, in an unwritable folder,
    or a name the file system refuses."""
    from planner.errors import SpecError

    text = str(path)
    if not text.strip() or text == STDOUT:
        raise SpecError(f"{what}: no folder name")
    if "\0" in text:
        raise SpecError(f"{what} {text!r}: a path cannot hold a NUL byte")
    path = Path(path)
    try:
        target = output_target(path)
        _check_name(target)
        for folder in (target, *target.parents):
            if folder.exists():
                if not folder.is_dir():
                    raise SpecError(f"{what} {path}: {folder} is a file, not a folder")
                if not _can_create_in(folder):
                    raise SpecError(f"{what} {path}: folder {folder} is not writable")
                break
    except OSError as exc:
        raise SpecError(f"{what} {path}: {exc.strerror or exc}") from None
    return path


def _can_create_in(folder: Path) -> bool:
    """Whether a file can be made in `folder`: tried (a temp file made and removed), since
    os.access says yes to root on a read-only mount point such as /proc or /sys."""
    if not os.access(folder, os.W_OK | os.X_OK):
        return False
    try:
        fd, tmp = tempfile.mkstemp(dir=folder, prefix=".planner-probe.", suffix=".tmp")
    except OSError:
        return False
    os.close(fd)
    os.unlink(tmp)
    return True


def _check_name(path: Path) -> None:
    """OSError(ENAMETOOLONG) when a part of `path` is longer than its file system allows; the
    last part leaves room for the temp file's prefix and suffix (TEMP_NAME_EXTRA characters)."""
    import errno

    existing = next((p for p in (path, *path.parents) if p.exists()), Path("/"))
    try:
        limit = os.pathconf(existing, "PC_NAME_MAX")
    except (OSError, ValueError):
        limit = 255
    for i, part in enumerate(path.parts):
        extra = TEMP_NAME_EXTRA if i == len(path.parts) - 1 else 0
        if len(os.fsencode(part)) + extra > limit:
            raise OSError(errno.ENAMETOOLONG, f"file name too long ({len(os.fsencode(part))} "
                          f"bytes, at most {limit - extra} here)")


TEMP_NAME_EXTRA = 16  # ".NAME.XXXXXXXX.tmp": the temp file's name is this much longer


def _umask() -> int:
    """The process's umask (from /proc without changing it; else set and put back)."""
    try:
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith("Umask:"):
                return int(line.split()[1], 8)
    except (OSError, ValueError):
        pass
    mask = os.umask(0o022)
    os.umask(mask)
    return mask


def write_output(path: str | Path, data: str | bytes) -> None:
    """Write a user's output file (CSV, HTML, YAML, a figure, a launcher config).

    - "-": standard output.
    - a symbolic link: its target is written (the link stays).
    - a regular file, new or existing: a temp file in the target's folder, renamed over it, so a
      reader sees the old file or the new one, never half. A new file honours the umask
      (0666 & ~umask); an existing one keeps its mode, and its owner where we may set it.
    - anything else (a character or block device such as /dev/null, a FIFO): opened and written
      in place, never replaced.
    """
    raw = data.encode() if isinstance(data, str) else data
    if str(path) == STDOUT:
        out = sys.stdout
        out.flush()
        buffer = getattr(out, "buffer", None)
        if buffer is not None:
            buffer.write(raw)
            buffer.flush()
        else:  # a text-only stream (captured output)
            out.write(raw.decode(errors="replace"))
            out.flush()
        return
    from planner.errors import SpecError

    path = check_output_file(path)
    try:
        _write_file(output_target(path), raw)
    except OSError as exc:  # the disk filled, the device refused
        raise SpecError(f"cannot write {path}: {exc.strerror or exc}") from None


def _write_file(target: Path, raw: bytes) -> None:
    """write_output's work on the resolved target (see there)."""
    try:
        st = target.stat()
    except FileNotFoundError:
        st = None
    if st is not None and not stat.S_ISREG(st.st_mode):
        fd = os.open(target, os.O_WRONLY)  # a device, a FIFO: in place (no create, no rename)
        try:
            view = memoryview(raw)
            while view:
                view = view[os.write(fd, view):]
        finally:
            os.close(fd)
        return
    target.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=target.parent, prefix=f".{target.name}.", suffix=".tmp")
    try:
        if st is None:
            os.fchmod(fd, 0o666 & ~_umask())
        else:
            with contextlib.suppress(PermissionError):  # only root may give a file away
                os.fchown(fd, st.st_uid, st.st_gid)
            os.fchmod(fd, stat.S_IMODE(st.st_mode))
        with os.fdopen(fd, "wb") as f:
            f.write(raw)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, target)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def write_text_atomic(path: str | Path, text: str) -> None:
    """Write `text` to `path` (write_output: atomic for a regular file)."""
    write_output(path, text)


def write_bytes_atomic(path: str | Path, data: bytes) -> None:
    """Write `data` to `path` (write_output; figures: PNG, SVG)."""
    write_output(path, data)


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


def read_jsonl(path: str | Path, *, warn: bool = True) -> list[Any]:
    """The records of read_jsonl_lines, without their line numbers."""
    return [record for _, record in read_jsonl_lines(path, warn=warn)]


def read_jsonl_lines(path: str | Path, *, warn: bool = True) -> list[tuple[int, Any]]:
    """(line number from 1, record) of every record of a JSON-lines file (blank lines skipped).
    Each is what its line holds (a caller that needs objects checks, so one bad line need not
    refuse the file). A line that is
    not JSON (torn by a writer killed mid-line, a `# comment`) is skipped, with one warning on
    stderr naming the file and line (`warn`). SpecError naming the file for a file that cannot
    be read or is not UTF-8 text."""
    text = read_text(path, "runs file")
    out, bad = [], []
    for i, line in enumerate(text.splitlines(), 1):
        if line.strip():
            try:
                out.append((i, json.loads(line)))
            except json.JSONDecodeError as exc:
                bad.append(f"{path}:{i}: not JSON ({exc.msg})")
            except RecursionError:
                bad.append(f"{path}:{i}: JSON nested too deeply")
    if bad and warn:
        more = f" ({len(bad) - 1} more such line{'s' * (len(bad) > 2)})" if len(bad) > 1 else ""
        print(f"warning: {bad[0]}; skipped{more}", file=sys.stderr)
    return out


def require_file(path: str | Path, what: str = "file") -> Path:
    """`path` if it names an existing file (a link to one counts), else SpecError in one line:
    "is a directory" for a folder, "not found" otherwise."""
    from planner.errors import SpecError

    path = Path(path)
    try:
        is_dir, exists = path.is_dir(), path.exists()
    except (OSError, ValueError):  # a name too long, a NUL byte
        is_dir = exists = False
    if is_dir:
        raise SpecError(f"{what} {path}: is a directory, not a file")
    if not exists:
        raise SpecError(f"{what} not found: {path}")
    return path


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
