"""Concurrent dashboard sessions on one server process: click → number latency, errors, memory per session.

    python benchmarks/bench_sessions.py [--sessions 1 4 8 16] [--eval-size 500] [--calib-size 128]
                                        [--clicks 6] [--max-length 128] [--json out.json]

Each N runs in a fresh Python process (so one N's memory does not inflate the next) that plays N browser sessions
at once: N Streamlit ``AppTest`` sessions of ``app.py``, each driven by its own thread, sharing the process-wide
model cache and result store exactly as browser tabs share one ``streamlit run`` server
(``concurrent_apptests`` explains the harness patch that needs, undone afterwards). Every session

1. opens the app (the first loads the demo model and data, the others find the workspace in the store),
2. scores the heads on the Head scores page (criterion ``CRITERIA[i % 4]``),
3. opens the Prune page (its live evaluator: one pass over the evaluation rows) and toggles ``--clicks`` heads,
   timing each click from the button press to the new metric on the page,
4. runs a short trajectory of its criterion (12 heads per step to 50 %) on the Trajectories page.

Printed per N: p50 / p95 / max click → number (s), errors shown on any page, server RSS with the workspace loaded
(RSS0) and after the sessions (both after ``malloc_trim``: memory in use), the peak RSS during the run, the RSS
added per session, and the live-evaluation caches of all sessions: distinct tensors (cache MB, forks share the
layers below their change) against what separate per-session caches would hold (unshared). ``--check`` also
replays every session alone afterwards and compares its numbers with the concurrent run (tests/test_sessions.py
does this at N = 4).

Measured 2026-11-22 on the 2-core box shared with three other agents (load average 5-15), demo model, 500
evaluation rows, 128 calibration rows, max length 128, 6 clicks per session, MALLOC_ARENA_MAX=2:

    sessions clicks   p50 s   p95 s   max s errors  RSS0 MB  RSS MB  peak MB MB/session cache MB unshared  wall s
           1      6    0.66    1.25    1.25      0      589    1073     1852        485      207      207    14.7
           4     24    2.94    5.62    6.01      0      580    1645     4054        266      767      829    55.0
           8     48   11.70   25.37   26.68      0      580    2412     4766        229     1514     1659   162.4
          16     96   17.95   40.11   47.58      0      580    3914     6179        208     3007     3317   202.7

Latency grows with N because 2 cores are shared by every session's scoring, trajectories and clicks (the thread
policy in dashboard/compute.py divides them); memory stays under 8 GB at 16 sessions. Every session here clicks
a layer-0 head at some point, which makes its whole cache its own, so sharing saves only ~10% in this workload.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import threading
import time
from contextlib import contextmanager, nullcontext
from dataclasses import asdict, dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

CRITERIA = ("ae", "ad", "gnorm", "his")  # rotated over sessions: sessions with the same criterion share results
LIVE: dict[int, object] = {}  # session index -> its LiveEvaluator after its clicks (for the cache accounting)


@dataclass
class SessionResult:
    index: int
    criterion: str
    clicks: list[tuple[int, int]]
    click_seconds: list[float] = field(default_factory=list)
    numbers: list[str] = field(default_factory=list)       # the metric shown after each click
    trajectory: list[float] = field(default_factory=list)  # the trajectory's metric per step
    errors: list[str] = field(default_factory=list)
    seconds: float = 0.0


def session_clicks(index: int, clicks: int, shape: tuple[int, int] = (6, 12)) -> list[tuple[int, int]]:
    """Heads session ``index`` toggles: distinct per session, spread over the layers (low layers cost most)."""
    n_layers, n_heads = shape
    return [((index + k) % n_layers, (5 * index + 7 * k) % n_heads) for k in range(clicks)]


@contextmanager
def concurrent_apptests():
    """Within the block, AppTest sessions may run in parallel threads of one process, as browser sessions do.

    ``AppTest.run`` installs a fresh mock ``Runtime`` singleton and the ``global.appTest`` option for the length of
    a run and removes both at its end, so a session finishing would pull them from under a session still running.
    Here one shared mock runtime, the option and one script cache are installed for the block and AppTest's
    per-run install/remove is pointed at a stand-in; everything is put back on exit. Nothing of headprune or the
    dashboard is changed.
    """
    from unittest.mock import MagicMock

    import streamlit.testing.v1.app_test as app_test
    from streamlit import config
    from streamlit.runtime import Runtime
    from streamlit.runtime.caching.storage.dummy_cache_storage import MemoryCacheStorageManager
    from streamlit.runtime.dataframe_source_manager import DataframeSourceManager
    from streamlit.runtime.media_file_manager import MediaFileManager
    from streamlit.runtime.memory_media_file_storage import MemoryMediaFileStorage

    shared = MagicMock(spec=Runtime)
    shared.media_file_mgr = MediaFileManager(MemoryMediaFileStorage("/mock/media"))
    shared.cache_storage_manager = MemoryCacheStorageManager()
    shared.dataframe_source_mgr = DataframeSourceManager()

    class RuntimeStandIn:  # what AppTest sets and clears per run; the real singleton stays `shared`
        _instance = None

    # A server compiles each page script once into a shared ScriptCache; AppTest makes a new cache per run, so
    # parallel runs would compile at once, which CPython 3.11's ast module does not survive ("AST constructor
    # recursion depth mismatch"). One cache for all sessions, as in a server.
    script_cache = app_test.ScriptCache()
    saved = (Runtime._instance, app_test.Runtime, app_test.patch_config_options, app_test.ScriptCache,
             config.get_option("global.appTest"))
    Runtime._instance, app_test.Runtime = shared, RuntimeStandIn
    app_test.patch_config_options = lambda options: nullcontext()
    app_test.ScriptCache = lambda: script_cache
    config.set_option("global.appTest", True)
    try:
        yield
    finally:
        Runtime._instance, app_test.Runtime, app_test.patch_config_options, app_test.ScriptCache = saved[:4]
        config.set_option("global.appTest", saved[4])


def _problems(at) -> list[str]:
    return [str(e.value) for e in at.exception] + [str(e.value) for e in at.error]


def _metric(at, label: str) -> str:
    return next(m.value for m in at.metric if m.label == label)


def drive_session(index: int, clicks: int, timeout: float = 900) -> SessionResult:
    """Play one browser session (see the module docstring) and record what it saw.

    A widget the session expected but did not find raises KeyError with the page it was on attached.
    """
    from streamlit.testing.v1 import AppTest

    result = SessionResult(index, CRITERIA[index % len(CRITERIA)], session_clicks(index, clicks))
    at = AppTest.from_file(str(ROOT / "app.py"), default_timeout=timeout)
    try:
        return _drive(at, result)
    except KeyError as exc:
        raise KeyError(f"{exc} missing on the page titled {[t.value for t in at.title]} "
                       f"(problems: {_problems(at)[:2]})") from None


def _drive(at, result: SessionResult) -> SessionResult:
    start = time.perf_counter()
    criterion = result.criterion

    def check(where: str) -> None:
        result.errors += [f"{where}: {p}" for p in _problems(at)]

    at.run()
    check("home")
    at.switch_page("dashboard/pages/2_Head_scores.py").run()
    at.multiselect(key="scores-criteria").set_value([criterion]).run()
    at.button(key="scores-compute").click().run()
    check("scores")
    at.switch_page("dashboard/pages/4_Prune.py").run()
    check("prune (live evaluator)")
    for head in result.clicks:
        at.selectbox(key="prune-head").set_value(head).run()
        began = time.perf_counter()
        at.button(key="prune-toggle").click().run()
        result.click_seconds.append(time.perf_counter() - began)
        check(f"click {head}")
        metric = next((m for m in at.metric if m.label not in ("heads left", "parameters left", "stability")
                       and not m.label.startswith(("dense", "accuracy as"))), None)
        result.numbers.append(metric.value if metric is not None else "?")
    at.switch_page("dashboard/pages/5_Trajectories.py").run()
    at.multiselect(key="traj-criteria").set_value([criterion]).run()
    at.number_input(key="traj-seeds").set_value(0).run()
    at.number_input(key="traj-step").set_value(12).run()
    at.slider(key="traj-budget").set_value(50).run()
    at.button(key="traj-run").click().run()
    check("trajectories")
    sd = at.session_state["hp_session"]
    result.trajectory = [float(v) for t in sd.trajectories for v in t.values()]
    LIVE[result.index] = sd.live
    result.seconds = time.perf_counter() - start
    return result


def run_sessions(n: int, clicks: int, timeout: float = 900) -> list[SessionResult]:
    """``n`` sessions at once, one thread each; results in session order."""
    results: list[SessionResult | None] = [None] * n
    failures: list[str] = []

    def work(i: int) -> None:
        try:
            results[i] = drive_session(i, clicks, timeout)
        except Exception as exc:  # noqa: BLE001 - a crashed session is an error to report, not a crashed benchmark
            failures.append(f"session {i}: {type(exc).__name__}: {exc}")
            results[i] = SessionResult(i, CRITERIA[i % len(CRITERIA)], [], errors=[failures[-1]])

    threads = [threading.Thread(target=work, args=(i,), name=f"session-{i}") for i in range(n)]
    with concurrent_apptests():
        for t in threads:
            t.start()
        for t in threads:
            t.join()
    return results


def warm_up() -> None:
    """Load the demo model and the workspace once, as the server has before any session connects."""
    from dashboard.config import Setup
    from dashboard.store import build_workspace

    build_workspace(Setup())


def rss_mb() -> float:
    import psutil

    return psutil.Process().memory_info().rss / 2**20


def trimmed_rss_mb() -> float:
    """RSS after a garbage collection and glibc's ``malloc_trim``: memory still in use, not freed-but-kept."""
    import ctypes
    import gc

    gc.collect()
    try:
        ctypes.CDLL("libc.so.6").malloc_trim(0)
    except OSError:  # not glibc: RSS as it is
        pass
    return rss_mb()


class PeakSampler(threading.Thread):
    """Highest RSS seen while the sessions run (sampled every ``interval`` seconds)."""

    def __init__(self, interval: float = 0.25):
        super().__init__(daemon=True)
        self.interval, self.peak, self.running = interval, rss_mb(), True

    def run(self) -> None:
        while self.running:
            self.peak = max(self.peak, rss_mb())
            time.sleep(self.interval)


def live_cache_mb(evaluators) -> float:
    """Megabytes of the distinct cached tensors held by ``evaluators`` (a tensor shared by forks counts once)."""
    seen: dict[int, int] = {}
    for live in evaluators:
        for rows in (live._inputs, live._contexts):
            for row in rows:
                for t in row:
                    if t is not None:
                        seen[t.data_ptr()] = t.numel() * t.element_size()
    return sum(seen.values()) / 2**20


def one_n(n: int, clicks: int, check: bool) -> dict:
    """Measure ``n`` concurrent sessions in this process (called in a fresh process per N)."""
    warm_up()
    before = trimmed_rss_mb()
    sampler = PeakSampler()
    sampler.start()
    began = time.perf_counter()
    results = run_sessions(n, clicks)
    wall = time.perf_counter() - began
    sampler.running = False
    after = trimmed_rss_mb()
    sessions_cache = live_cache_mb(LIVE.values())
    unshared_cache = sum(live_cache_mb([live]) for live in LIVE.values())
    seconds = sorted(s for r in results for s in r.click_seconds)
    report = {"sessions": n, "clicks": len(seconds), "wall_s": wall,
              "p50_s": statistics.median(seconds) if seconds else float("nan"),
              "p95_s": seconds[min(len(seconds) - 1, int(round(0.95 * (len(seconds) - 1))))] if seconds else None,
              "max_s": seconds[-1] if seconds else None,
              "errors": [e for r in results for e in r.errors], "rss_before_mb": before, "rss_after_mb": after,
              "rss_peak_mb": max(sampler.peak, after), "rss_per_session_mb": (after - before) / n,
              "live_cache_mb": sessions_cache, "live_cache_unshared_mb": unshared_cache,
              "results": [asdict(r) for r in results]}
    if check:
        solo = [drive_session(r.index, clicks) for r in results]
        report["mismatches"] = [r.index for r, s in zip(results, solo)
                                if (r.numbers, r.trajectory) != (s.numbers, s.trajectory)]
    return report


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--sessions", type=int, nargs="+", default=[1, 4, 8, 16])
    p.add_argument("--eval-size", type=int, default=500)
    p.add_argument("--calib-size", type=int, default=128)
    p.add_argument("--max-length", type=int, default=128)
    p.add_argument("--clicks", type=int, default=6)
    p.add_argument("--check", action="store_true", help="replay every session alone and compare its numbers")
    p.add_argument("--json", help="write every measurement here")
    p.add_argument("--one", type=int, help=argparse.SUPPRESS)  # internal: measure one N in this process
    args = p.parse_args(argv)
    if args.one is not None:
        print(json.dumps(one_n(args.one, args.clicks, args.check)))
        return
    # MALLOC_ARENA_MAX: glibc gives every thread its own arena that keeps freed memory; a server whose sessions
    # are threads should cap them (the recommended setting for `streamlit run` too)
    env = {"MALLOC_ARENA_MAX": "2", **os.environ, "HEADPRUNE_EVAL_SIZE": str(args.eval_size),
           "HEADPRUNE_CALIB_SIZE": str(args.calib_size), "HEADPRUNE_MAX_LENGTH": str(args.max_length)}
    rows = []
    print(f"demo model, {args.eval_size} evaluation rows, {args.calib_size} calibration rows, max length "
          f"{args.max_length}, {args.clicks} clicks per session, {os.cpu_count()} CPUs", flush=True)
    print(f"{'sessions':>8} {'clicks':>6} {'p50 s':>7} {'p95 s':>7} {'max s':>7} {'errors':>6} {'RSS0 MB':>8} "
          f"{'RSS MB':>7} {'peak MB':>8} {'MB/session':>10} {'cache MB':>8} {'unshared':>8} {'wall s':>7}"
          + ("  mismatches" if args.check else ""), flush=True)
    for n in args.sessions:
        cmd = [sys.executable, __file__, "--one", str(n), "--clicks", str(args.clicks)] + (["--check"] * args.check)
        done = subprocess.run(cmd, env=env, capture_output=True, text=True)
        if done.returncode != 0:
            print(f"{n:>8} failed: {done.stderr[-2000:]}", flush=True)
            continue
        row = json.loads(done.stdout.strip().splitlines()[-1])
        rows.append(row)
        print(f"{n:>8} {row['clicks']:>6} {row['p50_s']:>7.2f} {row['p95_s']:>7.2f} {row['max_s']:>7.2f} "
              f"{len(row['errors']):>6} {row['rss_before_mb']:>8.0f} {row['rss_after_mb']:>7.0f} "
              f"{row['rss_peak_mb']:>8.0f} {row['rss_per_session_mb']:>10.0f} {row['live_cache_mb']:>8.0f} "
              f"{row['live_cache_unshared_mb']:>8.0f} {row['wall_s']:>7.1f}"
              + (f"  {row.get('mismatches')}" if args.check else ""), flush=True)
        for error in row["errors"][:5]:
            print(f"         error: {error[:300]}", flush=True)
    if args.json:
        Path(args.json).write_text(json.dumps(rows, indent=1), encoding="utf-8")


if __name__ == "__main__":
    main()
