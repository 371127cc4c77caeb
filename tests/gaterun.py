"""Tests' way to run one gate in host mode through the Gate protocol: its options (gates.options.GateOptions) and
its context (gates.base.RunContext) kept together, as the CLI's `gate G --no-container` makes them."""

from __future__ import annotations

from dataclasses import dataclass, replace
from pathlib import Path

from reprostack.gates import registry
from reprostack.gates.base import RunContext
from reprostack.gates.options import GateOptions


@dataclass(frozen=True)
class GateRun:
    gate: str
    opts: GateOptions
    ctx: RunContext

    def with_(self, **kw) -> "GateRun":
        return replace(self, opts=self.opts.with_(**kw))

    lock = property(lambda self: self.ctx.lock)
    root = property(lambda self: self.ctx.root)
    fetch = property(lambda self: self.ctx.fetch)
    out_dir = property(lambda self: self.opts.out)


def options(
    gate: str = "micro", *, root, lock, fetch=None, out_dir=None, tmp=None, prebuilt=None, timeout_s=None, **kw
) -> GateRun:
    """A run of gate `gate` on the project at `root` (prebuilt: the image's kernels manifest; timeout_s: --timeout;
    tmp: a test's folder, giving the source cache `tmp/cache` and the out folder `tmp/out` unless named)."""
    if tmp is not None:
        from reprostack import sources
        from reprostack.fetch import Cache

        fetch = fetch or sources.FetchOptions(cache=Cache(Path(tmp) / "cache"))
        out_dir = out_dir or Path(tmp) / "out"
    if prebuilt is not None:
        kw["kernels_manifest"] = str(prebuilt)
    if timeout_s is not None:
        kw["timeout"] = timeout_s
    return GateRun(gate, GateOptions(out=Path(out_dir), **kw), RunContext(Path(root), lock, fetch))


def run(r: GateRun):
    """The gate's report (not yet written), as `reprostack gate G --no-container` runs it (Gate.run)."""
    return registry.gate(r.gate).run(r.opts, r.ctx)
