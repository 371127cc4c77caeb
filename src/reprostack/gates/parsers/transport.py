"""The one reader of per-rank transport evidence, shared by every gate that runs on an EFA profile: fabric
(nccl-tests), micro (test_ep through the trials driver), megatron and nemo-rl. From NCCL's `NCCL_DEBUG=INFO` lines
(and the aws-ofi-nccl plugin's, which NCCL prints) it says, per rank, which net plugin and libfabric provider the
rank's process selected, which network its communicators took, its connections by kind, and, when the stack runs
DeepEP over NCCL's GPU-initiated networking (GIN), whether GIN was on and which GIN type ran.

Each line `HOST:PID:TID [DEV] NCCL INFO|WARN MSG` counts wherever it stands in a line (a launcher prefix, a Ray
`(Worker pid=N, ip=A)` prefix or a timestamp before it is skipped). What is read (shapes from NCCL v2.30.4-1 and
v2.30.7-1 src/plugin/{net,gin}.cc, src/init.cc, src/transport/net.cc, src/misc/param.cc; aws-ofi-nccl 12166be6 and
v1.21.1 src/nccl_ofi_net.cpp, src/rdma/gin/; the published campaign's p5en log,
tests/fixtures/published-2026-07/trtllm-shim/serve_log_head.log):
- the net plugin: `NET/Plugin: Loaded net plugin NAME (vN)` (external), `NET/Plugin: Could not find: ...` (none),
  `Initialized NET plugin NAME`, `Failed to initialize NET plugin NAME`, `Successfully loaded external network
  plugin PATH`;
- the network of each communicator: `Assigned NET plugin NAME to comm` (2.30), `Using network NAME`;
- aws-ofi-nccl's provider: `NET/OFI Selected provider is P, fabric is F (found N nics)` (`Provider` before 1.6);
- GIN: `NET/Plugin: Loaded gin plugin NAME (vN)` (2.30.4) / `GIN/Plugin: Loaded gin plugin NAME (vN)` (2.30.7+),
  `Assigned GIN plugin NAME to comm` (2.30.4, no type printed), `GIN/Plugin: Assigned plugin NAME type T to comm`
  (2.30.7+), `[GIN/Plugin: ]Failed to initialize any GIN plugin`, WARN `GIN is disabled.` / `GIN not supported.` /
  `No GIN-capable devices found.`, aws-ofi-nccl's EFA-GDA backend `NET/OFI gin GDAKI: createContext done (...)`
  (GIN type 5, NCCL_NET_DEVICE_GIN_EFA_GDA), and `NCCL_GIN_TYPE set by environment to T.` (what was asked: never
  taken for what ran); GIN types (nccl_device/core.h): 0 none, 2 proxy (CPU-initiated), 3 GDAKI, 4 GPI, 5 EFA-GDA;
- which process is which rank: the caller's map (nccl-tests' `#  Rank` lines; the trials driver's per-rank record
  with its host and pid), else NCCL's `comm 0x.. rank R nranks N cudaDev D ... Init START|COMPLETE`: the rank of
  the communicator with the most ranks that process (and device) joined, when that is the widest communicator of
  the log (a Megatron or NeMo-RL process also joins TP/EP/DP sub-groups, whose ranks are not the global ones);
- per connection `Channel CC/c : R[d] -> S[e] [send|receive] via NET/NAME/...|P2P/...|SHM/...` (a `[receive]`
  line belongs to its destination rank, any other to its source).

Per rank (`RankTransport.transport`): the network its NET connections went over (`NET/OFI <provider>` for the OFI
plugin, `Socket`, `IB`, else `NET/<name>`; `mixed: ...` over more than one); `none: no network (one node)` when
it made no NET connection and every rank is on one host; from its comm's `Using network` / `Assigned NET plugin`
when no connection line was printed; `unknown: ...` without NCCL INFO lines. `networks` lists every network the
process's communicators took (two names: a second plugin). gates.transport judges these against what a profile
and a stack need.

Invariants: pure, never raises on content (the caller decodes with errors="replace"); bounded: at most MAX_CHARS
read, lines over MAX_LINE skipped, at most MAX_RANKS ranks and processes kept (a process seen before a flood keeps
every later line), at most MAX_NAMES networks per process; names are cut to 64 characters.
"""

from __future__ import annotations

import re
from collections import Counter
from dataclasses import dataclass, field

from .logtext import split_prefix

MAX_CHARS = 64 << 20
MAX_LINE = 4096
MAX_RANKS = 4096
MAX_NAMES = 64
NONE_ONE_NODE = "none: no network (one node)"
GIN_TYPES = {0: "none", 2: "proxy", 3: "GDAKI", 4: "GPI", 5: "EFA-GDA"}
GPU_INITIATED = frozenset({3, 4, 5})  # the kernel posts the network work itself; 2 is NCCL's CPU proxy

NCCL_LINE = re.compile(r"([^\s:\[\]()]{1,255}):(\d{1,10}):(\d{1,10}) \[(\d{1,6})\] NCCL (INFO|WARN) (.*)$")
_VERSION = re.compile(r"^NCCL version (\S{1,64})")
_PLUGIN = re.compile(r"^NET/Plugin ?: Loaded net plugin (.{1,64}?) \(v(\d{1,4})\)")
_PLUGIN_LIB = re.compile(r"^Successfully loaded external network plugin (\S{1,1024})")
_NO_PLUGIN = re.compile(r"^NET/Plugin ?: (?:Could not find|No plugin found|Plugin load returned)")
_INIT_PLUGIN = re.compile(r"^Initialized NET plugin (.{1,64}?)\s*$")
_FAILED_PLUGIN = re.compile(r"^Failed to initialize NET plugin (.{1,64}?)\s*$")
_PROVIDER = re.compile(r"^NET/OFI Selected [Pp]rovider is ([^\s,]{1,64})(?:, fabric is ([^\s,()]{1,64}))?")
_NETWORK = re.compile(r"^(?:Using network|Assigned NET plugin) (.{1,64}?)(?: to comm)?\s*$")
_GIN_LOADED = re.compile(r"^(?:NET|GIN)/Plugin ?: Loaded gin plugin (.{1,64}?) \(v(\d{1,4})\)")
_GIN_ASSIGNED = re.compile(
    r"^(?:Assigned GIN plugin (.{1,64}?) to comm|GIN/Plugin: Assigned plugin (\S{1,64}) type (\d{1,3}) to comm)"
)
_GIN_NONE = re.compile(r"^(?:GIN/Plugin: )?Failed to initialize any GIN plugin")
_GIN_WARN = re.compile(r"^(GIN is disabled\.|GIN not supported\.|No GIN-capable devices found\.)")
_GIN_GDA_DONE = re.compile(r"^NET/OFI gin GDAKI: createContext done\b")
_GIN_ENV = re.compile(r"^NCCL_GIN_TYPE set by environment to (-?\d{1,3})\.")
_INIT = re.compile(r"\bcomm 0x[0-9a-fA-F]{1,16} rank (\d{1,9}) nranks (\d{1,9}) cudaDev (\d{1,6})\b")
_NNODES = re.compile(r"\bcomm 0x[0-9a-fA-F]{1,16} rank (\d{1,9}) nRanks (\d{1,9}) nNodes (\d{1,9})\b")
_CHANNEL = re.compile(
    r"^Channel (\d{1,4})(?:/(\d{1,4}))? : (\d{1,9})\[(\d{1,6})\] -> (\d{1,9})\[(\d{1,6})\]"
    r"(?: \[(send|receive)\])? via (.{1,200})$"
)
_OFI_NAMES = re.compile(r"libfabric|\bofi\b", re.I)


@dataclass(frozen=True)
class RankTransport:
    """What rank `rank` used (module doc): its process, the net plugin and provider that process loaded, the network
    its comm chose (`network`, the last one; `networks`, every distinct one), its connections by kind, the transport
    in words and why; GIN: `gin` (the GIN plugin assigned to its comm, None), `gin_type` (the type the log shows ran,
    None when no line says), `gin_off` (why GIN is off: NCCL's words), `gin_type_env` (NCCL_GIN_TYPE as NCCL read
    it). `rank` is None for a process no rank line names."""

    rank: int | None
    host: str | None
    pid: int | None
    device: int | None
    net_plugin: str | None
    provider: str | None
    fabric: str | None
    network: str | None
    connections: dict
    transport: str
    why: str
    networks: tuple[str, ...] = ()
    gin: str | None = None
    gin_type: int | None = None
    gin_off: str | None = None
    gin_type_env: int | None = None

    def to_dict(self) -> dict:
        return {
            "rank": self.rank,
            "host": self.host,
            "pid": self.pid,
            "device": self.device,
            "net_plugin": self.net_plugin,
            "provider": self.provider,
            "fabric": self.fabric,
            "network": self.network,
            "networks": list(self.networks),
            "connections": self.connections,
            "transport": self.transport,
            "why": self.why,
            "gin": self.gin,
            "gin_type": self.gin_type,
            "gin_off": self.gin_off,
            "gin_type_env": self.gin_type_env,
        }


@dataclass(frozen=True)
class TransportParse:
    """Every rank's transport (`ranks`, by rank), the processes with NCCL lines that no rank line names
    (`unattributed`), the widest communicator's size (`nranks`, None when no init line), NCCL versions per
    process, and what is wrong with the lines themselves (`problems`)."""

    ranks: tuple[RankTransport, ...]
    unattributed: tuple[RankTransport, ...]
    nranks: int | None
    nccl_versions: dict
    problems: tuple[str, ...] = ()

    @property
    def hosts(self) -> set:
        return {t.host for t in self.ranks if t.host}

    def to_dict(self) -> dict:
        return {
            "ranks": [t.to_dict() for t in self.ranks],
            "unattributed": [t.to_dict() for t in self.unattributed],
            "nranks": self.nranks,
            "problems": list(self.problems),
        }


@dataclass
class _Proc:
    """NCCL facts of one process (host, pid)."""

    plugin: str | None = None
    plugin_version: str | None = None
    plugin_lib: str | None = None
    no_plugin: bool = False
    provider: str | None = None
    fabric: str | None = None
    networks: list = field(default_factory=list)  # (dev, name) of each comm's network
    version: str | None = None
    gin: str | None = None
    gin_type: int | None = None
    gin_off: str | None = None
    gin_env: int | None = None


def net_family(name: str, provider: str | None) -> str:
    """The transport in words of a network name: `Socket`, `IB`, `NET/OFI <provider>` for the OFI plugin."""
    if name == "Socket":
        return "Socket"
    if name == "IB":
        return "IB"
    if _OFI_NAMES.search(name):
        return f"NET/OFI {provider or '? (no provider line)'}"
    return f"NET/{name}"


def _via_kind(via: str) -> str:
    """`NET/Libfabric` of `NET/Libfabric/0/GDRDMA`, `P2P` of `P2P/CUMEM/read`, `SHM` of `SHM/direct/direct`."""
    if via.startswith("NET/"):
        return "NET/" + via[4:].split("/", 1)[0].strip()[:64]
    return re.split(r"[/\s]", via, maxsplit=1)[0][:32] or "?"


class NcclLines:
    """The NCCL INFO/WARN side of a log: processes, init lines (rank per process and device), nNodes, connections
    per rank. Feed it with `line(host, pid, dev, level, msg)` (or `feed(text)`), then `transports(...)`."""

    def __init__(self):
        self.procs: dict[tuple[str, int], _Proc] = {}
        self.inits: dict[tuple[str, int, int], tuple[int, int]] = {}  # (host, pid, dev) -> (nranks, rank), widest
        self.nnodes: dict[int, int] = {}
        self.conns: dict[int, Counter] = {}

    def line(self, host: str, pid: int, dev: int, level: str, msg: str) -> None:
        p = self.procs.get((host, pid))
        if p is None:
            if len(self.procs) >= MAX_RANKS:  # a flood of forged processes: the first MAX_RANKS are kept
                return
            p = self.procs[(host, pid)] = _Proc()
        if level == "WARN":
            if (m := _GIN_WARN.match(msg)) and p.gin is None:
                p.gin_off = p.gin_off or m.group(1)
            return
        if m := _VERSION.match(msg):
            p.version = m.group(1)
        elif m := _PLUGIN.match(msg):
            p.plugin, p.plugin_version = m.group(1), m.group(2)
        elif m := _PLUGIN_LIB.match(msg):
            p.plugin_lib = m.group(1)
        elif _NO_PLUGIN.match(msg):
            p.no_plugin = True
        elif m := _PROVIDER.match(msg):
            p.provider, p.fabric = m.group(1), m.group(2)
        elif m := _NETWORK.match(msg):
            if len(p.networks) < MAX_NAMES:
                p.networks.append((dev, m.group(1).strip()))
        elif m := _GIN_ASSIGNED.match(msg):
            p.gin = (m.group(1) or m.group(2)).strip()
            p.gin_off = None
            if m.group(3) is not None:
                p.gin_type = int(m.group(3))
        elif _GIN_GDA_DONE.match(msg):
            p.gin_type = 5  # aws-ofi-nccl's GDAKI backend reports NCCL_NET_DEVICE_GIN_EFA_GDA
            p.gin = p.gin or "Libfabric"
        elif m := _GIN_NONE.match(msg):
            if p.gin is None:
                p.gin_off = m.group(0)
        elif m := _GIN_ENV.match(msg):
            p.gin_env = int(m.group(1))
        elif m := _CHANNEL.search(msg):
            src, dst, way, via = int(m.group(3)), int(m.group(5)), m.group(7), m.group(8)
            rank = dst if way == "receive" else src
            if rank < MAX_RANKS and (rank in self.conns or len(self.conns) < MAX_RANKS):
                self.conns.setdefault(rank, Counter())[_via_kind(via)] += 1
        else:
            if (m := _INIT.search(msg)) and int(m.group(1)) < MAX_RANKS:
                rank, nranks, dev_ = int(m.group(1)), int(m.group(2)), int(m.group(3))
                key = (host, pid, dev_)
                old = self.inits.get(key)
                if (old is None and len(self.inits) < MAX_RANKS) or (old is not None and nranks > old[0]):
                    self.inits[key] = (nranks, rank)
            if (m := _NNODES.search(msg)) and int(m.group(1)) < MAX_RANKS:
                self.nnodes[int(m.group(1))] = int(m.group(3))

    def feed(self, text: str) -> int:
        """Read every NCCL line of `text` (bounded, module doc); returns the count of lines skipped as too long."""
        long_lines = 0
        for raw in text[:MAX_CHARS].split("\n"):
            if len(raw) > MAX_LINE:
                long_lines += 1
                continue
            if "NCCL" not in raw:
                continue
            _pre, body = split_prefix(raw.rstrip("\r"))
            if m := NCCL_LINE.search(body):
                self.line(m.group(1), int(m.group(2)), int(m.group(4)), m.group(5), m.group(6))
        return long_lines

    def rank_map(self) -> tuple[dict[int, tuple[str, int, int]], int | None]:
        """({rank: (host, pid, dev)} from the init lines of the widest communicator, its size)."""
        if not self.inits:
            return {}, None
        widest = max(n for n, _ in self.inits.values())
        where: dict[int, tuple[str, int, int]] = {}
        for key, (n, rank) in self.inits.items():
            if n == widest:
                where.setdefault(rank, key)
        return where, widest

    def transports(
        self, known: dict[int, tuple[str, int, int | None]] | None = None, *, hosts: set | None = None
    ) -> TransportParse:
        """Per rank: `known` ({rank: (host, pid, device or None)}, the caller's map) first, then the init lines.
        `hosts`: every host the caller knows ranks on (one host and no NET connection: no network)."""
        known = dict(known or {})
        where, nranks = self.rank_map()
        every = sorted(set(known) | set(where) | set(self.conns))[:MAX_RANKS]
        hosts = set(hosts or ()) | {k[0] for k in known.values()} | {w[0] for w in where.values()}
        one_node = len(hosts) <= 1 and all(n <= 1 for n in self.nnodes.values())
        out, used = [], set()
        for rank in every:
            loc = known.get(rank) or where.get(rank)
            host, pid, dev = loc if loc else (None, None, None)
            if dev is None and host is not None:
                dev = next((d for (h, p, d) in self.inits if (h, p) == (host, pid)), None)
            proc = self.procs.get((host, pid)) if host is not None else None
            if proc is not None:
                used.add((host, pid))
            out.append(self._one(rank, host, pid, dev, proc, one_node, bool(loc)))
        rest = [
            self._one(None, h, p, None, proc, one_node, True)
            for (h, p), proc in self.procs.items()
            if (h, p) not in used and (proc.networks or proc.provider or proc.plugin or proc.gin or proc.gin_off)
        ]
        versions = {f"{h}:{p}": pr.version for (h, p), pr in sorted(self.procs.items()) if pr.version}
        return TransportParse(tuple(out), tuple(rest[:MAX_RANKS]), nranks, versions)

    def _one(self, rank, host, pid, dev, proc: _Proc | None, one_node: bool, located: bool) -> RankTransport:
        conns = dict(sorted((self.conns.get(rank) or Counter()).items())) if rank is not None else {}
        nets = [k for k in conns if k.startswith("NET/")]
        networks = ([n for d, n in proc.networks if d == dev] or [n for _, n in proc.networks]) if proc else []
        network = networks[-1] if networks else None
        plugin = None
        if proc is not None:
            plugin = (
                f"{proc.plugin} (v{proc.plugin_version})"
                if proc.plugin
                else ("internal (no external net plugin)" if proc.no_plugin else None)
            )
        provider = proc.provider if proc else None
        if len(nets) > 1:
            transport = "mixed: " + ", ".join(net_family(n[4:], provider) for n in nets)
            why = f"NET connections over more than one network: {', '.join(nets)}"
        elif nets:
            transport = net_family(nets[0][4:], provider)
            why = f"{conns[nets[0]]} NET connection line(s) via {nets[0]}"
        elif one_node and (proc is not None or located):
            intra = ", ".join(f"{k} x{v}" for k, v in conns.items()) or "no connection (one rank)"
            transport = NONE_ONE_NODE
            why = f"every rank on one host; intra-node: {intra}" + (
                f"; NCCL chose network {network}" if network else ""
            )
        elif network:
            transport = net_family(network, provider)
            why = f"no connection lines for this rank; its comm's `Using network {network}`"
        else:
            transport = "unknown: no NCCL INFO lines for this rank (NCCL_DEBUG=INFO, NCCL_DEBUG_SUBSYS=INIT,NET?)"
            why = "no connection lines and no `Using network` line"
        return RankTransport(
            rank,
            host,
            pid,
            dev,
            plugin,
            provider,
            proc.fabric if proc else None,
            network,
            conns,
            transport,
            why,
            tuple(dict.fromkeys(n for _, n in proc.networks)) if proc else (),
            proc.gin if proc else None,
            proc.gin_type if proc else None,
            proc.gin_off if proc else None,
            proc.gin_env if proc else None,
        )


def nccl_host(hostname: str) -> str:
    """The host name NCCL prints: gethostname() up to its first '.' (NCCL's getHostName)."""
    return hostname.split(".", 1)[0]


def parse_transport(text: str, known: dict | None = None) -> TransportParse:
    """Every rank's transport in `text` (one log, or several nodes' logs joined). `known`: {rank: (host, pid,
    device or None)} from the caller's own per-rank records. Never raises on content."""
    if not isinstance(text, str):
        return TransportParse((), (), None, {}, ("output is not text",))
    lines = NcclLines()
    long_lines = lines.feed(text)
    parse = lines.transports(known)
    problems = []
    if len(text) > MAX_CHARS:
        problems.append(f"output over {MAX_CHARS} characters: the rest is not read")
    if long_lines:
        problems.append(f"{long_lines} line(s) over {MAX_LINE} characters skipped")
    return TransportParse(parse.ranks, parse.unattributed, parse.nranks, parse.nccl_versions, tuple(problems))
