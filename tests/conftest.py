"""Suite-wide: reprostack.ui's state (verbosity, timings file) starts fresh in every test, and its step
durations go to the test's own folder, never to the user's ~/.cache/reprostack; the kernels' stable views
(kernels.runtime.stable_view) go to the test's own folder too, never to the machine's shared one."""

import re

import pytest

from reprostack import ui


@pytest.fixture(autouse=True)
def _ui_isolated(tmp_path_factory):
    ui.reset()
    ui.configure(cache=tmp_path_factory.mktemp("ui-cache"))
    yield
    ui.reset()


@pytest.fixture(autouse=True)
def _kernel_views_isolated(tmp_path_factory, monkeypatch):
    from reprostack.kernels import runtime

    view = tmp_path_factory.mktemp("kernel-views")
    view.chmod(0o700)
    monkeypatch.setenv(runtime.VIEW_ENV, str(view))


# reprostack.ui's plain progress lines on stderr: a step's start (`NAME: started, ETA ... (last run)` or `..., first
# run, no estimate`) and its end (`NAME: ok in 1.2 s`, `NAME: failed after 0.1 s`, `NAME: SKIP in 3 s`)
STEP_LINE = re.compile(
    r"^\S[^:]*: (started, (ETA .+ \(last run\)|first run, no estimate)|.+ (in|after) [\d.]+ (s|min)\b)"
)


def without_progress(err: str) -> str:
    """stderr without reprostack.ui's progress lines (what is left: warnings, errors)."""
    return "".join(ln for ln in err.splitlines(True) if not STEP_LINE.match(ln))


# tests/progress.py: a line of progress for long files (issue 29 item 11); tests/tiers.py: each test's tier (unit,
# integration with docker / slurm / git, e2e), derived from what it touches; a unit test that starts a process fails;
# tests/schedule.py: under pytest-xdist the longest files (by the newest suite timing record) start first
pytest_plugins = ["progress", "tiers", "schedule"]
