"""Fuzz the CLI in-process (hypothesis): solve, estimate, validate --print-only, calibrate,
models, clusters and profile with good and bad option values in any order, unknown options and
missing values. Pass: no exception escapes planner.cli.main, no example takes a minute, the exit
code is 0, 1 or 2, exit 2 is exactly one `error: ...` line, and an input with a value outside its
option's domain always exits 2.

Examples per run: PLANNER_FUZZ_EXAMPLES (total over the CLI and file-reader fuzz tests, default
3,000; `PLANNER_FUZZ_EXAMPLES=10000 python -m pytest -m slow tests/cli/test_fuzz_cli.py
tests/unit/test_fuzz_readers.py` is the long run). The default run (CI) draws the same examples
every time (derandomize: a failure is reproducible and never a matter of luck); a run with
PLANNER_FUZZ_EXAMPLES set explores new ones each time."""

from __future__ import annotations

import os
import stat
import time
from datetime import timedelta

import pytest
from hypothesis import HealthCheck, assume, event, given, settings
from hypothesis import strategies as st
from inproc import invoke

pytestmark = pytest.mark.slow

TOTAL = int(os.environ.get("PLANNER_FUZZ_EXAMPLES", "3000"))
EXPLORE = "PLANNER_FUZZ_EXAMPLES" in os.environ  # new random examples; else CI's fixed ones
# share of the total per test (the CLI tests here and tests/unit/test_fuzz_readers.py add to 1)
SHARE = {"solve": 0.035, "estimate": 0.06, "validate": 0.04, "calibrate": 0.04, "lists": 0.01,
         "profile": 0.02, "explain": 0.005}
MAX_SECONDS = 60.0  # an example slower than this is a hang


def fuzz_settings(name: str):
    return settings(max_examples=max(10, int(TOTAL * SHARE[name])), deadline=timedelta(minutes=1),
                    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
                    derandomize=not EXPLORE, database=None)


# ---- option domains: values inside (good) and outside (bad) each option's domain -------------

BAD_INTS = ["0", "-1", "-8", str(2**31), str(2**63), str(10**30), "9" * 5000, "2.5", "1e30",
            "inf", "nan", "-Infinity", "", "x", "0x10", "1 000"]
BAD_FLOATS = ["inf", "-inf", "nan", "0", "-1", "1e30", "", "x", "1e400"]
GOOD_DEGREES = ["1", "2", "4", "8"]


@pytest.fixture(scope="module")
def paths(tmp_path_factory):
    """Files the options point at: writable places, a folder, a plain file, unreadable input."""
    root = tmp_path_factory.mktemp("fuzz-cli")
    (root / "folder").mkdir()
    (root / "plain").write_text("keep\n")
    (root / "latin1.yaml").write_bytes(b"name: caf\xe9\n")
    (root / "binary.jsonl").write_bytes(bytes(range(256)) * 4)
    (root / "number.jsonl").write_text("42\n")
    (root / "empty.csv").write_text("")
    record = ('{"ok": true, "model": "llama2-7b", "layers": 2, "hidden": 64, "heads": 4, '
              '"kv_heads": 4, "ffn": 128, "vocab": 128, "tp": 1, "pp": 1, "dp": 2, "cp": 1, '
              '"seq_len": 32, "global_batch": 4, "nproc_per_node": 2, '
              '"measured_step_time_s": %s}\n')
    (root / "runs.jsonl").write_text(record % "0.05" + record % "0.08")
    # a runs file a user kept: a comment, the two records, a line torn mid-record
    (root / "kept-runs.jsonl").write_text("# my runs\n" + record % "0.05" + record % "0.08"
                                          + record[:30] + "\n")
    (root / "link.csv").symlink_to("link-target.csv")  # written through, the link stays
    # a device node like /dev/null (1, 3), written in place; made here so that a writer that
    # replaced it could never replace the system's /dev/null
    try:
        os.mknod(root / "null", 0o666 | stat.S_IFCHR, os.makedev(1, 3))
    except OSError:  # not root: a plain file stands in (the device checks then pass trivially)
        (root / "null").write_text("")
    return root


def bad_paths(root) -> list[str]:
    return ["", str(root / "folder"), str(root / "plain" / "x.out"),
            "/proc/planner-fuzz/x.out", str(root / ("n" * 300 + ".out"))]


def output_files(root, name: str) -> list[str]:
    """Good places for an output file: a new file, stdout, a link, a device written in place."""
    return [str(root / name), "-", str(root / "link.csv"), str(root / "null")]


def check_user_files(root) -> None:
    """What the fuzz may never do to a user's files: replace the link or the device, lose the
    kept file, leave a file named '-' or a temp file behind."""
    assert (root / "link.csv").is_symlink()
    if os.geteuid() == 0:
        assert stat.S_ISCHR(os.lstat(root / "null").st_mode)
    assert (root / "plain").read_text() == "keep\n"
    assert not (root / "-").exists()
    assert not [p.name for p in root.iterdir() if p.name.endswith(".tmp")]


@st.composite
def options(draw, domains: dict[str, tuple[list[str], list[str]]], flags: list[str],
            required: tuple[str, ...] = ()):
    """(argv tokens, whether any value is outside its domain): each option absent, good or bad
    (about half the examples have no bad value, the others one or two), flags on or off, the
    pairs in any order, maybe an unknown option or a value left off."""
    names = list(domains)
    wrongable = [n for n in names if domains[n][1]]
    n_bad = draw(st.sampled_from([0, 0, 0, 1, 1, 2]))
    bad_names = set(draw(st.lists(st.sampled_from(wrongable), min_size=n_bad, max_size=n_bad))
                    if wrongable and n_bad else [])
    pairs = []
    for option in names:
        good, wrong = domains[option]
        if option in bad_names:
            pairs.append([option, draw(st.sampled_from(wrong))])
        elif good and (option in required or draw(st.integers(0, 3)) == 0):
            pairs.append([option, draw(st.sampled_from(good))])
    for flag in flags:
        if draw(st.booleans()):
            pairs.append([flag])
    pairs = draw(st.permutations(pairs))
    tail = draw(st.sampled_from([[]] * 8 + [["--bogus-option"], ["extra-argument"], ["--tp"],
                                            ["-m"]]))
    bad = bool(bad_names) or bool(tail)
    return [token for pair in pairs for token in pair] + tail, bad


def check(args: list[str], bad: bool, allowed: tuple[int, ...] = (0, 1, 2)) -> None:
    start = time.monotonic()
    result = invoke(*args)
    elapsed = time.monotonic() - start
    assert elapsed < MAX_SECONDS, f"{elapsed:.0f} s: planner {' '.join(args)}"
    assert "Traceback" not in result.stderr, (args, result.stderr)
    assert result.code in allowed, (args, result.code, result.stderr)
    event(f"exit {result.code}{' (bad input)' if bad else ''}")
    if result.code == 2:
        lines = result.error_lines
        assert len(lines) == 1 and lines[0].startswith("error: "), (args, result.stderr)
    if bad:
        assert result.code == 2, ("accepted a value outside its domain", args, result.stderr)


def model_cluster(paths) -> dict[str, tuple[list[str], list[str]]]:
    return {
        "--model": (["llama70b", "llama2-7b", "mixtral", "gpt3-175b", "deepseek-v3"],
                    ["", "m" * 300, "nosuch-model", "a/b/c.yaml", str(paths / "latin1.yaml"),
                     str(paths / "folder")]),
        "--cluster": (["8xA100", "64xH100", "16x8xH100", "2x4xA100-40GB", "128xA100"],
                      ["", "12x", "0xH100", "9" * 30 + "xH100", "8xA1000", "8x8x8xH100",
                       "-8xH100", "8.5xH100", "xH100", str(paths / "latin1.yaml"),
                       str(paths / "plain")]),
    }


def knobs() -> dict[str, tuple[list[str], list[str]]]:
    return {
        "--tp": (GOOD_DEGREES, BAD_INTS), "--pp": (GOOD_DEGREES, BAD_INTS),
        "--dp": (GOOD_DEGREES, BAD_INTS), "--cp": (["1", "2"], BAD_INTS),
        "--ep": (["1", "2"], BAD_INTS), "--vpp": (["1", "2"], BAD_INTS),
        "--mbs": (["1", "2", "16"], BAD_INTS),
        "--zero": (["0", "1", "2", "3"], ["4", "7", "-1", str(2**63), "x", ""]),
        "--recompute": (["none", "selective", "full"], ["maybe", "", "FULLY"]),
        "--precision": (["bf16", "fp16", "fp8"], ["fp4", "", "int8"]),
        "--seq-len": (["1024", "2048", "4096", "32768"], BAD_INTS),
        "--global-batch": (["16", "512", "1024", "1048576"], BAD_INTS),
    }


@fuzz_settings("solve")
@given(data=st.data())
def test_fuzz_solve(paths, data):
    domains = {**model_cluster(paths), **knobs(),
               "--top": (["1", "5", "10000"], BAD_INTS),
               "--train-tokens": (["1e12", "15e12"], ["0", "-1", "inf", "nan", "1e30", "x", ""]),
               "--pue": (["1.4"], ["0.5", "inf", "nan", "100"]),
               "--gpu-hour-price": (["2"], ["-1", "inf", "nan", "1e30"]),
               "--mtbf-hours": (["6335"], ["0", "inf", "nan"]),
               "--csv": (output_files(paths, "plans.csv"), bad_paths(paths)),
               "--profile": ([], [str(paths / "latin1.yaml"), str(paths / "folder"),
                                  str(paths / "missing.yaml")])}
    args, bad = data.draw(options(domains, ["--json", "--sp", "--no-sp"],
                                  required=("--model", "--cluster")))
    check(["solve", *args], bad)
    check_user_files(paths)


@fuzz_settings("estimate")
@given(data=st.data())
def test_fuzz_estimate(paths, data):
    domains = {**model_cluster(paths), **knobs(),
               "--csv": (output_files(paths, "plan.csv"), bad_paths(paths))}
    args, bad = data.draw(options(domains, ["--json", "--tp-comm-overlap"],
                                  required=("--model", "--cluster", "--tp", "--pp")))
    check(["estimate", *args], bad)
    check_user_files(paths)


@fuzz_settings("validate")
@given(data=st.data())
def test_fuzz_validate_print_only(paths, data):
    dims = {flag: (good, BAD_INTS) for flag, good in (
        ("--layers", ["2", "4"]), ("--hidden", ["64", "128"]), ("--heads", ["2", "4"]),
        ("--kv-heads", ["1", "2"]), ("--ffn", ["128"]), ("--vocab", ["128", "1000"]))}
    domains = {
        "--model": (["llama2-7b", "llama70b", "mixtral"], ["", "m" * 300, "nosuch"]),
        "--out": ([str(paths / "runs-out.jsonl")], [*bad_paths(paths), "-", str(paths / "null")]),
        **{k: v for k, v in knobs().items() if k != "--precision"}, **dims,
        "--steps": (["1", "5"], BAD_INTS), "--warmup": (["0", "2"], ["-1", str(2**63), "x"]),
        "--nproc": (["1", "2"], BAD_INTS), "--nnodes": (["1", "2"], BAD_INTS),
        "--rdzv-endpoint": (["node0:29500", "10.0.0.1:29500", "[fd00::1]:29500", "node0"],
                            ["::::", "", "host:0", "host:99999", "a b:1", "[zz]:1", ":29500"]),
        "--backend": (["gloo", "nccl"], ["", "carrier-pigeon"]),
        "--timeout": (["60", "1.5"], BAD_FLOATS),
        "--seed": (["0", "42"], ["-1", str(2**64), "x"]),
        "--pp-schedule": (["1f1b", "gpipe"], ["", "zero-bubble"]),
    }
    args, bad = data.draw(options(domains, ["--no-check"], required=("--model", "--out")))
    check(["validate", *args, "--print-only"], bad, allowed=(0, 2))


@fuzz_settings("calibrate")
@given(data=st.data())
def test_fuzz_calibrate(paths, data):
    domains = {
        "--runs": ([str(paths / "runs.jsonl"), str(paths / "kept-runs.jsonl")],
                   [str(paths / "binary.jsonl"), str(paths / "number.jsonl"),
                    str(paths / "empty.csv"), str(paths / "folder"), str(paths / "nothing.csv"),
                    str(paths / "latin1.yaml"), ""]),
        "--profile": (["A100", "H100"], ["H1000", "", str(paths / "latin1.yaml"),
                                         str(paths / "folder")]),
        "--out": ([str(paths / "fitted.yaml"), str(paths / "link.csv"), str(paths / "null")],
                  bad_paths(paths)),
        "--fit": (["gemm_scale"], ["nosuch-parameter"]),
        "--plot": ([str(paths / "fit.png"), str(paths / "fit.svg")],
                   [*bad_paths(paths), str(paths / "fit.txt")]),
    }
    args, bad = data.draw(options(domains, ["--no-cv", "--json", "--force"],
                                  required=("--runs", "--profile", "--out")))
    check(["calibrate", *args], bad, allowed=(0, 2))
    check_user_files(paths)


@fuzz_settings("explain")
@given(data=st.data())
def test_fuzz_explain_figures(paths, data):
    domains = {
        "--model": (["llama3-8b", "llama2-7b"], ["", "nosuch-model", str(paths / "folder")]),
        "--cluster": (["8xH100", "16xA100"], ["", "8xA1000"]),
        "--rank": (["1", "2"], BAD_INTS),
        "--figures": ([str(paths / "figs")], ["", str(paths / "plain"),
                                              str(paths / "plain" / "figs"),
                                              "/proc/planner-fuzz-figs", str(paths / ("d" * 300))]),
    }
    args, bad = data.draw(options(domains, ["--json"],
                                  required=("--model", "--cluster", "--rank")))
    check(["explain", *args], bad)
    check_user_files(paths)


@fuzz_settings("lists")
@given(command=st.sampled_from(["models", "clusters"]), json_flag=st.booleans(),
       tail=st.sampled_from([[], ["--bogus"], ["x"], ["--json", "--json"], ["--help"]]))
def test_fuzz_models_and_clusters(command, json_flag, tail):
    bad = tail in (["--bogus"], ["x"])
    check([command, *(["--json"] if json_flag else []), *tail], bad, allowed=(0, 2))


@fuzz_settings("profile")
@given(data=st.data())
def test_fuzz_profile_bad_input(paths, data, monkeypatch_module):
    domains = {
        "--out": ([str(paths / "profile.yaml")], bad_paths(paths)),
        "--nproc": (["2", "4"], ["1", *BAD_INTS]),
        "--nnodes": (["1", "2"], BAD_INTS),
        "--rdzv-endpoint": (["node0:29500"], ["::::", "", "host:0"]),
        "--timeout": (["60"], BAD_FLOATS),
    }
    args, bad = data.draw(options(domains, ["--quick"]))
    assume(bad)  # a good profile run measures this machine for minutes: only bad input here
    check(["profile", *args], bad, allowed=(2,))


@pytest.fixture(scope="module")
def monkeypatch_module():
    """No fuzzed `planner profile` may reach torchrun: launching is a test failure."""
    from planner.validate import launch

    mp = pytest.MonkeyPatch()

    def refuse(*_args, **_kwargs):
        raise AssertionError("planner profile launched torchrun on fuzzed input")

    mp.setattr(launch, "run_torchrun", refuse)
    yield mp
    mp.undo()
