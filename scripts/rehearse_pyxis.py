"""The pyxis rehearsal with the REAL images (issue 37): the images `nox -s images` built, through the real enroot +
pyxis of tests/enrootpyxis.py (built from their pins), under the two-slurmd Slurm of .ci/slurm-up, with the GPU
stand-ins of tests/standins (a recording nvidia-container-cli, a stub libcuda). Run on the machine that holds the
images (CI cannot: building them takes ~20 min); the transcript is committed under results/rehearsal/.

    .venv/bin/python scripts/rehearse_pyxis.py --image deepep=ENGINE_REF [--image vllm=ENGINE_REF] \
        [--digest deepep] [--sqsh vllm] [--out results/rehearsal]

ENGINE_REF: the image on the Docker engine at $DOCKER_HOST (id or tag, e.g. the ids /work/wt/IMAGES.md or
out/build/images.json give). Each image is pushed to a registry on loopback (tests/registry.py) and read back by
its image digest; then, per image:
- `--digest NAME` (default: deepep): `srun -N2 --container-image=127.0.0.1:PORT/reprostack/NAME@sha256:...` (enroot
  4.x's digest form);
- `--sqsh NAME` (default: every other image): `enroot import` by digest to NAME.sqsh, then
  `srun -N2 --container-image=NAME.sqsh` (the enroot 3.x path: HyperPod's 3.4.1 has no digest form);
- in both: a probe inside the container on both nodes (its python, the image's NVIDIA_* variables, dlopen of
  libcuda.so.1 through the stub, reprostack importable from the image's own python), with the calls enroot's
  98-nvidia.sh made to the recording CLI;
- for the gate image (deepep): the rendered `reprostack launch slurm micro --nodes 2 --runtime pyxis --image REF`
  with its preflight step (the verdict: this host has no GPU and no EFA), then with `--no-preflight` and the GPU
  stand-in (`REPROSTACK_GPU_STANDIN`): the launch reaches the gate's ranks on both nodes; the first rank's first line
  is recorded.
Transcript: OUT/pyxis.json (everything above, plus enroot/pyxis/Slurm versions and pins) and OUT/pyxis.md (the same
in words), written atomically. Exit 0 when every step did what it should, 1 when one did not (the transcript says
which), 2 when the machine lacks enroot/pyxis/Slurm/a registry/an image (one line, nothing written).

Invariants: a stand-in is never evidence: the transcript says what was recorded and what was replayed; nothing in
it is typed by hand; the registry and every image tag this script made are removed at the end.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "tests"))
sys.path.insert(0, str(REPO / "src"))

import enrootpyxis  # noqa: E402
import registry as registry_mod  # noqa: E402

GATE_IMAGE = "deepep"  # the image gate micro's plan names
PROBE = r"""
import ctypes, json, os, shutil, subprocess, sys
row = {"node": os.environ.get("SLURM_NODEID"), "python": sys.executable, "path": os.environ.get("PATH"),
       "nvidia": {k: v for k, v in sorted(os.environ.items()) if k.startswith("NVIDIA_")}}
try:
    row["cuInit"] = ctypes.CDLL("libcuda.so.1").cuInit(0)
except OSError as e:
    row["cuInit"] = f"dlopen failed: {e}"
try:
    import reprostack
    row["reprostack"] = reprostack.__file__
except Exception as e:
    row["reprostack"] = f"{type(e).__name__}: {e}"
fi = shutil.which("fi_info")
row["nvcc"] = shutil.which("nvcc")
row["fi_info"] = fi and subprocess.run([fi, "--version"], capture_output=True, text=True).stdout.split("\n")[0]
print("PROBE " + json.dumps(row, sort_keys=True))
"""


def sh(cmd: list[str], *, env: dict | None = None, timeout: float = 1800, cwd: Path = REPO) -> dict:
    t0 = time.monotonic()
    p = subprocess.run(cmd, capture_output=True, text=True, env={**os.environ, **(env or {})}, timeout=timeout, cwd=cwd)
    return {
        "argv": cmd,
        "rc": p.returncode,
        "seconds": round(time.monotonic() - t0, 1),
        "stdout": p.stdout[-6000:],
        "stderr": p.stderr[-6000:],
    }


def versions() -> dict:
    rec = enrootpyxis.installed() or {}
    return {
        "enroot": sh(["enroot", "version"])["stdout"].strip(),
        "enroot_pin": rec.get("enroot"),
        "pyxis_pin": rec.get("pyxis"),
        "pyxis_so": rec.get("pyxis_so"),
        "slurm": sh(["srun", "--version"])["stdout"].strip(),
        "plugstack": Path(os.environ["SLURM_CONF"]).with_name("plugstack.conf").read_text().splitlines(),
        "enroot_conf": Path(rec["conf"]).read_text().splitlines() if rec.get("conf") else None,
    }


def push(client, reg, name: str, ref: str) -> str:
    """The engine's image `ref` pushed as 127.0.0.1:PORT/reprostack/NAME:rehearsal; its digest reference."""
    repo = f"{reg.host}/reprostack/{name}"
    img = client.images.get(ref)
    img.tag(repo, "rehearsal")
    errors = [e for e in client.images.push(repo, tag="rehearsal", stream=True, decode=True) if "error" in e]
    if errors:
        raise SystemExit(f"rehearse_pyxis: push of {name} failed: {errors[-1]}")
    digests = [d for d in client.images.get(f"{repo}:rehearsal").attrs["RepoDigests"] if d.startswith(repo + "@")]
    return digests[0]


def probe(image: str, record: Path) -> dict:
    r = sh(
        ["srun", "-N2", "--ntasks-per-node=1", f"--container-image={image}", "python3", "-c", PROBE],
        env={"RS_NVIDIA_RECORD": str(record)},
    )
    r["rows"] = sorted(
        (json.loads(line[6:]) for line in r["stdout"].splitlines() if line.startswith("PROBE ")),
        key=lambda x: str(x["node"]),
    )
    r["hook_calls"] = [json.loads(line) for line in record.read_text().splitlines()] if record.is_file() else []
    return r


def render(out: Path, *extra: str) -> Path:
    from reprostack import cli

    port = str(registry_mod._free_port())
    argv = ["launch", "slurm", "micro", "--nodes", "2", "--runtime", "pyxis", "--out", str(out), "--master-port", port]
    if cli.main([*argv, *extra]) != 0:
        raise SystemExit("rehearse_pyxis: `reprostack launch slurm micro` did not render")
    return out / "job.sbatch"


def job(script: Path, env: dict, timeout_s: float = 3600) -> dict:
    """sbatch the rendered script as it is (`--gpus-per-node=0`: these nodes have no GPUs to give); wait; its rc."""
    from test_rehearsal import job_end

    p = sh(["sbatch", "--parsable", "--gpus-per-node=0", str(script)], env=env, timeout=60)
    if p["rc"] != 0:
        return {"submit": p, "rc": None}
    jid = p["stdout"].strip().split(";")[0]
    t0 = time.monotonic()
    rc = job_end(jid, timeout_s)
    return {"job": jid, "rc": rc, "seconds": round(time.monotonic() - t0, 1)}


def launch(ref: str, work: Path) -> dict:
    """The rendered launch of gate micro by digest: with its preflight step, then without it and the GPU stand-in."""
    from reprostack.gates.standin import ENV

    res = {}
    out = work / "preflight"
    r = job(render(out, "--image", ref), {"RS_NVIDIA_RECORD": str(work / "nv-preflight.jsonl")})
    verdict = out / "preflight" / "verdict.json"
    v = json.loads(verdict.read_text()) if verdict.is_file() else None
    r["verdict"] = v and {k: v[k] for k in ("result", "nodes", "gate", "profile")}
    r["failures"] = v and [{k: f[k] for k in ("check", "node", "detail")} for f in v["failures"]]
    r["passed"] = v and sorted({c["check"] for c in v["checks"] if c["status"] == "pass"})
    r["log_tail"] = _tail(out / "logs", "preflight-node-*.log")
    res["preflight"] = r
    out = work / "gate"
    r = job(
        render(out, "--image", ref, "--no-preflight"),
        {ENV: "h200,rdzv=300", "RS_NVIDIA_RECORD": str(work / "nv-gate.jsonl")},
    )
    rank0 = out / "micro" / "test_ep.node0.log"
    r["first_rank_first_lines"] = rank0.read_text(errors="replace").splitlines()[:5] if rank0.is_file() else None
    rep = out / "micro.json"
    r["report"] = json.loads(rep.read_text()) if rep.is_file() else None
    r["report"] = r["report"] and {k: r["report"].get(k) for k in ("result", "evidence", "profile", "reason")}
    r["node_logs_tail"] = _tail(out / "logs", "node-*.log")
    res["gate"] = r
    return res


def _tail(d: Path, pattern: str) -> dict:
    return {p.name: p.read_text(errors="replace")[-1500:] for p in sorted(d.glob(pattern))} if d.is_dir() else {}


def sqsh_of(ref: str, work: Path, name: str) -> tuple[Path, dict]:
    """`enroot import` by digest in the form enroot 3.x parses (cluster.enroot.import_uri, what `launch slurm
    --enroot-import` renders)."""
    from reprostack.cluster.enroot import import_uri

    path = work / f"{name}.sqsh"
    r = sh(["enroot", "import", "-o", str(path), import_uri(ref)[0]], timeout=3600)
    r["bytes"] = path.stat().st_size if path.is_file() else None
    return path, r


def preconditions(images: dict[str, str]) -> str | None:
    why = enrootpyxis.why_not()
    if why:
        return why
    if not os.environ.get("SLURM_CONF") or "--container-image" not in sh(["srun", "--help"])["stdout"]:
        return 'no Slurm with pyxis: `eval "$(.ci/slurm-up)"` after tests/enrootpyxis.py install'
    if not os.path.lexists("/dev/gdrdrv"):
        return "/dev/gdrdrv is missing (the rendered steps mount it): as root, mknod -m 666 /dev/gdrdrv c 1 5"
    names = set(sh(["sinfo", "-h", "-N", "-o", "%N"])["stdout"].split())
    if len(names) < 2:
        return f"this Slurm has {len(names)} node name(s): the rehearsal needs two"
    return registry_mod.why_no_registry()


def rehearse(images: dict[str, str], digest: set[str], work: Path) -> dict:
    import docker

    client = docker.from_env(timeout=3600)
    reg = registry_mod.start_registry(work / "registry")
    rec: dict = {"kind": "pyxis-rehearsal", "versions": versions(), "images": {}}
    try:
        for name, ref in images.items():
            img = client.images.get(ref)
            row = {"engine_ref": ref, "image_id": img.id, "labels": img.labels or {}}
            row["config_env"] = [e for e in img.attrs["Config"].get("Env") or [] if e.startswith(("NVIDIA_", "PATH="))]
            t0 = time.monotonic()
            row["pushed"] = pushed = push(client, reg, name, ref)
            row["push_seconds"] = round(time.monotonic() - t0, 1)
            if name in digest:
                row["how"] = "srun --container-image=REGISTRY/REPO@sha256:DIGEST (enroot 4.x digest form)"
                row["probe"] = probe(pushed, work / f"nv-{name}.jsonl")
            else:
                sqsh, row["enroot_import"] = sqsh_of(pushed, work, name)
                row["how"] = "enroot import by digest to a .sqsh, srun --container-image=FILE.sqsh (enroot 3.x path)"
                row["probe"] = probe(str(sqsh), work / f"nv-{name}.jsonl")
            if name == GATE_IMAGE:
                row["launch"] = launch(pushed, work / "launch")
            rec["images"][name] = row
            for tag in [t for t in client.images.get(ref).tags if t.startswith(reg.host)]:
                client.images.remove(tag)
    finally:
        reg.stop()
    return rec


def verdicts(rec: dict) -> list[str]:
    """What did not do what it should, in words (empty: all did)."""
    bad = []
    for name, row in rec["images"].items():
        rows = row["probe"]["rows"]
        if [r["node"] for r in rows] != ["0", "1"]:
            bad.append(f"{name}: the probe did not run on both nodes (rc {row['probe']['rc']})")
        image_path = next((e[5:] for e in row["config_env"] if e.startswith("PATH=")), None)
        for r in rows:
            if image_path and r["path"] != image_path:
                bad.append(
                    f"{name} node {r['node']}: the image's PATH ({image_path}) is lost under pyxis, the container has "
                    f"{r['path']} (enroot starts a login shell; Debian's /etc/profile sets PATH anew)"
                )
        if rows and not row["probe"]["hook_calls"]:  # the container started, and the hook was never asked
            env = "set" if any(e.startswith("NVIDIA_VISIBLE_DEVICES=") for e in row["config_env"]) else "unset"
            bad.append(f"{name}: enroot's nvidia hook made no call (the image's NVIDIA_VISIBLE_DEVICES is {env})")
        gate = row.get("launch", {}).get("gate")
        if gate and not (gate.get("report") or {}).get("result") == "pass":
            bad.append(f"{name}: the rendered launch did not reach a stand-in PASS (rc {gate.get('rc')})")
    return bad


def markdown(rec: dict) -> str:
    v = rec["versions"]
    lines = [
        "# The pyxis rehearsal with the real images (scripts/rehearse_pyxis.py)",
        "",
        f"Written by scripts/rehearse_pyxis.py at project commit {rec['project_commit'][:12]}; GPU stand-ins, never "
        "evidence: the hook calls are what a real node's nvidia-container-cli would be asked; libcuda is a stub.",
        "",
        f"- enroot: {v['enroot']} (pin {v['enroot_pin']['original']}, {v['enroot_pin']['rev'][:12]})",
        f"- pyxis: pin {v['pyxis_pin']['original']} ({v['pyxis_pin']['rev'][:12]}), {v['pyxis_so']}",
        f"- Slurm: {v['slurm']}; plugstack: `{' / '.join(x for x in v['plugstack'] if not x.startswith('#'))}`",
        "",
    ]
    for name, row in rec["images"].items():
        lines += [
            f"## {name}",
            "",
            f"- image id {row['image_id']}, pushed as `{row['pushed']}`",
            f"- how: {row['how']}",
        ]
        lines += [f"- image env: `{e}`" for e in row["config_env"]]
        for r in row["probe"]["rows"]:
            lines.append(
                f"- node {r['node']}: PATH `{r['path']}`, python {r['python']}, nvcc {r['nvcc']}, reprostack "
                f"(in the image's python: {r['reprostack']}), dlopen libcuda.so.1 + cuInit -> {r['cuInit']}"
            )
        for c in row["probe"]["hook_calls"]:
            lines.append(f"- hook call on {c['slurmd_nodename']}: `nvidia-container-cli {' '.join(c['argv'])}`")
        if not row["probe"]["hook_calls"]:
            lines.append(
                "- hook call: none"
                + ("" if row["probe"]["rows"] else f" (no container started: probe rc {row['probe']['rc']})")
            )
        la = row.get("launch")
        if la:
            pf, g = la["preflight"], la["gate"]
            lines.append(
                f"- preflight (job rc {pf['rc']}): {pf['verdict']}; failed: "
                + ", ".join(sorted({f["check"] for f in pf["failures"] or []}))
            )
            lines.append(
                f"- gate launch (job rc {g['rc']}): {g['report'] and g['report']['result']}; first rank's first "
                f"line: `{(g['first_rank_first_lines'] or ['(none)'])[0]}`"
            )
        lines.append("")
    lines += ["## Problems", ""] + ([f"- {b}" for b in rec["problems"]] or ["- none"])
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="scripts/rehearse_pyxis.py", description=__doc__.split("\n\n")[0])
    ap.add_argument("--image", action="append", required=True, metavar="NAME=ENGINE_REF")
    ap.add_argument("--digest", action="append", default=None, metavar="NAME")
    ap.add_argument("--out", type=Path, default=REPO / "results" / "rehearsal")
    args = ap.parse_args(argv)
    bad = [i for i in args.image if not re.fullmatch(r"[a-z0-9-]+=\S+", i)]
    if bad:
        print(f"rehearse_pyxis: --image {bad[0]!r}: expected NAME=ENGINE_REF", file=sys.stderr)
        return 2
    images = dict(i.split("=", 1) for i in args.image)
    why = preconditions(images)
    if why:
        print(f"rehearse_pyxis: {why}", file=sys.stderr)
        return 2
    with tempfile.TemporaryDirectory(prefix="rs-rehearse-", dir="/tmp") as work:
        rec = rehearse(images, set(args.digest or [GATE_IMAGE]), Path(work))
    rec["project_commit"] = sh(["git", "rev-parse", "HEAD"])["stdout"].strip()
    rec["problems"] = verdicts(rec)
    args.out.mkdir(parents=True, exist_ok=True)
    from reprostack.atomicfile import write_text_atomic

    write_text_atomic(args.out / "pyxis.json", json.dumps(rec, indent=1, sort_keys=True) + "\n")
    write_text_atomic(args.out / "pyxis.md", markdown(rec))
    print(markdown(rec))
    return 1 if rec["problems"] else 0


if __name__ == "__main__":
    sys.exit(main())
