"""vulture's reviewed whitelist (`nox -s lint`; issue 38 item 4): names vulture reads as unused in src/ that are used,
each with where its use is. vulture scans src/, tests/, scripts/ and noxfile.py (a name any of them uses is alive)
and fails on what is left in src/. Never imported: the attribute reads below only name the names."""

_ = None

# fields of records written whole (dataclasses.asdict / __dict__ into JSON reports, the outdated table) or kept as
# what the parsed text said, read by people in the record rather than by code
_.pinned_date  # bump.outdated: `outdated --json`'s row (asdict)
_.target_date  # bump.outdated: `outdated --json`'s row (asdict)
_.read_from  # containers.push: where the pushed image's digest was read, in the push record
_.time_us  # gates.parsers.nccl_tests.Placement: nccl-tests' time column, kept beside algbw/busbw
_.step_ms  # gates.parsers.training: a training step's time as the log prints it (Megatron: ms)
_.step_s  # gates.parsers.training: the same for NeMo-RL (s)
_.reward  # gates.parsers.training: NeMo-RL's GRPO reward per step
_.plugin_lib  # gates.parsers.transport: the net plugin's library path NCCL printed, in the transport record
_.torch_cuda  # kernels.toolchain.Toolchain: torch's CUDA, part of the build key (the dataclass's fields are hashed)
_.essential  # lock.debian: a package's `Essential:` field, kept with the parsed stanza
_.messages  # patch.headers: how many mails a patch file holds
_.stopped_by_us  # launch.server: set when we stop the server; read by whoever holds the object (logs, tests)

# called by the standard library or a framework, never by our code
_.protocol_version  # gates.testserver: http.server.BaseHTTPRequestHandler reads it (HTTP/1.1 keep-alive)
_.log_message  # gates.testserver: BaseHTTPRequestHandler calls it for every request (silenced)
_.do_GET  # gates.testserver: BaseHTTPRequestHandler dispatches GET to it
_.do_POST  # gates.testserver: BaseHTTPRequestHandler dispatches POST to it
_.close_connection  # gates.testserver: BaseHTTPRequestHandler reads it after each request
_.daemon_threads  # gates.testserver: socketserver.ThreadingMixIn reads it
_.ignore_aliases  # cluster.k8s: yaml.SafeDumper calls it (no &anchors in the manifests)
_.option_string  # cli._Version.__call__: argparse.Action's signature, argparse passes it

# named constants that document a closed set beside the one the code reads
_.CHECKS  # cluster.preflight: the order of the preflight's checks, as its report lists them
_.SECTIONS  # gates.parsers.legacy_intranode: the sections of the legacy test's output, in order
_.BARS_UNMEASURED  # gates.spec: the other value of `bars-status` (BARS_MEASURED is the one compared)
