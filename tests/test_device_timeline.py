"""scripts/device/timeline/sitecustomize.py (the warm-test timeline probe): run on the CPU against a stand-in deep_ep
package; it must log imports, ElasticBuffer construction and bench_kineto calls, in spawned children too, and change
nothing the program sees."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
PROBE = REPO / "scripts" / "device" / "timeline"

FAKE = {
    "deep_ep/__init__.py": "class ElasticBuffer:\n    def __init__(self, n):\n        self.n = n\n",
    "deep_ep/utils/__init__.py": "",
    "deep_ep/utils/testing.py": "def bench_kineto(fn, *a, **k):\n    return fn(), 'copy'\n",
    "deep_ep/utils/envs.py": "def init_dist(r, n):\n    return r, n, 'group'\n",
}
SCRIPT = """\
import multiprocessing as mp
import deep_ep
from deep_ep.utils.envs import init_dist
from deep_ep.utils.testing import bench_kineto

def child(i):
    import deep_ep
    deep_ep.ElasticBuffer(i)

if __name__ == '__main__':
    print(init_dist(0, 1), deep_ep.ElasticBuffer(7).n, bench_kineto(lambda: 42))
    p = mp.get_context('spawn').Process(target=child, args=(1,))
    p.start(); p.join()
"""


def test_probe_logs_events_and_changes_no_result(tmp_path):
    for rel, text in FAKE.items():
        (tmp_path / "pkgs" / rel).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / "pkgs" / rel).write_text(text)
    (tmp_path / "t.py").write_text(SCRIPT)
    log = tmp_path / "tl.jsonl"
    env = {
        **os.environ,
        "PYTHONPATH": f"{PROBE}{os.pathsep}{tmp_path / 'pkgs'}",
        "TL_LOG": str(log),
        "TL_T0": repr(time.time()),
    }
    p = subprocess.run([sys.executable, "t.py"], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=60)
    assert p.returncode == 0, p.stderr
    assert p.stdout.strip() == "(0, 1, 'group') 7 (42, 'copy')"  # results unchanged
    events = [json.loads(x) for x in log.read_text().splitlines()]
    names = [e["ev"] for e in events]
    for want in (
        "interpreter up",
        "import deep_ep done",
        "init_dist done",
        "ElasticBuffer.__init__ done",
        "bench_kineto done",
        "exit",
    ):
        assert want in names
    assert len({e["pid"] for e in events if e["ev"] == "ElasticBuffer.__init__ done"}) == 2  # parent and child
    assert all(e["t"] >= 0 for e in events)
    # without TL_LOG the probe does nothing
    env.pop("TL_LOG")
    log.unlink()
    p = subprocess.run([sys.executable, "t.py"], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=60)
    assert p.returncode == 0 and not log.exists()
