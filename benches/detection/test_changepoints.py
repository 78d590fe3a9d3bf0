#!/usr/bin/env python3
"""Quick self-check of changepoints.py, for both detectors.

    python benches/detection/test_changepoints.py      # any Python 3
    pytest benches/detection/test_changepoints.py       # also works

It runs changepoints.py with $DETECTION_VENV/bin/python (made by
setup-venv.sh; default ~/.cache/vllm-sentinel-detection-venv), or with
CHANGEPOINTS_PYTHON if set, on:

* a flat noisy series (60 values around 0.020 s, 2 % Gaussian noise):
  regression must be false;
* the same series with a +30 % step 5 values before the end: regression
  must be true and change_index within 1 of the step (index 55).

Exits non-zero on any failure (and when the environment is missing).
"""

import json
import os
import random
import subprocess
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
SCRIPT = os.path.join(HERE, "changepoints.py")
N = 60
STEP_AT = N - 5


def _python():
    if os.environ.get("CHANGEPOINTS_PYTHON"):
        return os.environ["CHANGEPOINTS_PYTHON"]
    venv = os.environ.get("DETECTION_VENV") or os.path.join(
        os.path.expanduser("~"), ".cache", "vllm-sentinel-detection-venv")
    py = os.path.join(venv, "bin", "python")
    if not os.path.exists(py):
        raise RuntimeError(f"{py} missing: run benches/detection/setup-venv.sh first")
    return py


def _series(step):
    rng = random.Random(42)
    vals = [0.020 * (1 + rng.gauss(0, 0.02)) for _ in range(N)]
    if step:
        vals = [v * 1.30 if i >= STEP_AT else v for i, v in enumerate(vals)]
    return vals


def _run(detector):
    req = {"detector": detector, "requests": [
        {"id": "flat", "values": _series(False)},
        {"id": "step", "values": _series(True)},
    ]}
    with tempfile.TemporaryDirectory() as d:
        rp, ap = os.path.join(d, "req.json"), os.path.join(d, "ans.json")
        with open(rp, "w") as f:
            json.dump(req, f)
        subprocess.run([_python(), SCRIPT, rp, ap], check=True)
        with open(ap) as f:
            out = json.load(f)
    return {a["id"]: a for a in out["answers"]}, out


def _check(detector):
    answers, out = _run(detector)
    flat, step = answers["flat"], answers["step"]
    print(f"{detector}: flat={json.dumps(flat)}")
    print(f"{detector}: step={json.dumps(step)}")
    print(f"{detector}: settings={json.dumps(out['settings'])}")
    print(f"{detector}: versions={json.dumps(out['versions'])}")
    problems = []
    if flat["regression"] is not False:
        problems.append("flat series reported a regression")
    if step["regression"] is not True:
        problems.append("+30% step not reported as a regression")
    elif step["change_index"] is None or abs(step["change_index"] - STEP_AT) > 1:
        problems.append(f"change_index {step['change_index']} not within 1 of {STEP_AT}")
    elif not 0.2 < step["relative_change"] < 0.4:
        problems.append(f"relative_change {step['relative_change']} not near 0.30")
    return problems


def test_otava():
    assert _check("otava") == []


def test_edivisive():
    assert _check("edivisive") == []


def main():
    passed = failed = 0
    for detector in ("otava", "edivisive"):
        try:
            problems = _check(detector)
        except Exception as e:  # environment missing, script failed
            problems = [f"{type(e).__name__}: {e}"]
        if problems:
            failed += 1
            for p in problems:
                print(f"FAIL {detector}: {p}")
        else:
            passed += 1
            print(f"ok   {detector}")
    print(f"{passed} passed, {failed} failed")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
