"""`reprostack stacks`: list the lock's stacks; `stacks diff A B`; `stacks plugin` / `stacks check-plugin LIBDIR`
(reprostack.stacks)."""

from __future__ import annotations

from . import add_source_options, fetch_options, load_lock, lock_path

HELP = (
    "list the lock's stacks; `stacks diff A B`: the pins, patches and env that differ; "
    "`stacks plugin`: build the selected stack's aws-ofi-nccl GIN plugin chain"
)
DESCRIPTION = (
    "`stacks`: list the lock's stacks. `stacks diff A B`: the pins (rev, tree, version), "
    "patch series and env that differ. `stacks plugin --out DIR`: build rdma-core, "
    "libfabric and the aws-ofi-nccl plugin of the selected stack (--stack) from its "
    "verified pins into DIR/prefix and check it exports --symbol. `stacks check-plugin "
    "LIBDIR`: only the export check."
)


def add_arguments(p) -> None:
    p.add_argument("action", nargs="*", metavar="ACTION", help="nothing | diff A B | plugin | check-plugin LIBDIR")
    p.add_argument("--json", action="store_true", help="JSON instead of text")
    p.add_argument("--out", default="out/ginplugin", help="plugin: work folder (default: out/ginplugin)")
    from ..gates import options as gate_options

    gate_options.add_arguments(p, ("jobs",), help={"jobs": "plugin: parallel build jobs (default: all cores)"})
    p.add_argument("--cuda", default=None, help="plugin: CUDA root (default: from nvcc on PATH, else /usr/local/cuda)")
    p.add_argument("--render-only", action="store_true", help="plugin: write the build script, run nothing")
    p.add_argument(
        "--autogen-only",
        action="store_true",
        help="plugin: only run autogen.sh of libfabric and aws-ofi-nccl (on a host with autotools); the "
        "stamped trees under DIR/work/src go where autotools are missing ($GINPLUGIN_PREGEN)",
    )
    p.add_argument(
        "--symbol",
        default="ncclGinPlugin_v14",
        help="plugin/check-plugin: the GIN table that must be exported (default: ncclGinPlugin_v14, GDAKI only)",
    )
    add_source_options(p)


def run(args) -> int:
    from .. import stacks

    if args.action[:1] in (["plugin"], ["check-plugin"]):
        lock, root = load_lock(args)
        return stacks.plugin(args, lock, root, fetch_options(args) if args.action[0] == "plugin" else None)
    return stacks.run(lock_path(args), args.action, args.json)
