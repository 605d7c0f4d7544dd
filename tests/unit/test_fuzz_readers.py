"""Fuzz every file reader (hypothesis): model specs, HF config.json, GPU profiles, cluster YAMLs,
runs tables (.csv) and validate records (.jsonl), from valid files with one field set to an odd
value (a boolean, a huge or negative number, inf, NaN, text, a list, a mapping), and as raw bytes
(Latin-1, binary, truncated). Pass: the reader returns a spec inside physics or raises the one
SpecError a user sees; never another exception. Scale with PLANNER_FUZZ_EXAMPLES (see
tests/cli/test_fuzz_cli.py)."""

from __future__ import annotations

import json
import math
import os
from datetime import timedelta

import pandas as pd
import pytest
import yaml
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st

from planner import limits
from planner.errors import PlannerError
from planner.layout import KNOBS
from planner.measured.runs import PUBLISHED_RUNS_CSV, load_runs, physics_reason
from planner.registry import builtin_models, load_gpu, load_model, parse_cluster
from planner.specs import GpuProfile, ModelSpec

pytestmark = pytest.mark.slow

TOTAL = int(os.environ.get("PLANNER_FUZZ_EXAMPLES", "3000"))
EXPLORE = "PLANNER_FUZZ_EXAMPLES" in os.environ  # new random examples; else CI's fixed ones
SHARE = {"model": 0.16, "hf": 0.1, "profile": 0.16, "cluster": 0.1, "table": 0.15,
         "records": 0.12}  # with the CLI tests' 0.21: the whole budget


def fuzz_settings(name: str):
    return settings(max_examples=max(10, int(TOTAL * SHARE[name])), deadline=timedelta(minutes=1),
                    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
                    derandomize=not EXPLORE, database=None)


ODD = st.sampled_from([None, True, False, 0, -1, -8, 1, 2.5, 1e30, 10**30, 2**63, float("inf"),
                       float("-inf"), float("nan"), "", "x", "4096", "1e30", [], [1, 2], {},
                       {"a": 1}, 0.5, 1.0, 5.0, 64, 100])


def mutated(base: dict, draw) -> tuple[dict, str, object]:
    """`base` with one key (existing, nested one level, or new) set to an odd value."""
    keys = sorted(base)
    key = draw(st.sampled_from([*keys, "no_such_field"]))
    value = draw(ODD)
    data = json.loads(json.dumps(base))
    if isinstance(data.get(key), dict) and draw(st.booleans()) and data[key]:
        inner = draw(st.sampled_from(sorted(data[key])))
        data[key][inner] = value
        return data, f"{key}.{inner}", value
    if draw(st.integers(0, 9)) == 0:
        data.pop(key, None)
        return data, key, "<deleted>"
    data[key] = value
    return data, key, value


def write(tmp, name: str, data, draw) -> str:
    """Write `data` as YAML or JSON, or as damaged bytes of it."""
    path = tmp / name
    text = json.dumps(data) if name.endswith(".json") else yaml.safe_dump(data)
    damage = draw(st.sampled_from(["none"] * 6 + ["latin1", "truncate", "binary", "nested"]))
    raw = text.encode()
    if damage == "latin1":
        raw = raw[: len(raw) // 2] + b"\xe9" + raw[len(raw) // 2:]
    elif damage == "truncate":
        raw = raw[: draw(st.integers(0, len(raw)))]
    elif damage == "binary":
        raw = bytes(draw(st.lists(st.integers(0, 255), max_size=200)))
    elif damage == "nested":
        raw = (b"[" * 5_000 + b"]" * 5_000) if name.endswith(".json") else (
            b"a: " + b"[" * 5_000 + b"]" * 5_000)
    path.write_bytes(raw)
    event(f"damage {damage}")
    return str(path)


def check_model(spec: ModelSpec) -> None:
    """A spec the planner accepted is physical (independent of the schema's own checks)."""
    counts = {"num_hidden_layers": limits.MAX_LAYERS, "hidden_size": limits.MAX_HIDDEN,
              "num_attention_heads": limits.MAX_HEADS, "intermediate_size": limits.MAX_FFN,
              "vocab_size": limits.MAX_VOCAB, "seq_len": limits.MAX_SEQ_LEN,
              "global_batch": limits.MAX_GLOBAL_BATCH}
    for field, bound in counts.items():
        value = getattr(spec, field)
        assert type(value) is int and 1 <= value <= bound, (field, value)
    assert type(spec.head_size) is int and spec.head_size >= 1
    heads = spec.num_attention_heads
    assert spec.head_dim is not None or spec.head_size * heads == spec.hidden_size
    assert spec.num_attention_heads % spec.kv_heads == 0
    assert 0 < spec.num_params < 1e18


def check_gpu(gpu: GpuProfile) -> None:
    for field in ("peak_bf16_tflops", "peak_fp16_tflops", "memory_gib", "hbm_tb_per_s",
                  "nic_gbit_per_s"):
        value = getattr(gpu, field)
        assert math.isfinite(value) and value > 0, (field, value)
    assert 0 <= gpu.reserve_gib < gpu.memory_gib
    assert 0 < gpu.hbm_efficiency <= 1 and 0 < gpu.attention_efficiency <= 1
    assert all(0 < y <= 1 for _, y in gpu.gemm_efficiency.points)
    for link in (gpu.intra_node, gpu.inter_node):
        assert all(math.isfinite(x) and x > 0 and math.isfinite(y) and y > 0
                   for x, y in link.busbw_gb_per_s.points)
    assert type(gpu.gpus_per_node) is int and 1 <= gpu.gpus_per_node <= limits.MAX_GPUS_PER_NODE


def outcome(read, check) -> None:
    """read() returns something `check` accepts, or raises the user-facing error."""
    try:
        value = read()
    except PlannerError as exc:
        # the CLI prints the message as its one `error:` line: it must be one line (the old
        # `or isinstance(exc, PlannerError)` inside this except made the assertion always true)
        assert str(exc).strip() and "\n" not in str(exc).strip(), str(exc)
        event("refused")
        return
    check(value)
    event("accepted")


@fuzz_settings("model")
@given(data=st.data())
def test_fuzz_model_files(tmp_path_factory, data):
    tmp = tmp_path_factory.mktemp("model")
    name = data.draw(st.sampled_from(sorted(builtin_models())))
    spec, key, value = mutated(builtin_models()[name].model_dump(mode="json"), data.draw)
    path = write(tmp, data.draw(st.sampled_from(["m.yaml", "m.json"])), spec, data.draw)
    outcome(lambda: load_model(path), check_model)


HF_BASE = {"model_type": "llama", "num_hidden_layers": 4, "hidden_size": 256,
           "num_attention_heads": 8, "num_key_value_heads": 4, "intermediate_size": 512,
           "vocab_size": 1000, "max_position_embeddings": 2048, "tie_word_embeddings": False}


@fuzz_settings("hf")
@given(data=st.data())
def test_fuzz_hf_configs(tmp_path_factory, data):
    tmp = tmp_path_factory.mktemp("hf") / "my-model"
    tmp.mkdir()
    model_type = data.draw(st.sampled_from(["llama", "mixtral", "qwen2", "gpt2", "gpt_neox"]))
    base = dict(HF_BASE, model_type=model_type)
    if model_type == "mixtral":
        base.update(num_local_experts=8, num_experts_per_tok=2)
    if model_type == "gpt2":
        base = {"model_type": "gpt2", "n_layer": 4, "n_embd": 256, "n_head": 8,
                "vocab_size": 1000, "n_positions": 1024}
    config, key, value = mutated(base, data.draw)
    path = write(tmp, "config.json", config, data.draw)
    outcome(lambda: load_model(path), check_model)


@fuzz_settings("profile")
@given(data=st.data())
def test_fuzz_gpu_profiles(tmp_path_factory, data):
    tmp = tmp_path_factory.mktemp("profile")
    base = load_gpu(data.draw(st.sampled_from(["A100", "H100", "GB200", "MI300X"])))
    profile, key, value = mutated(base.model_dump(mode="json"), data.draw)
    path = write(tmp, "p.yaml", profile, data.draw)
    outcome(lambda: load_gpu(path), check_gpu)


@fuzz_settings("cluster")
@given(data=st.data())
def test_fuzz_cluster_files(tmp_path_factory, data):
    tmp = tmp_path_factory.mktemp("cluster")
    base = {"gpu": data.draw(st.sampled_from(["H100", "A100-40GB", "GB200"])), "num_nodes": 4,
            "gpus_per_node": 8 if data.draw(st.booleans()) else 4}
    cluster, key, value = mutated(base, data.draw)
    path = write(tmp, "c.yaml", cluster, data.draw)

    def check(c):
        assert type(c.num_nodes) is int and type(c.gpus_per_node) is int
        assert 1 <= c.num_gpus <= limits.MAX_GPUS
        check_gpu(c.gpu)

    outcome(lambda: parse_cluster(path), check)


def check_runs(result) -> None:
    """Every run returned is a fit input inside physics; every skip has a one-line reason."""
    runs, skipped = result
    for skip in skipped:
        assert skip.reason and "\n" not in skip.reason, skip
    for run in runs:
        step = run.measured_step_time_s
        assert run.oom or (step is not None and 0 < step <= limits.MAX_STEP_TIME_S), step
        assert physics_reason(run) is None
        for knob in KNOBS:
            value = run.pins.get(knob)
            if knob in ("tp", "pp", "dp", "cp", "ep", "vpp", "mbs") and value is not None:
                assert type(value) is int and value >= 1, (knob, value)
        if all(k in run.pins for k in ("tp", "pp", "dp", "cp")):
            assert math.prod(run.pins[k] for k in ("tp", "pp", "dp", "cp")) == run.cluster.num_gpus
        assert 1 <= run.cluster.num_gpus <= limits.MAX_GPUS
        check_model(run.model)
    event(f"{len(runs)} usable, {len(skipped)} skipped")


@pytest.fixture(scope="module")
def published_rows():
    frame = pd.read_csv(PUBLISHED_RUNS_CSV)
    return frame.sample(n=40, random_state=0).to_dict("records")


@fuzz_settings("table")
@given(data=st.data())
def test_fuzz_runs_tables(tmp_path_factory, published_rows, data):
    tmp = tmp_path_factory.mktemp("table")
    rows = [dict(r) for r in data.draw(st.lists(st.sampled_from(published_rows), min_size=1,
                                                max_size=4))]
    for _ in range(data.draw(st.integers(1, 3))):
        row = data.draw(st.sampled_from(rows))
        column = data.draw(st.sampled_from(sorted(row)))
        row[column] = data.draw(st.sampled_from(
            ["inf", "-Infinity", "NaN", "{}", "[]", "maybe", "ZeRO-7", "0", "-8", "2.5", "1e30",
             "-3", "", "yes", "true", "mixed (not stated)", 0, -1, 1e30, 2.5, 10**30]))
    path = tmp / "runs.csv"
    if data.draw(st.integers(0, 9)) == 0:
        path.write_bytes(bytes(data.draw(st.lists(st.integers(0, 255), max_size=300))))
    else:
        pd.DataFrame(rows).to_csv(path, index=False)
    outcome(lambda: load_runs(path, load_gpu("A100")), check_runs)


RECORD = {"ok": True, "model": "llama2-7b", "layers": 2, "hidden": 64, "heads": 4, "kv_heads": 4,
          "ffn": 128, "vocab": 128, "tp": 1, "pp": 1, "dp": 2, "cp": 1, "seq_len": 32,
          "global_batch": 4, "nproc_per_node": 2, "measured_step_time_s": 0.05, "zero": 1,
          "recompute": "none", "sp": False, "mbs": 1, "vpp": 1, "ep": 1}


@fuzz_settings("records")
@given(data=st.data())
def test_fuzz_validate_records(tmp_path_factory, data):
    """Records, odd JSON values, and lines that are not JSON (a `# comment`, a record torn at
    any byte, as a writer killed mid-line leaves it): the whole records load, each line that is
    not JSON is skipped with one warning for the file naming its first such line, and a text
    file is never refused for them (issue 20)."""
    import contextlib
    import io

    tmp = tmp_path_factory.mktemp("records")
    lines, not_json = [], []
    for _ in range(data.draw(st.integers(1, 5))):
        kind = data.draw(st.sampled_from(["record", "record", "odd", "torn", "comment"]))
        if kind == "odd":
            lines.append(data.draw(st.sampled_from(["42", "[]", '"x"', "null", "{}", "NaN",
                                                    "true", '{"ok": true}'])))
            continue
        record, key, value = mutated(RECORD, data.draw)
        text = json.dumps(record)
        if kind == "torn":
            text = text[:data.draw(st.integers(1, len(text) - 1))]
        elif kind == "comment":
            text = "# " + data.draw(st.sampled_from(["my runs", "{", "", "ok: true"]))
        lines.append(text)
        if kind != "record":
            not_json.append(len(lines))
    path = tmp / "runs.jsonl"
    if data.draw(st.integers(0, 9)) == 0:
        path.write_bytes(bytes(data.draw(st.lists(st.integers(0, 255), max_size=300))))
        outcome(lambda: load_runs(path, load_gpu("A100")), check_runs)
        return
    path.write_text("\n".join(lines) + data.draw(st.sampled_from(["\n", ""])))
    err = io.StringIO()
    with contextlib.redirect_stderr(err):
        outcome(lambda: load_runs(path, load_gpu("A100")), check_runs)
    warnings = err.getvalue().splitlines()
    bad = [i for i in not_json if _not_json(lines[i - 1])]
    if bad:
        assert len(warnings) == 1 and warnings[0].startswith(f"warning: {path}:{bad[0]}: "), \
            warnings
        event("skipped a line that is not JSON")
    else:
        assert warnings == []


def _not_json(line: str) -> bool:
    """Whether read_jsonl skips the line (a torn record can still be JSON: '{"ok": true}'
    cut after a digit is a number)."""
    if not line.strip():
        return False
    try:
        json.loads(line)
    except ValueError:
        return True
    return False
