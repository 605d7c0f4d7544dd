"""Nothing a user owns is damaged (issue 20, "Files a user owns"): the output writer
(planner.io.write_output) writes through links, writes devices and FIFOs in place, streams "-" to
stdout, honours the umask and keeps an existing file's mode; every output and input path is
checked before any work. Run as root where it matters (a FIFO, a device, a read-only place)."""

from __future__ import annotations

import json
import os
import stat
import threading
from pathlib import Path

import pytest
from inproc import assert_one_line_exit_2, invoke

from planner.io import TEMP_NAME_EXTRA, write_output

ROOT = Path(__file__).resolve().parents[2]
SOLVE = ("solve", "-m", "llama3-8b", "-c", "8xH100", "--top", "1")
CPU_PROFILE = ROOT / "validate/measured/cpu-gloo-2proc.yaml"
CPU_RUNS = ROOT / "validate/measured/runs-cpu.jsonl"
# a place no one can create files in, root included (os.access says yes to root there)
UNWRITABLE = Path("/proc/planner-cannot-write-here")


def _csv_header(text: str) -> bool:
    return text.startswith("rank,tp,pp,dp,")


# ---- the writer ---------------------------------------------------------------------------

def test_csv_through_a_symlink_writes_the_target_and_keeps_the_link(tmp_path):
    target = tmp_path / "real.csv"
    target.write_text("old\n")
    link = tmp_path / "link.csv"
    link.symlink_to(target.name)
    result = invoke(*SOLVE, "--csv", str(link))
    assert result.code == 0, result.stderr
    assert link.is_symlink() and os.readlink(link) == "real.csv"
    assert _csv_header(target.read_text())
    assert sorted(p.name for p in tmp_path.iterdir()) == ["link.csv", "real.csv"]  # no temp left


def test_a_dangling_link_creates_its_target(tmp_path):
    link = tmp_path / "link.csv"
    link.symlink_to("made.csv")
    assert invoke(*SOLVE, "--csv", str(link)).code == 0
    assert link.is_symlink() and _csv_header((tmp_path / "made.csv").read_text())


def test_csv_into_a_fifo_streams_and_the_fifo_stays(tmp_path):
    fifo = tmp_path / "plans.fifo"
    os.mkfifo(fifo)
    got: list[bytes] = []
    reader = threading.Thread(target=lambda: got.append(fifo.read_bytes()), daemon=True)
    reader.start()
    result = invoke(*SOLVE, "--csv", str(fifo))
    reader.join(timeout=30)
    assert result.code == 0, result.stderr
    assert stat.S_ISFIFO(fifo.lstat().st_mode)  # not replaced by a regular file
    assert got and _csv_header(got[0].decode())


@pytest.fixture
def null_device(tmp_path) -> Path:
    """A character device node like /dev/null (1, 3) made in tmp_path: a writer that replaced
    it (main did) would replace this node, never the system's /dev/null."""
    node = tmp_path / "null"
    try:
        os.mknod(node, 0o666 | stat.S_IFCHR, os.makedev(1, 3))
    except (PermissionError, OSError) as exc:
        pytest.skip(f"cannot make a device node here: {exc}")
    return node


def test_csv_to_a_device_writes_it_in_place(null_device):
    before = os.lstat(null_device)
    result = invoke(*SOLVE, "--csv", str(null_device))
    assert result.code == 0, result.stderr
    after = os.lstat(null_device)
    assert stat.S_ISCHR(after.st_mode) and after.st_rdev == os.makedev(1, 3)
    assert after.st_ino == before.st_ino  # the same node, not a new file renamed over it


def test_csv_dash_is_stdout_and_the_table_goes_to_stderr(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    result = invoke(*SOLVE, "--csv", "-")
    assert result.code == 0, result.stderr
    assert _csv_header(result.stdout) and not (tmp_path / "-").exists()
    assert "tp1" in result.stderr or "tp" in result.stderr  # the table, not lost
    assert_one_line_exit_2(invoke(*SOLVE, "--csv", "-", "--json"), "--csv -", "stdout")


def test_new_files_honour_the_umask_and_existing_files_keep_their_mode(tmp_path):
    old = os.umask(0o027)
    try:
        new = tmp_path / "new.csv"
        write_output(new, "a\n")
        assert stat.S_IMODE(new.stat().st_mode) == 0o640  # 0666 & ~027
        kept = tmp_path / "kept.csv"
        kept.write_text("old\n")
        os.chmod(kept, 0o644)
        write_output(kept, "b\n")
        assert stat.S_IMODE(kept.stat().st_mode) == 0o644 and kept.read_text() == "b\n"
        os.chmod(kept, 0o600)
        write_output(kept, "c\n")
        assert stat.S_IMODE(kept.stat().st_mode) == 0o600
    finally:
        os.umask(old)


def test_an_existing_file_keeps_its_owner(tmp_path):
    if os.geteuid() != 0:
        pytest.skip("giving a file to another owner needs root")
    path = tmp_path / "theirs.csv"
    path.write_text("old\n")
    os.chown(path, 1234, 5678)
    write_output(path, "new\n")
    st = path.stat()
    assert (st.st_uid, st.st_gid) == (1234, 5678) and path.read_text() == "new\n"


# ---- every output checked before any work -------------------------------------------------

def _long_name(folder: Path, suffix: str) -> Path:
    return folder / ("x" * (256 - len(suffix) - TEMP_NAME_EXTRA + 1) + suffix)


@pytest.mark.parametrize("kind", ["unwritable", "file-as-folder", "long-name"])
def test_calibrate_plot_on_a_bad_path_is_one_line_and_out_is_not_written(tmp_path, kind):
    (tmp_path / "plain").write_text("keep\n")
    plot = {"unwritable": UNWRITABLE / "fit.png", "file-as-folder": tmp_path / "plain" / "f.png",
            "long-name": _long_name(tmp_path, ".png")}[kind]
    out = tmp_path / "fitted.yaml"
    result = invoke("calibrate", "--runs", str(CPU_RUNS), "--profile", str(CPU_PROFILE),
                    "--out", str(out), "--plot", str(plot), "--no-cv")
    assert_one_line_exit_2(result, "--plot")
    assert not out.exists()
    assert (tmp_path / "plain").read_text() == "keep\n"


@pytest.mark.parametrize("kind", ["unwritable", "existing-file", "long-name"])
def test_explain_figures_on_a_bad_folder_is_one_line(tmp_path, kind):
    (tmp_path / "plain").write_text("keep\n")
    folder = {"unwritable": UNWRITABLE / "figs", "existing-file": tmp_path / "plain",
              "long-name": tmp_path / ("d" * 300)}[kind]
    result = invoke("explain", "-m", "llama3-8b", "-c", "8xH100", "--rank", "1",
                    "--figures", str(folder))
    assert_one_line_exit_2(result, "--figures")
    assert (tmp_path / "plain").read_text() == "keep\n"


def test_csv_in_a_read_only_place_is_one_line():
    assert_one_line_exit_2(invoke(*SOLVE, "--csv", str(UNWRITABLE / "plans.csv")),
                           "--csv", "not writable")


@pytest.mark.skipif(os.geteuid() == 0, reason="root writes into a 0555 folder")
def test_csv_in_a_read_only_folder_is_one_line(tmp_path):
    folder = tmp_path / "ro"
    folder.mkdir()
    folder.chmod(0o555)
    assert_one_line_exit_2(invoke(*SOLVE, "--csv", str(folder / "p.csv")), "not writable")


def test_runs_records_cannot_go_to_stdout_or_a_device(null_device):
    assert_one_line_exit_2(invoke("validate", "-m", "llama2-7b", "--out", "-", "--print-only"),
                           "--out -")
    assert_one_line_exit_2(invoke("validate", "-m", "llama2-7b", "--out", str(null_device),
                                  "--print-only"), "not a regular file")


# ---- inputs -------------------------------------------------------------------------------

@pytest.mark.parametrize("command", ["estimate", "solve", "export"])
def test_non_utf8_config_is_one_line(tmp_path, command):
    config = tmp_path / "train.yaml"
    config.write_bytes(b"# caf\xe9\ntensor_model_parallel_size: 2\n")
    extra = ["--to", "megatron"] if command == "export" else []
    assert_one_line_exit_2(invoke(command, "--config", str(config), "-c", "H100", *extra),
                           "not UTF-8")


@pytest.mark.parametrize(("args", "what"), [
    (("solve", "-c", "8xH100", "--model", "{d}/spec.json"), "model file"),
    (("solve", "-m", "llama3-8b", "-c", "8xH100", "--profile", "{d}/gpu.yaml"), "profile file"),
    (("calibrate", "--profile", "A100", "--out", "{d}/o.yaml", "--runs", "{d}/runs.jsonl"),
     "runs file"),
    (("solve", "-c", "H100", "--config", "{d}/conf.yaml"), "config"),
])
def test_a_folder_given_for_an_input_file_says_is_a_directory(tmp_path, args, what):
    args = tuple(a.format(d=tmp_path) for a in args)
    for a in args:
        if a.startswith(str(tmp_path)) and not a.endswith("o.yaml"):
            Path(a).mkdir()
    assert_one_line_exit_2(invoke(*args), what, "is a directory")


def test_solve_json_prints_an_empty_list_when_nothing_fits():
    result = invoke("solve", "-m", "llama3-70b", "-c", "8xA100", "--tp", "1", "--pp", "1",
                    "--json")
    assert result.code == 1  # docs/contract.md: nothing fits
    assert json.loads(result.stdout) == []
    assert result.stderr.startswith("error: no layout of llama3-70b fits")


# ---- calibrate: records of another device --------------------------------------------------

def test_calibrate_refuses_cpu_records_against_a_gpu_profile_unless_forced(tmp_path):
    out = tmp_path / "a100.yaml"
    result = invoke("calibrate", "--runs", str(CPU_RUNS), "--profile", "A100", "--out",
                    str(out), "--no-cv")
    assert_one_line_exit_2(result, "CPU", "A100", "--force")
    assert not out.exists()
    forced = invoke("calibrate", "--runs", str(CPU_RUNS), "--profile", "A100", "--out",
                    str(out), "--no-cv", "--force")
    assert forced.code == 0, forced.stderr
    assert out.exists() and "warning:" in forced.stderr and "--force" in forced.stderr


def test_calibrate_takes_cpu_records_against_a_cpu_profile(tmp_path):
    out = tmp_path / "cpu.yaml"
    result = invoke("calibrate", "--runs", str(CPU_RUNS), "--profile", str(CPU_PROFILE),
                    "--out", str(out), "--no-cv")
    assert result.code == 0, result.stderr
    assert "measured on" not in result.stderr


# ---- runs files with lines that are not JSON -----------------------------------------------

def test_a_torn_line_and_a_comment_are_skipped_with_one_warning(tmp_path):
    lines = CPU_RUNS.read_text().splitlines()
    runs = tmp_path / "runs.jsonl"
    runs.write_text("# my runs\n" + "\n".join(lines[:3]) + "\n" + lines[3][:40] + "\n"
                    + "\n".join(lines[4:6]) + "\n")
    out = tmp_path / "fitted.yaml"
    result = invoke("calibrate", "--runs", str(runs), "--profile", str(CPU_PROFILE), "--out",
                    str(out), "--no-cv", "--json")
    assert result.code == 0, result.stderr
    warnings = [w for w in result.error_lines if "not JSON" in w]
    assert warnings == [f"warning: {runs}:1: not JSON (Expecting value); skipped (1 more such "
                        "line)"]
    summary = json.loads(result.stdout)
    assert len(summary["runs"]) == 5  # every whole record used
