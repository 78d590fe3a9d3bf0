#!/usr/bin/env python3
"""Apache Otava and MongoDB E-Divisive as online regression detectors.

Usage::

    python changepoints.py REQUEST.json ANSWER.json

Request::

    {"detector": "otava" | "edivisive",
     "requests": [{"id": "...", "values": [float, ...], "recent": 10?}, ...]}

Each request is the history of ONE metric of one series up to an evaluation
point, oldest first. The question answered for it: "at this evaluation, does
the detector report a regression (an increase) whose change point lies among
the most recent values?"

Answer::

    {"answers": [{"id": ..., "regression": bool, "change_index": int|null,
                  "relative_change": float|null, "change_points": [int, ...]}],
     "settings": {...exact parameters used...},
     "versions": {...library versions...},
     "timing": {"requests": N, "seconds": S, "requests_per_second": R, "workers": W}}

The rule
--------
1. The library's own change-point analysis runs on the whole ``values`` list
   (``null`` values, e.g. NaN serialized by serde_json, are filled the way
   Otava's ``otava.analysis.fill_missing`` does: forward-fill, then
   back-fill the leading ones), with the library's default settings:

   * ``otava``: ``otava.series.Series(...).analyze()`` with no options, i.e.
     ``AnalysisOptions()`` (otava/series.py, ``AnalysisOptions.__init__``:
     ``window_len=50, max_pvalue=0.001, min_magnitude=0.0,
     orig_edivisive=False``; the same values are the ``otava analyze`` CLI
     defaults in otava/main.py ``setup_analysis_options_parser``). That is
     what the ``otava analyze`` command does for each metric:
     ``AnalyzedSeries.__compute_change_points`` -> ``fill_missing`` ->
     ``otava.analysis.compute_change_points(values, window_len=50,
     max_pvalue=0.001, min_magnitude=0.0)``: the windowed split step
     (sliding windows of 50, step 25, each window's E-Divisive with a
     two-sided Student t-test at the relaxed first-pass threshold
     10 * 0.001 = 0.01) followed by the merge step (weak change points
     dropped until every remaining one has p < 0.001 and magnitude > 0.0).
     Deterministic; no random numbers.
   * ``edivisive``: ``signal_processing_algorithms.energy_statistics.
     energy_statistics.e_divisive(values)`` with its defaults
     ``pvalue=0.05, permutations=100`` (the signature's defaults, the same as
     MongoDB's pre-2.0 ``e_divisive.default.default_implementation()``:
     ``QHatPermutationsSignificanceTester(pvalue=0.05, permutations=100)``,
     ``EDivisive(seed=1234)``), run inside the library's own
     ``signal_processing_algorithms.determinism.deterministic_numpy_random(1234)``
     so that every request is reproducible and independent of the order and
     of the number of worker processes.

2. The LAST change point found (the highest index, the most recent one) is
   taken. ``change_index`` is its index in ``values`` (the first value of
   the new regime, the convention of both libraries). The mean before it
   is the mean of ``values[previous change point or 0 : change_index]`` and
   the mean after it the mean of ``values[change_index:]``;
   ``relative_change = mean_after / mean_before - 1`` (the formula of Otava's
   ``TTestStats.forward_rel_change``). The means are recomputed from the final
   change points for both detectors rather than read from Otava's
   ``TTestStats``: Otava 0.8.0's ``merge()`` (otava/analysis.py), after
   deleting a weak change point at position i, recomputes positions i and
   i+1 instead of i-1 and i, so the stats of the change point left of a
   deleted one stay computed against the deleted one (e.g. ``mean_2`` over a
   single value). Which change points Otava reports is left exactly as the
   library decides, bug included.

3. ``regression = true`` iff that change point exists, lies within the last
   ``recent`` values (``change_index >= len(values) - recent``; ``recent``
   defaults to 10 and can be set per request) and the mean after it is
   greater than the mean before it (an increase: values are latencies).

``change_index`` and ``relative_change`` describe the last change point
whether or not it counts as a regression; they are ``null`` only when the
library found no change point at all. ``change_points`` lists every change
point the library reported, sorted.

Interpreters
------------
The two libraries cannot share one environment (apache-otava 0.8.0 pins
``numpy==2.2.0.*``, signal-processing-algorithms 2.1.6 requires
``numpy<2``), so ``setup-venv.sh`` makes two: ``$DETECTION_VENV`` (Otava)
and ``$DETECTION_VENV/edivisive`` (E-Divisive). Run this script with either
``$DETECTION_VENV/bin/python``; when the requested library is not importable
in the running interpreter it re-executes itself with the other one.

Speed
-----
Requests are spread over one worker process per CPU this process may run on
(``os.sched_getaffinity``; so ``taskset -c 1`` means one worker), or
``CHANGEPOINTS_WORKERS`` if set. Progress goes to stderr every 1000
requests, and the throughput at the end, both per wall-clock second and per
CPU second (on a shared machine the latter is the detector's own speed).
"""

import json
import math
import os
import sys
import time

RECENT_DEFAULT = 10
EDIVISIVE_SEED = 1234  # MongoDB's seed: EDivisive(seed=1234) in default_implementation()
DEFAULT_VENV = os.path.join(os.path.expanduser("~"), ".cache", "vllm-sentinel-detection-venv")
PROGRESS_EVERY = 1000

# Set per worker by _load().
_DETECTOR = None
_FIND = None


# --------------------------------------------------------------------------
# Interpreter selection
# --------------------------------------------------------------------------

def _importable(detector):
    try:
        if detector == "otava":
            import otava.series  # noqa: F401
        else:
            import signal_processing_algorithms.energy_statistics.energy_statistics  # noqa: F401
        return True
    except ImportError:
        return False


def _candidate_pythons(detector):
    roots = []
    if os.environ.get("DETECTION_VENV"):
        roots.append(os.environ["DETECTION_VENV"])
    roots.append(sys.prefix)
    roots.append(os.path.dirname(sys.prefix.rstrip("/")))  # we may be in $DETECTION_VENV/edivisive
    roots.append(DEFAULT_VENV)
    seen = set()
    for root in roots:
        rel = ("bin", "python") if detector == "otava" else ("edivisive", "bin", "python")
        py = os.path.join(root, *rel)
        if py in seen:
            continue
        seen.add(py)
        if os.path.exists(py):
            yield py


def _ensure_interpreter(detector):
    """Re-executes this script under the venv that has the detector's library."""
    if _importable(detector):
        return
    if os.environ.get("_CHANGEPOINTS_REEXEC") == detector:
        sys.exit(f"changepoints.py: {detector}: library not importable in {sys.executable} "
                 "either; run benches/detection/setup-venv.sh")
    here = os.path.abspath(sys.executable)
    for py in _candidate_pythons(detector):
        if os.path.abspath(py) == here:  # (venv pythons are symlinks: compare unresolved)
            continue
        env = dict(os.environ, _CHANGEPOINTS_REEXEC=detector)
        print(f"changepoints.py: {detector} runs under {py}", file=sys.stderr)
        os.execve(py, [py, os.path.abspath(__file__)] + sys.argv[1:], env)
    sys.exit(f"changepoints.py: no Python with the {detector} library found "
             f"(looked in $DETECTION_VENV, {sys.prefix}, {DEFAULT_VENV}); "
             "run benches/detection/setup-venv.sh")


# --------------------------------------------------------------------------
# Detectors
# --------------------------------------------------------------------------

def _fill_missing(values):
    """Otava's fill_missing (otava/analysis.py): forward-fill, then back-fill."""
    data = [None if (v is None or (isinstance(v, float) and math.isnan(v))) else float(v)
            for v in values]
    prev = None
    for i in range(len(data)):
        if data[i] is None and prev is not None:
            data[i] = prev
        prev = data[i]
    prev = None
    for i in reversed(range(len(data))):
        if data[i] is None and prev is not None:
            data[i] = prev
        prev = data[i]
    return data


def _otava_find(values):
    """[(index, mean_before, mean_after)] of the change points Otava reports."""
    from otava.series import Metric, Series

    n = len(values)
    # A plain list, as the importers build it: ChangePointDetector.get_change_points
    # slices series[start:end] only when it is not already an ndarray.
    series = Series(
        test_name="probe",
        branch=None,
        time=list(range(n)),
        metrics={"value": Metric()},
        data={"value": list(values)},
        attributes={},
    )
    analyzed = series.analyze()  # AnalysisOptions() defaults, as `otava analyze`
    return _segment_means(values, [c.index for c in analyzed.change_points["value"]])


def _edivisive_find(values):
    from signal_processing_algorithms.determinism import deterministic_numpy_random
    from signal_processing_algorithms.energy_statistics.energy_statistics import e_divisive

    with deterministic_numpy_random(EDIVISIVE_SEED):
        found = e_divisive(values)  # defaults: pvalue=0.05, permutations=100
    return _segment_means(values, found)


def _segment_means(values, indices):
    """[(index, mean_before, mean_after)] for sorted change points, each mean over
    the segment between it and its neighbouring change points (or the ends)."""
    import numpy as np

    idx = sorted(int(i) for i in indices)
    arr = np.asarray(values, dtype=np.float64)
    bounds = [0] + idx + [len(values)]
    return [(cp, float(arr[bounds[k]:cp].mean()), float(arr[cp:bounds[k + 2]].mean()))
            for k, cp in enumerate(idx)]


def _load(detector):
    global _DETECTOR, _FIND
    _DETECTOR = detector
    _FIND = _otava_find if detector == "otava" else _edivisive_find


def _answer(req):
    rid = req.get("id")
    values = req.get("values") or []
    recent = req.get("recent")
    recent = RECENT_DEFAULT if recent is None else int(recent)
    data = _fill_missing(values)
    if len(data) < 2 or data[0] is None:
        found = []
    else:
        found = _FIND(data)
    if not found:
        return {"id": rid, "regression": False, "change_index": None,
                "relative_change": None, "change_points": []}
    index, before, after = found[-1]
    rel = after / before - 1.0 if before != 0 else None
    regression = index >= len(data) - recent and after > before
    return {"id": rid, "regression": bool(regression), "change_index": index,
            "relative_change": rel, "change_points": [c[0] for c in found]}


# --------------------------------------------------------------------------
# Settings and versions, read from the libraries at run time
# --------------------------------------------------------------------------

def _settings(detector):
    import inspect

    common = {
        "detector": detector,
        "recent_default": RECENT_DEFAULT,
        "rule": "regression iff the last (highest-index) change point c satisfies "
                "c >= len(values) - recent and mean(values[prev_cp:c]) < mean(values[c:]); "
                "relative_change = mean_after / mean_before - 1; nulls forward/back-filled",
    }
    if detector == "otava":
        from otava import analysis
        from otava.series import AnalysisOptions

        opts = AnalysisOptions().to_json()
        sig = inspect.signature(analysis.compute_change_points)
        common.update({
            "call": "otava.series.Series(...).analyze() -> AnalyzedSeries -> "
                    "otava.analysis.compute_change_points(values, window_len, max_pvalue, "
                    "min_magnitude)",
            "analysis_options": opts,
            "first_pass_pvalue": (opts["max_pvalue"] * 10 if opts["max_pvalue"] < 0.05 else None),
            "compute_change_points_signature_defaults": {
                k: v.default for k, v in sig.parameters.items()
                if v.default is not inspect.Parameter.empty and k in
                ("window_len", "max_pvalue", "min_magnitude")},
            "significance_test": "TTestSignificanceTester (scipy ttest_ind_from_stats, two-sided)",
            "random_seed": None,
        })
    else:
        from signal_processing_algorithms.energy_statistics import energy_statistics as es

        sig = inspect.signature(es.e_divisive)
        common.update({
            "call": "signal_processing_algorithms.energy_statistics.energy_statistics."
                    "e_divisive(values) inside signal_processing_algorithms.determinism."
                    "deterministic_numpy_random(seed)",
            "pvalue": sig.parameters["pvalue"].default,
            "permutations": sig.parameters["permutations"].default,
            "random_seed": EDIVISIVE_SEED,
            "seeded": "per request",
            "c_extension_loaded": bool(es.C_EXTENSION_LOADED),
        })
    return common


def _versions(detector):
    from importlib import metadata

    pkgs = ["numpy", "scipy"]
    pkgs.insert(0, "apache-otava" if detector == "otava" else "signal-processing-algorithms")
    out = {"python": sys.version.split()[0], "executable": sys.executable}
    for p in pkgs:
        try:
            out[p] = metadata.version(p)
        except metadata.PackageNotFoundError:
            out[p] = None
    return out


# --------------------------------------------------------------------------
# Main
# --------------------------------------------------------------------------

def _cpu_seconds():
    """User + system CPU time of this process and of its reaped worker processes."""
    import resource

    s = resource.getrusage(resource.RUSAGE_SELF)
    c = resource.getrusage(resource.RUSAGE_CHILDREN)
    return s.ru_utime + s.ru_stime + c.ru_utime + c.ru_stime


def _workers():
    env = os.environ.get("CHANGEPOINTS_WORKERS")
    if env:
        return max(1, int(env))
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except AttributeError:
        return max(1, os.cpu_count() or 1)


def main(argv):
    if len(argv) != 3:
        sys.exit("usage: changepoints.py REQUEST.json ANSWER.json")
    with open(argv[1]) as f:
        request = json.load(f)
    detector = request.get("detector")
    if detector not in ("otava", "edivisive"):
        sys.exit(f"changepoints.py: unknown detector {detector!r} (otava | edivisive)")
    _ensure_interpreter(detector)
    reqs = request.get("requests") or []
    _load(detector)
    settings = _settings(detector)
    versions = _versions(detector)

    workers = min(_workers(), max(1, len(reqs) // 50))
    started = time.perf_counter()
    cpu_started = _cpu_seconds()
    answers = []

    def progress(done):
        if done % PROGRESS_EVERY == 0:
            el = time.perf_counter() - started
            print(f"changepoints.py {detector}: {done}/{len(reqs)} "
                  f"({done / el:.1f} req/s)", file=sys.stderr, flush=True)

    if workers <= 1:
        for r in reqs:
            answers.append(_answer(r))
            progress(len(answers))
    else:
        import multiprocessing as mp

        ctx = mp.get_context("fork")
        chunk = max(1, min(64, len(reqs) // (workers * 8) or 1))
        with ctx.Pool(workers, initializer=_load, initargs=(detector,)) as pool:
            for a in pool.imap(_answer, reqs, chunksize=chunk):
                answers.append(a)
                progress(len(answers))
    elapsed = time.perf_counter() - started
    cpu = _cpu_seconds() - cpu_started
    rate = len(reqs) / elapsed if elapsed > 0 else float("inf")
    cpu_rate = len(reqs) / cpu if cpu > 0 else float("inf")
    lengths = [len(r.get("values") or []) for r in reqs]
    timing = {
        "requests": len(reqs),
        "seconds": round(elapsed, 3),
        "requests_per_second": round(rate, 2),
        "cpu_seconds": round(cpu, 3),
        "requests_per_cpu_second": round(cpu_rate, 2),
        "workers": workers,
        "mean_values_per_request": (sum(lengths) / len(lengths)) if lengths else 0,
    }
    with open(argv[2], "w") as f:
        json.dump({"answers": answers, "settings": settings, "versions": versions,
                   "timing": timing}, f)
    flagged = sum(1 for a in answers if a["regression"])
    print(f"changepoints.py {detector}: {len(reqs)} requests in {elapsed:.2f} s = "
          f"{rate:.1f} requests/s wall-clock; {cpu:.2f} CPU s = {cpu_rate:.1f} requests "
          f"per CPU second ({workers} worker(s), "
          f"{timing['mean_values_per_request']:.1f} values/request), "
          f"{flagged} regression(s)", file=sys.stderr)


if __name__ == "__main__":
    main(sys.argv)
