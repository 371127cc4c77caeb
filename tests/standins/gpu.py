"""The GPU stand-in: a gate's multi-node run rehearsed on machines with no GPU and no EFA (CI), never evidence.

Test code, outside the reprostack package: the gates load it through their seam (reprostack.gates.standin) from the
checkout they run from, and only when the variable below asks for it; an installed reprostack has none.

`REPROSTACK_STANDIN=h200[,fail-node=R][,hang][,rdzv=S][,wait=S]` in the environment of `reprostack gate G` (the
rendered sbatch passes the submitter's environment to every task; the rehearsal sets it in each container) makes the
gate's staged run take, on each node:
- the host facts of a p5en.48xlarge node (8 x NVIDIA H200 at the driver seen on the lent H200, 16 EFA devices) instead
  of this host's inventory;
- no sources and no kernels (nothing fetched, patched or built): the pins' trees named by the lock, a stand-in
  libnccl under the node's out folder;
- its plan's own command for this node (the torchrun line of the trials driver, unchanged), executed by
  `python tests/standins/gpu.py replay ... -- ARGV`: the replay reads the torchrun and driver options from ARGV
  (nodes, node rank, master address and port, processes per node, trials, arms), meets the other nodes at the
  master address and port (node 0 listens, the others connect: the rendezvous address the launcher rendered must
  work, as torchrun's c10d store needs it to), and prints for each of its ranks what that rank of a p5en node prints:
  that rank's own NCCL INFO lines of the campaign's 2 x p5en log (tests/fixtures/published-2026-07/trtllm-shim/
  serve_log_head.log: its init line, Libfabric net and GIN plugins, provider efa, 16 NICs; what gates.transport judges
  per rank) under this node's name suffixed `-nodeR` (unique when the nodes share a machine), the trials driver's markers, test_ep's phase lines of a real H200 run
  (results/gate_micro/2026-12-02-h200-ep1-k5: rank r of trial k replays that run's trial (k + r) mod 5, relabelled
  `EP r/N`), the dense arm's records of that run when asked, and its one-NCCL record (this node's name, the stand-in
  library);
- every report it touches says so: the reason starts with NOTE, `provenance.stand_in` holds the stand-in's settings,
  `evidence` is false (a PASS prints `PASS (GPU stand-in, not evidence)` and exits 3, like local-test).

Faults on purpose (the rehearsal's cases): `fail-node=R` (node R prints its first marker and a failure, exits 1),
`hang` (every node stops after its first trial and sleeps until signalled), `rdzv=S` (seconds the rendezvous
waits for every node, default 20), `wait=S` (the output contract's bounded wait of node 0 for the others).

Invariants: the stand-in runs only when the variable is set; a malformed value is one ReprostackError line; it
never writes outside the run's out folder; nothing it prints can pass for a GPU run (the NOTE in every report).
"""

from __future__ import annotations

import json
import os
import re
import socket
import sys
import time
from dataclasses import asdict, dataclass
from pathlib import Path

from reprostack import hostinfo
from reprostack.errors import ReprostackError
from reprostack.gates.standin import ENV, NOTE

RECORDINGS = ("h200",)
# what the replay reads, relative to the project root (the checkout the gate runs from)
TRIALS_LOG = "results/gate_micro/2026-12-02-h200-ep1-k5/micro/test_ep.log"  # real H200 run, 5 trials, dense arm
# the campaign's 2 x p5en serve log (NCCL 2.30.4 + aws-ofi-nccl, 16 ranks): each rank's own NCCL INFO lines
NCCL_LINES = "tests/fixtures/published-2026-07/trtllm-shim/serve_log_head.log"
DRIVER = "580.159.04"  # nvidia-smi on the lent H200 (results/gate_micro/*/gpu.txt)
RECORDED_ARCH = "90"  # the H200's compute capability 9.0 (nvidia-smi compute_cap of the run TRIALS_LOG replays)
GPU = "NVIDIA H200"
P5EN_GPUS, P5EN_EFA = 8, 16


@dataclass(frozen=True)
class StandIn:
    """The stand-in's settings (module doc)."""

    recording: str = "h200"
    fail_node: int | None = None
    hang: bool = False
    rdzv_s: float = 20.0
    wait_s: float | None = None

    def to_env(self) -> str:
        out = [self.recording]
        out += [f"fail-node={self.fail_node}"] if self.fail_node is not None else []
        out += ["hang"] if self.hang else []
        out += [f"rdzv={self.rdzv_s:g}"] if self.rdzv_s != 20.0 else []
        out += [f"wait={self.wait_s:g}"] if self.wait_s is not None else []
        return ",".join(out)

    def record(self) -> dict:
        """`provenance.stand_in` of a report it touched."""
        return {**asdict(self), "note": NOTE, "env": f"{ENV}={self.to_env()}", "replays": [TRIALS_LOG, NCCL_LINES]}

    # what the gates ask of it (reprostack.gates.standin.StandIn)
    recorded_arch = RECORDED_ARCH

    def host_facts(self) -> dict:
        """A p5en.48xlarge node as hostinfo.collect() describes a host (this machine's name, kernel and Python)."""
        gpus = [
            {
                "index": i,
                "name": GPU,
                "driver_version": DRIVER,
                "memory_total_mib": 143771,
                "pci_bus_id": f"00000000:{0x97 + i:02X}:00.0",
            }
            for i in range(P5EN_GPUS)
        ]
        efa = [{"name": f"rdmap{80 + i}s0", "pci": f"0000:{0x80 + i:02x}:00.0", "ports": {}} for i in range(P5EN_EFA)]
        return {
            **hostinfo.machine(),
            "gpus": gpus,
            "gpu_count": len(gpus),
            "driver_version": DRIVER,
            "cuda_driver_version": "13.0",
            "efa_devices": efa,
            "other_rdma_devices": [],
            "efa_versions": {},
            "nccl_runtime": None,
            "notes": [f"{NOTE}: these GPUs and EFA devices are the stand-in's, not this host's"],
            "stand_in": True,
        }

    def nccl_version(self, lock) -> str:
        """The pinned NCCL's version, from the lock (`original: v2.30.4-1` -> 2.30.4)."""
        pin = lock.upstreams.get("nccl")
        m = re.search(r"(\d+\.\d+\.\d+)", str(getattr(pin, "original", "") or getattr(pin, "version", "") or ""))
        return m.group(1) if m else "0.0.0"

    def stand_in_lib(self, folder: Path) -> Path:
        """A stand-in libnccl.so.2 in `folder` (a text file that says what it is); returns the folder."""
        folder.mkdir(parents=True, exist_ok=True)
        lib = folder / "libnccl.so.2"
        if not lib.is_file():
            lib.write_text(f"{NOTE}: not a library\n")
        return folder

    def trees(self, lock, names, out_dir: Path) -> dict:
        """{pin: SourceTree} of `names` as the lock pins them (patched tree), at a path under the out folder that
        does not exist: nothing is fetched (a stack whose NCCL is a wheel alone has no nccl tree, as in
        gates.kernelprep.source_trees)."""
        from reprostack.kernels import ncclwheel
        from reprostack.sources import SourceTree

        out = {}
        for n in names:
            if n == "nccl" and not ncclwheel.needs_source(lock, "nccl"):
                continue
            pin = lock.get(n)
            where = Path(out_dir) / "stand-in" / "not-fetched" / n
            out[n] = SourceTree(pin, where, pin.patched_tree or pin.tree, bool(pin.patches), True)
        return out

    def wrap(self, argv: list[str], *, root: Path, nccl_lib: Path, version: str) -> list[str]:
        """The command that replays `argv` (the plan's command for this node) through the stand-in."""
        return [
            sys.executable,
            str(Path(__file__).resolve()),
            "replay",
            "--root",
            str(root),
            "--nccl-lib",
            str(nccl_lib),
            "--nccl-version",
            version,
            "--",
            *argv,
        ]


def parse(text: str) -> StandIn:
    """`h200,fail-node=1,hang,rdzv=10,wait=5` -> StandIn; ReprostackError (one line) otherwise."""
    parts = [p.strip() for p in str(text).split(",")]
    bad = ReprostackError(
        f"{ENV}={str(text)[:80]!r}: expected h200[,fail-node=R][,hang][,rdzv=S][,wait=S] (the GPU stand-in)"
    )
    if not parts or parts[0] not in RECORDINGS:
        raise bad
    kw: dict = {"recording": parts[0]}
    for p in parts[1:]:
        k, eq, v = p.partition("=")
        try:
            if k == "hang" and not eq:
                kw["hang"] = True
            elif k == "fail-node" and eq and v.isdigit() and len(v) < 4:
                kw["fail_node"] = int(v)
            elif k in ("rdzv", "wait") and eq and 0 < float(v) <= 3600:
                kw["rdzv_s" if k == "rdzv" else "wait_s"] = float(v)
            else:
                raise bad
        except ValueError:
            raise bad from None
    return StandIn(**kw)


def from_env(environ=None) -> StandIn | None:
    """The stand-in the environment asks for (None: a real run)."""
    v = (os.environ if environ is None else environ).get(ENV)
    return parse(v) if v else None


# --------------------------------------------------------------------------- the replay (its own process)


def _opt(argv: list[str], name: str, default=None):
    for i, a in enumerate(argv):
        if a == name and i + 1 < len(argv):
            return argv[i + 1]
        if a.startswith(name + "="):
            return a.split("=", 1)[1]
    return default


@dataclass(frozen=True)
class Launch:
    nodes: int
    node: int
    master: str
    port: int
    per_node: int
    trials: int
    arms: tuple[str, ...]
    experts: int
    topk: int
    tokens: int
    hidden: int
    sms: int | None
    qps: int | None

    @property
    def ranks(self) -> range:
        return range(self.node * self.per_node, (self.node + 1) * self.per_node)


def read_launch(argv: list[str]) -> Launch:
    """The torchrun and trials-driver options of the plan's command (launch.torchrun, gates.micro)."""

    def num(name, default):
        v = _opt(argv, name, None)
        return default if v is None else int(v)

    return Launch(
        nodes=num("--nnodes", 1),
        node=num("--node-rank", 0),
        master=_opt(argv, "--master-addr", "127.0.0.1"),
        port=num("--master-port", 29500),
        per_node=num("--num-processes", 1),
        trials=num("--trials", 1),
        arms=tuple(_opt(argv, "--arms", "deepep").split(",")),
        experts=num("--num-experts", 256),
        topk=num("--num-topk", 8),
        tokens=num("--num-tokens", 128),
        hidden=num("--hidden", 7168),
        sms=num("--num-sms", None),
        qps=num("--num-qps", None),
    )


def rendezvous(launch: Launch, timeout_s: float) -> str | None:
    """Meet every node at master:port (node 0 listens, the others connect and wait for its `go`). Returns None,
    or why it failed (torchrun's rendezvous would time out the same way)."""
    if launch.nodes == 1:
        return None
    deadline = time.monotonic() + timeout_s
    if launch.node == 0:
        srv = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        srv.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            srv.bind(("", launch.port))
        except OSError as e:
            return f"cannot listen on port {launch.port}: {e.strerror or e}"
        srv.listen(launch.nodes)
        joined, conns = set(), []
        while len(joined) < launch.nodes - 1:
            left = deadline - time.monotonic()
            if left <= 0:
                missing = sorted(set(range(1, launch.nodes)) - joined)
                return f"rendezvous timed out after {timeout_s:g} s: node(s) {missing} never joined"
            srv.settimeout(left)
            try:
                c, _ = srv.accept()
                c.settimeout(5)
                hello = c.recv(64).decode(errors="replace").split()
            except OSError:
                continue
            if len(hello) == 2 and hello[0] == "node" and hello[1].isdigit():
                joined.add(int(hello[1]))
                conns.append(c)
        for c in conns:
            c.sendall(b"go\n")
            c.close()
        srv.close()
        return None
    while True:
        try:
            with socket.create_connection((launch.master, launch.port), timeout=2) as c:
                c.sendall(f"node {launch.node}\n".encode())
                c.settimeout(max(1.0, deadline - time.monotonic()))
                if c.recv(8).startswith(b"go"):
                    return None
        except OSError:
            pass
        if time.monotonic() > deadline:
            return f"rendezvous timed out after {timeout_s:g} s: master {launch.master}:{launch.port} never answered"
        time.sleep(0.2)


def _recorded_trials(root: Path) -> tuple[list[list[str]], list[list[dict]], dict, dict]:
    """(phase lines per trial, dense phase records per trial, dense config, dense done) of the real H200 run."""
    trials: list[list[str]] = []
    dense: list[list[dict]] = []
    cfg, done = {}, {}
    arm = None
    for line in (root / TRIALS_LOG).read_text().splitlines():
        if line.startswith("[micro_trials] "):
            m = json.loads(line.split(" ", 1)[1])
            if m.get("event") == "trial":
                arm = m["arm"]
                (trials if arm == "deepep" else dense).append([])
        elif line.startswith("[dense_a2a] "):
            r = json.loads(line.split(" ", 1)[1])
            if r.get("event") == "config":
                cfg = r
            elif r.get("event") == "done":
                done = r
            elif r.get("event") == "phase":
                dense[-1].append(r)
        elif arm == "deepep" and re.match(r"\s+[*#@+-] EP:", line):
            trials[-1].append(line)
    return trials, dense, cfg, done


_NCCL_LINE = re.compile(r"^([\w.-]+):(\d+):\d+ \[\d+\] (NCCL (?:INFO|WARN) .*)$")
_NCCL_INIT = re.compile(r"\bcomm 0x[0-9a-fA-F]+ rank (\d+) nranks (\d+) cudaDev \d+")


def _nccl_lines(root: Path) -> dict[int, list[str]]:
    """{global rank: that rank's NCCL lines of the campaign's p5en log, host and pid stripped}: each process's rank
    is the one of the widest communicator it joined (its init line), as gates.parsers.transport reads it."""
    procs: dict[tuple[str, str], list[str]] = {}
    rank_of: dict[tuple[str, str], tuple[int, int]] = {}
    for line in (root / NCCL_LINES).read_text(errors="replace").splitlines():
        m = _NCCL_LINE.match(line)
        if not m:
            continue
        key = (m.group(1), m.group(2))
        procs.setdefault(key, []).append(m.group(3))
        i = _NCCL_INIT.search(line)
        if i and int(i.group(2)) >= rank_of.get(key, (-1, 0))[0]:
            rank_of[key] = (int(i.group(2)), int(i.group(1)))
    return {rank: procs[key] for key, (_, rank) in rank_of.items()}


def replay(launch: Launch, *, root: Path, st: StandIn, nccl_lib: str, version: str) -> int:
    """Print what this node's ranks of the trials driver print (module doc); the exit status torchrun would give."""
    host = socket.gethostname()
    why = rendezvous(launch, st.rdzv_s)
    if why:
        print(f"torch.distributed.elastic.rendezvous.api.RendezvousTimeoutError: {why} ({NOTE})", flush=True)
        return 1
    trials, dense, cfg, done = _recorded_trials(root)
    n = launch.nodes * launch.per_node
    print(
        f"[stand-in] {NOTE}: node {launch.node} of {launch.nodes}, ranks {launch.ranks.start}..{launch.ranks.stop - 1}"
    )
    lines = _nccl_lines(root)
    # NCCL prints gethostname() up to its first '.': a node's own name, made unique per node (the rehearsal runs
    # both nodes on one machine); each rank its own process id
    node_host = f"{host.split('.', 1)[0]}-node{launch.node}"
    for r in launch.ranks:
        lr = r - launch.ranks.start
        for text in lines.get(r % len(lines) if lines else r, []):
            print(f"{node_host}:{4100 + r}:{4100 + r} [{lr}] {text}")
    for k in range(launch.trials):
        _markers(launch, "deepep", k)
        if st.fail_node == launch.node:
            print(
                f"RuntimeError: stand-in node {launch.node} failed as asked ({ENV} fail-node={launch.node})", flush=True
            )
            return 1
        _print_config(launch)
        for r in launch.ranks:
            for line in trials[(k + r) % len(trials)]:
                print(re.sub(r"EP:\s*\d+/\d+", f"EP: {r:3d}/{n}", line))
        print("", flush=True)
        if st.hang:
            print(f"[stand-in] node {launch.node}: hanging after trial {k} as asked ({ENV} hang)", flush=True)
            while True:
                time.sleep(3600)
        if "dense" in launch.arms:
            _markers(launch, "dense", k)
            if k == 0 and launch.node == 0:
                print("[dense_a2a] " + json.dumps({**cfg, "world": n}, sort_keys=True))
            for r in launch.ranks:
                for rec in dense[(k + r) % len(dense)]:
                    print("[dense_a2a] " + json.dumps({**rec, "rank": r, "world": n, "trial": k}, sort_keys=True))
    _print_ends(launch, host=host, nccl_lib=nccl_lib, version=version, dense_done=done)
    return 0


_MARKER = "[micro_trials] "


def _markers(launch: Launch, arm: str, k: int) -> None:
    """The trials driver's marker of trial `k` of `arm`, one per rank of this node."""
    for r in launch.ranks:
        event = {"arm": arm, "event": "trial", "rank": r, "trial": k, "trials": launch.trials}
        print(_MARKER + json.dumps(event, sort_keys=True))


def _print_config(launch: Launch) -> None:
    """test_ep's `Config:` block of this node (its tokens as upstream's: the node's first rank less) and the one
    mode it tests."""
    print("Config:")
    print(f" > Ranks: {launch.nodes} x {launch.per_node}")
    print(f" > Experts: {launch.topk}/{launch.experts}")
    print(f" > Tokens: {max(1, launch.tokens - launch.ranks.start)} (max: {launch.tokens}), hidden: {launch.hidden}")
    if launch.sms is not None:
        print(f" > #SM: {launch.sms}, #QPs: {launch.qps or launch.sms}/{launch.qps or launch.sms}")
    print("")
    print("Running all test cases:")
    print(
        " > Testing with do_handle_copy=1, expert_alignment=128, use_fp8_dispatch=1, num_bias=0, "
        "with_previous_event=0, async_with_compute_stream=0, allocate_on_comm_stream=0 ..."
    )


def _print_ends(launch: Launch, *, host: str, nccl_lib: str, version: str, dense_done: dict) -> None:
    """After the trials, per rank of this node: the driver's one-NCCL record, the dense arm's last record (when it
    ran) and the driver's done marker."""
    n = launch.nodes * launch.per_node
    for r in launch.ranks:
        rec = {"event": "nccl", "rank": r, "host": host, "mapped": [str(Path(nccl_lib).resolve() / "libnccl.so.2")]}
        # the driver's record: every libnccl mapping, the deleted ones listed too (none here; issue 29 item 1)
        rec.update(deleted=[], runtime=version, torch_built_with="2.28.9", deep_ep="/opt/reprostack/stand-in/deep_ep")
        print(_MARKER + json.dumps(rec, sort_keys=True))
    if "dense" in launch.arms:
        for r in launch.ranks:
            print("[dense_a2a] " + json.dumps({**dense_done, "rank": r, "world": n}, sort_keys=True))
    for r in launch.ranks:
        print(_MARKER + json.dumps({"event": "done", "rank": r, "trials": launch.trials}, sort_keys=True))


def main(argv: list[str] | None = None) -> int:
    """`python tests/standins/gpu.py replay --root DIR --nccl-lib DIR --nccl-version V -- ARGV`."""
    args = list(sys.argv[1:] if argv is None else argv)
    if not args or args[0] != "replay" or "--" not in args:
        print(
            "usage: python tests/standins/gpu.py replay --root DIR --nccl-lib DIR --nccl-version V -- ARGV",
            file=sys.stderr,
        )
        return 2
    cut = args.index("--")
    own, cmd = args[1:cut], args[cut + 1 :]
    try:
        st = from_env() or StandIn()
        return replay(
            read_launch(cmd),
            root=Path(_opt(own, "--root", ".")),
            st=st,
            nccl_lib=_opt(own, "--nccl-lib", "."),
            version=_opt(own, "--nccl-version", "0.0.0"),
        )
    except (ReprostackError, ValueError, OSError) as e:
        print(f"stand-in: {e}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
