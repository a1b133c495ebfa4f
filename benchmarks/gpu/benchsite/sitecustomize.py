"""Benchmark-harness process settings (issue 10), loaded by every Python process that
benchmarks/gpu/run_bench.py starts (it puts this folder first on PYTHONPATH). The generated
launchers and train.py stay unmodified; this only sets host-side process state and records
per-rank memory. Each part is switched on by an environment variable:

MOCOMPILE_BENCH_RANKSTATS=DIR  every torchrun worker writes DIR/rank<RANK>.json (every 2 s and at
                               exit): torch.cuda.max_memory_allocated/reserved of its GPU, so the
                               harness sees every rank, not only rank 0 (pipeline stages differ).
MOCOMPILE_BENCH_GC=off         gc.disable() at start (what Bridge's manual_gc does between its
                               collections; perf recipes enable it): no collector pauses inside steps.
MOCOMPILE_BENCH_AFFINITY=1     pin worker LOCAL_RANK to its own contiguous share of the CPUs
                               (no two ranks' host threads share a core).
MOCOMPILE_BENCH_GCPROBE=DIR    time one full gc.collect() (what Bridge's maybe_run_manual_gc runs every
                               manual_gc_interval iterations) inside the training loop at the iterations of
                               MOCOMPILE_BENCH_GCPROBE_ITERS (default "10 15"), with the tracked-object count, and
                               write DIR/gc-rank<RANK>.json: the cost a short manual_gc_interval adds to a step.
"""

import os as _os

_rank = _os.environ.get("RANK")
_local = _os.environ.get("LOCAL_RANK")

if _rank is not None and _local is not None:  # a torchrun worker (not the torchrun parent)
    if _os.environ.get("MOCOMPILE_BENCH_GC", "") == "off":
        import gc as _gc

        _gc.disable()

    if _os.environ.get("MOCOMPILE_BENCH_AFFINITY", "") == "1":
        try:
            _cpus = sorted(_os.sched_getaffinity(0))
            _n = int(_os.environ.get("LOCAL_WORLD_SIZE", "1"))
            _share = max(1, len(_cpus) // max(1, _n))
            _mine = _cpus[int(_local) * _share:(int(_local) + 1) * _share] or _cpus
            _os.sched_setaffinity(0, _mine)
        except (OSError, ValueError, AttributeError):
            pass

    _stats_dir = _os.environ.get("MOCOMPILE_BENCH_RANKSTATS")
    if _stats_dir:
        import atexit as _atexit
        import json as _json
        import sys as _sys
        import threading as _threading
        import time as _time

        _path = _os.path.join(_stats_dir, f"rank{_rank}.json")
        _best = {"rank": int(_rank), "local_rank": int(_local), "max_memory_allocated": 0,
                 "max_memory_reserved": 0, "samples": 0}

        def _sample() -> None:
            torch = _sys.modules.get("torch")
            if torch is None:
                return
            try:
                if not torch.cuda.is_initialized():
                    return
                dev = int(_local)
                _best["max_memory_allocated"] = max(_best["max_memory_allocated"],
                                                    int(torch.cuda.max_memory_allocated(dev)))
                _best["max_memory_reserved"] = max(_best["max_memory_reserved"],
                                                   int(torch.cuda.max_memory_reserved(dev)))
                _best["samples"] += 1
                _best["time"] = _time.time()
                tmp = _path + ".tmp"
                with open(tmp, "w", encoding="utf-8") as fh:
                    _json.dump(_best, fh)
                _os.replace(tmp, _path)
            except Exception:  # noqa: BLE001 - never disturb the job
                pass

        def _loop() -> None:
            while True:
                _time.sleep(2.0)
                _sample()

        _os.makedirs(_stats_dir, exist_ok=True)
        _threading.Thread(target=_loop, name="mocompile-rankstats", daemon=True).start()
        _atexit.register(_sample)

    _gc_dir = _os.environ.get("MOCOMPILE_BENCH_GCPROBE")
    if _gc_dir:
        import gc as _gcp
        import json as _gjson
        import sys as _gsys
        import threading as _gthreading
        import time as _gtime

        _gc_iters = {int(x) for x in _os.environ.get("MOCOMPILE_BENCH_GCPROBE_ITERS", "10 15").split()}
        _gc_path = _os.path.join(_gc_dir, f"gc-rank{_rank}.json")
        _gc_rows: list = []

        def _gc_probe(manual_gc_enabled, manual_gc_interval, iteration, _orig=None):  # noqa: ANN001
            if iteration in _gc_iters:
                try:
                    before = _gcp.get_count()
                    t = _gtime.perf_counter()
                    found = _gcp.collect()
                    dt = _gtime.perf_counter() - t
                    _gc_rows.append({"iteration": int(iteration), "collect_s": dt, "unreachable": found,
                                     "tracked_objects": len(_gcp.get_objects()), "counts_before": list(before),
                                     "gc_enabled": _gcp.isenabled()})
                    _gc_write()
                except Exception:  # noqa: BLE001 - never disturb the job
                    pass
            return _orig(manual_gc_enabled, manual_gc_interval, iteration)

        def _gc_write() -> None:
            import platform
            cpu = ""
            try:
                with open("/proc/cpuinfo", encoding="utf-8") as fh:
                    cpu = next((ln.split(":", 1)[1].strip() for ln in fh if ln.startswith("model name")), "")
            except OSError:
                pass
            doc = {"rank": int(_rank), "python": platform.python_version(), "cpu": cpu, "probes": _gc_rows}
            _os.makedirs(_gc_dir, exist_ok=True)
            with open(_gc_path + ".tmp", "w", encoding="utf-8") as fh:
                _gjson.dump(doc, fh)
            _os.replace(_gc_path + ".tmp", _gc_path)

        def _gc_patch() -> None:
            # Bridge's train loop calls the module-level maybe_run_manual_gc each iteration (training/train.py):
            # replace it once the module is imported, so the probe runs where a manual collection would
            for _ in range(6000):
                mod = _gsys.modules.get("megatron.bridge.training.train")
                orig = getattr(mod, "maybe_run_manual_gc", None) if mod is not None else None
                if orig is not None:
                    def wrapped(a, b, c, _o=orig):  # noqa: ANN001
                        return _gc_probe(a, b, c, _orig=_o)
                    mod.maybe_run_manual_gc = wrapped
                    return
                _gtime.sleep(0.05)

        _gthreading.Thread(target=_gc_patch, name="mocompile-gcprobe", daemon=True).start()
