"""Speed of planner.costmodel.estimate_batch: layouts per second, the search's inner loop.

    python benchmarks/costmodel_speed.py            # llama70b on 1024xA100, 50k layouts

Goal (issue 3 / the search's budget): 50,000 layouts well under 0.3 s. The search should pass
its layouts as a mapping of numpy arrays (one per knob); passing Layout objects adds the
conversion (about 4 us per layout).
"""

from __future__ import annotations

import argparse
import itertools
import time

import numpy as np

from planner.costmodel import estimate_batch, layout_violations
from planner.costmodel.batch import layout_arrays
from planner.layout import Layout
from planner.registry import load_model, parse_cluster
from planner.specs import JobSpec


def candidate_layouts(model, cluster, job) -> list[Layout]:
    n = cluster.num_gpus
    out = []
    for tp, pp, cp, vpp, mbs, zero, rc, sp in itertools.product(
        [1, 2, 4, 8], range(1, model.num_hidden_layers + 1), [1, 2], [1, 2, 4, 5], [1, 2, 4, 8],
        [0, 1, 2, 3], ["none", "selective", "full"], [False, True],
    ):
        if (sp and tp == 1) or n % (tp * pp * cp):
            continue
        lo = Layout(tp=tp, pp=pp, dp=n // (tp * pp * cp), cp=cp, vpp=vpp, mbs=mbs, zero=zero,
                    recompute=rc, sp=sp)
        if not layout_violations(model, cluster, job, lo):
            out.append(lo)
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="llama70b")
    parser.add_argument("--cluster", default="1024xA100")
    parser.add_argument("--n", type=int, default=50_000, help="layouts per call")
    parser.add_argument("--repeat", type=int, default=5)
    args = parser.parse_args()
    model, cluster = load_model(args.model), parse_cluster(args.cluster)
    job = JobSpec(seq_len=model.seq_len, global_batch=model.global_batch)
    valid = candidate_layouts(model, cluster, job)
    arrays = layout_arrays(valid)
    reps = -(-args.n // len(valid))
    batch = {k: np.tile(v, reps)[: args.n] for k, v in arrays.items()}
    estimate_batch(model, cluster, job, batch)  # warm the per-model caches
    times, cpu = [], []
    for _ in range(args.repeat):
        t0, c0 = time.perf_counter(), time.process_time()
        estimate_batch(model, cluster, job, batch)
        times.append(time.perf_counter() - t0)
        cpu.append(time.process_time() - c0)
    t0 = time.perf_counter()
    estimate_batch(model, cluster, job, valid)
    t_objects = time.perf_counter() - t0
    best, median = min(times), float(np.median(times))
    print(f"{args.model} on {args.cluster}: {len(valid)} distinct valid layouts")
    print(f"estimate_batch, {args.n} layouts as arrays: best {best:.3f} s, median {median:.3f} s "
          f"({args.n / median:,.0f} layouts/s); CPU time best {min(cpu):.3f} s "
          "(wall time suffers when other processes share the cores)")
    print(f"estimate_batch, {len(valid)} Layout objects: {t_objects:.3f} s")


if __name__ == "__main__":
    main()
