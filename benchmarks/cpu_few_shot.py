"""Few-shot calibration on the recorded CPU runs (validate/measured/runs-cpu.jsonl: ten layouts
of a Llama-shaped h512 model on two gloo processes): calibrate on four runs, one per mechanism
(dp2 ZeRO-0, dp2 ZeRO-3, pp2, tp2), predict the other six with the 1-sigma band, and compare with
fitting every knob on the same four runs (planner.calibrate.calibrate).

    python benchmarks/cpu_few_shot.py
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from planner.calibrate import calibrate, few_shot_fit, predict_step_times
from planner.measured.runs import load_records
from planner.registry import load_gpu

ROOT = Path(__file__).resolve().parent.parent
CALIBRATE_ON = (0, 3, 6, 8)  # dp2 z0, dp2 z3, pp2, tp2


def main() -> None:
    gpu = load_gpu(str(ROOT / "validate/measured/cpu-gloo-2proc.yaml"))
    runs, _ = load_records(ROOT / "validate/measured/runs-cpu.jsonl", gpu)
    layouts = [r.layout for r in runs]
    cal = [i for i in CALIBRATE_ON if i < len(runs)]
    tgt = [i for i in range(len(runs)) if i not in cal]
    fit = few_shot_fit(gpu, [runs[i] for i in cal], layouts=[layouts[i] for i in cal],
                       cross_validate=False)
    print("few-shot fitted:", {k: round(fit.values[k], 4) for k in fit.fitted})
    for name, why in fit.kept.items():
        print(f"  kept {name}: {why}")
    truns, tlays = [runs[i] for i in tgt], [layouts[i] for i in tgt]
    meas = np.array([r.measured_step_time_s for r in truns])
    pred, sigma = fit.band(truns, tlays)
    every = calibrate(gpu, [runs[i] for i in cal], layouts=[layouts[i] for i in cal],
                      cross_validate=False)
    pred_all = predict_step_times(every.profile, truns, tlays)
    print(f"{'layout':32} {'measured s':>10} {'few-shot':>9} {'band':>6} {'inside':>6} "
          f"{'all knobs':>9}")
    for lay, m, p, s, q in zip(tlays, meas, pred, sigma, pred_all, strict=True):
        print(f"{lay!s:32} {m:10.3f} {p / m - 1:+9.1%} {s:6.1%} "
              f"{str(abs(np.log(m / p)) <= s):>6} {q / m - 1:+9.1%}")
    print(f"median |error|: few-shot {np.median(np.abs(pred / meas - 1)):.1%} "
          f"({len(fit.fitted)} knobs), all knobs {np.median(np.abs(pred_all / meas - 1)):.1%} "
          f"({len(every.fitted)} knobs, in-sample "
          f"{np.median(np.abs(every.err_after)):.1%})")


if __name__ == "__main__":
    main()
