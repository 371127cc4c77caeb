"""Timeline probe for DeepEP's test_ep.py (scripts/device/warm_timeline.py puts this folder first on PYTHONPATH).

Writes one JSON line per event to $TL_LOG: seconds since $TL_T0 (the launcher's clock, so interpreter start-up shows),
pid and event. Events: interpreter up (after site), import start/done of torch, torch.distributed, deep_ep and
deep_ep._C, init_dist, ElasticBuffer construction, every bench_kineto call (its duration), process exit.
Measures only: every wrapped function is called with the same arguments and its result returned unchanged.
Without $TL_LOG it does nothing. Diagnostic, not part of any gate.
"""

import atexit
import functools
import json
import os
import sys
import time

_LOG = os.environ.get("TL_LOG")
_T0 = float(os.environ.get("TL_T0") or time.time())


def ev(name, **kw):
    with open(_LOG, "a") as f:
        f.write(json.dumps({"t": round(time.time() - _T0, 3), "pid": os.getpid(), "ev": name, **kw}) + "\n")


def _timed(fn, label):
    @functools.wraps(fn)
    def w(*a, **k):
        t = time.time()
        ev(f"{label} start")
        try:
            return fn(*a, **k)
        finally:
            ev(f"{label} done", s=round(time.time() - t, 3))

    return w


def _after(name, module):
    if name == "deep_ep.utils.testing" and hasattr(module, "bench_kineto"):
        module.bench_kineto = _timed(module.bench_kineto, "bench_kineto")
    elif name == "deep_ep.utils.envs" and hasattr(module, "init_dist"):
        module.init_dist = _timed(module.init_dist, "init_dist")
    elif name == "deep_ep" and hasattr(module, "ElasticBuffer"):
        cls = module.ElasticBuffer
        cls.__init__ = _timed(cls.__init__, "ElasticBuffer.__init__")


_WATCH = {"torch", "torch.distributed", "deep_ep", "deep_ep._C", "deep_ep.utils.testing", "deep_ep.utils.envs"}


class _Finder:
    def find_spec(self, name, path=None, target=None):
        if name not in _WATCH:
            return None
        for f in sys.meta_path:
            if f is self or not hasattr(f, "find_spec"):
                continue
            spec = f.find_spec(name, path, target)
            if spec is not None:
                break
        else:
            return None
        loader = spec.loader
        if loader is None or not hasattr(loader, "exec_module"):
            return spec
        orig = loader.exec_module

        def exec_module(module, _orig=orig, _name=name):
            t = time.time()
            ev(f"import {_name} start")
            _orig(module)
            ev(f"import {_name} done", s=round(time.time() - t, 3))
            _after(_name, module)

        try:
            loader.exec_module = exec_module  # per-spec loader instances (SourceFileLoader, ExtensionFileLoader)
        except AttributeError:
            return spec
        return spec


if _LOG:
    ev("interpreter up", argv=sys.argv[:3])
    sys.meta_path.insert(0, _Finder())
    atexit.register(lambda: ev("exit"))
