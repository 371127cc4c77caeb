"""Fuzzing every reader of an untrusted file: each one, fed >= 1000 deterministic mutations of the real committed
files, either loads or raises a ReprostackError subclass (the CLI's one-line exit 2), never another exception.
The fast tier (`nox -s tests`) feeds each reader the first REPROSTACK_FUZZ_CASES of the same seeded sequence (the
lock's 1000 alone took 152 s of its 308 on the 2-core machine); every other run, `.ci/run` included, all 1000.

Mutations (seeded, so a failure names a reproducible case): byte flips, truncations, line deletions and
duplications, value type swaps, deep nesting, alias bombs, huge numbers, NaN/Infinity, unicode and control
characters, invalid UTF-8, an empty file, binary noise. The module also checks the billion-laughs and deep-nesting
cases by themselves (bounded, one located line) and a sample of mutated inputs through `cli.main` (exit 2, one
stderr line).
"""

from __future__ import annotations

import os
import random
import re
import shutil
from pathlib import Path

import pytest

from reprostack import cli
from reprostack import lock as lockmod
from reprostack.containers.recipe import load_recipe as load_image_recipe
from reprostack.errors import ReprostackError
from reprostack.evidence.attest.keys import read_entry as read_key_entry
from reprostack.gates.fabric_spec import SPEC_STEM, load_fabric_spec
from reprostack.gates.spec import load_spec
from reprostack.kernels.recipe import load_recipe as load_kernel_recipe
from reprostack.evidence.verify import load_claims, parse_export
from reprostack.gates.parsers.aiperf import EXPORT_JSON, EXPORT_JSONL, check_records, parse_records

ROOT = Path(__file__).resolve().parents[1]
PUB = ROOT / "tests" / "fixtures" / "published-2026-07"
N = int(os.environ.get("REPROSTACK_FUZZ_CASES") or 1000)  # mutated inputs per reader (the seeded sequence's first N)

# A billion laughs: 9 levels of 9 aliases, 9**9 = 387,420,489 leaves when expanded.
BILLION_LAUGHS = "a: &a [lol, lol, lol, lol, lol, lol, lol, lol, lol]\n" + "".join(
    f"{c}: &{c} [{', '.join(['*' + p] * 9)}]\n" for p, c in zip("abcdefgh", "bcdefghi")
)
YAML_VALUES = (
    "[]",
    "{}",
    "null",
    "~",
    "0",
    "-1",
    "1.5",
    "true",
    "'x'",
    "[1, [2, {a: b}]]",
    "{a: [1]}",
    ".nan",
    ".inf",
    "-.inf",
    "9" * 5000,
    "1e999",
    "2026-13-45",
    "2026-07-07",
    "!!binary AAAA",
    "!!int x",
    "!!python/object/apply:os.system [true]",
    "!!set {a, b}",
    "&x [1]",
    "*nope",
    "<<: *x",
    "'\u202e\U0001f600'",
    '"\\ud800"',
    "|\n  block",
    '"\\0"',
    "[" * 400 + "]" * 400,
    "{a: " * 300 + "1" + "}" * 300,
)
JSON_VALUES = (
    "[]",
    "{}",
    "null",
    "0",
    "-1",
    "1.5",
    "true",
    '"x"',
    "NaN",
    "Infinity",
    "-Infinity",
    "1e999",
    "9" * 5000,
    "-0",
    "[1, [2]]",
    '{"a": 1}',
    '"\\ud800"',
    '"\u202e"',
    "[" * 3000 + "]" * 3000,
    '{"a":' * 3000 + "1" + "}" * 3000,
    "1" + "0" * 400,
    '"' + "x" * 10000 + '"',
)


def _deep_yaml(n: int) -> bytes:
    return ("k: " + "[" * n + "]" * n + "\n").encode()


def mutate(data: bytes, rng: random.Random, kind: str) -> bytes:
    """One mutated variant of `data` (a YAML or JSON/JSONL file's bytes); `kind` is 'yaml' or 'json'."""
    lines = data.splitlines(keepends=True) or [b""]
    op = rng.randrange(16)
    if op == 0:  # byte flips
        b = bytearray(data)
        for _ in range(rng.randint(1, 8)):
            if b:
                b[rng.randrange(len(b))] = rng.randrange(256)
        return bytes(b)
    if op == 1:  # truncation
        return data[: rng.randrange(len(data) + 1)]
    if op == 2:  # line deletion
        del lines[rng.randrange(len(lines))]
        return b"".join(lines)
    if op == 3:  # line duplication
        i = rng.randrange(len(lines))
        lines.insert(i, lines[i])
        return b"".join(lines)
    if op in (4, 5, 6):  # type swap of a value
        i = rng.randrange(len(lines))
        line = lines[i].decode("utf-8", "replace")
        sep = ": "
        if sep in line:
            head = line.split(sep, 1)[0]
            values = YAML_VALUES if kind == "yaml" else JSON_VALUES
            tail = "," if kind == "json" and line.rstrip().endswith(",") else ""
            lines[i] = f"{head}{sep}{rng.choice(values)}{tail}\n".encode()
        elif kind == "json":  # a JSONL record: swap one "key": value inside the line
            cut = [j for j in range(len(line)) if line.startswith('": ', j) or line.startswith('":', j)]
            if cut:
                j = rng.choice(cut) + 2
                end = min((k for k in (line.find(",", j), line.find("}", j)) if k > 0), default=len(line))
                lines[i] = (line[:j] + rng.choice(JSON_VALUES) + line[end:]).encode()
        return b"".join(lines)
    if op == 7:  # deep nesting
        if kind == "yaml":
            return _deep_yaml(rng.choice((100, 1000, 20000)))
        n = rng.choice((100, 1000, 100000))
        return b"[" * n + b"]" * n
    if op == 8:  # alias bomb (YAML) / a huge number (JSON)
        if kind == "yaml":
            return (
                BILLION_LAUGHS.encode()
                if rng.random() < 0.5
                else data + b"\nzz: " + BILLION_LAUGHS.split("\n")[-2].split(": ", 1)[1].encode() + b"\n"
            )
        return data.replace(b"40", b"4" + b"0" * 5000, 1)
    if op == 9:  # NaN / Infinity in place of a number
        word = rng.choice((b".nan", b".inf") if kind == "yaml" else (b"NaN", b"Infinity", b"-Infinity", b"1e999"))
        for digit in (b"0", b"1", b"2", b"5", b"8"):
            j = data.find(digit, rng.randrange(len(data) + 1))
            if j > 0:
                return data[:j] + word + data[j + 1 :]
        return data + word
    if op == 10:  # unicode and control characters
        ch = rng.choice(("\u202e", "\U0001f600", "\x00", "\x07", "\x1b", "\ufeff", "\u2028", "\x85", "é", "\t"))
        j = rng.randrange(len(data) + 1)
        return data[:j] + ch.encode() + data[j:]
    if op == 11:  # invalid UTF-8
        j = rng.randrange(len(data) + 1)
        return data[:j] + rng.choice((b"\xff", b"\xed\xa0\x80", b"\xc3", b"\xfe\xff")) + data[j:]
    if op == 12:  # empty or whitespace
        return rng.choice((b"", b"\n", b"   \n", b"null\n", b"[]\n", b"{}\n", b"---\n---\n"))
    if op == 13:  # binary noise
        return bytes(rng.randrange(256) for _ in range(rng.randint(1, 300)))
    if op == 14:  # a document of another shape
        return rng.choice(
            (
                b"- a\n- b\n",
                b"42\n",
                b"'str'\n",
                b"[1, 2]\n",
                b'"x"\n',
                b'{"a": [1, 2]}\n',
                b"key: value\n",
                b"!!python/object:os.system x\n",
            )
        )
    # a block of lines moved
    i, j = sorted(rng.randrange(len(lines) + 1) for _ in range(2))
    block = lines[i:j]
    del lines[i:j]
    k = rng.randrange(len(lines) + 1)
    lines[k:k] = block
    return b"".join(lines)


def _stage(tmp: Path) -> Path:
    """A project root with copies of the committed content: mutations are written into it, never into the repo.
    `trimmed/upstreams.lock` is the real lock without its two largest wheelset pins (1,350 of its 1,600 lines;
    every kind of pin stays): most lock mutations go there, so the test stays well under a minute."""
    root = tmp / "root"
    for name in ("gates", "containers", "kernels", "claims", "patches"):
        shutil.copytree(ROOT / name, root / name)
    shutil.copy(ROOT / "upstreams.lock", root / "upstreams.lock")
    text = (ROOT / "upstreams.lock").read_text()
    (root / "trimmed").mkdir()
    (root / "trimmed" / "upstreams.lock").write_text(text[: text.index("\n  vllm-wheels-cp311:\n") + 1])
    for cell in sorted(PUB.glob("*/c*")):
        shutil.copytree(cell, root / "aiperf" / cell.parent.name / cell.name)
    shutil.copytree(ROOT / "keys", root / "keys")
    _signed_run(root / "signed", root / "keys")
    from reprostack import evidence
    from reprostack.evidence.attest import log

    log.append(root, root / "signed", evidence.Keyring.read(root / "keys"))
    return root


def _attestation_log(root: Path) -> None:
    """What verify-report does with results/attestations.jsonl: log.check, whose problems are lines."""
    from reprostack.evidence.attest import log

    problems, _ = log.check(root, root / log.LOG)
    if problems:
        raise ReprostackError(problems[0])


def _signed_run(folder: Path, ring: Path) -> None:
    """A run folder signed with a key whose public half is added to the staged keyring (reprostack.evidence)."""
    import json

    from reprostack import evidence
    from reprostack.evidence.attest.keys import entry_name

    (folder / "micro").mkdir(parents=True)
    (folder / "micro.json").write_text('{"gate": "micro"}\n')
    (folder / "micro" / "test_ep.log").write_text("D+C 14.41 us\n")
    signer = evidence.new_key(folder.parent / "fuzz.pem")
    entry = evidence.public_entry(signer, "fuzz")
    (ring / entry_name(entry)).write_text(json.dumps(entry))
    host = {"gpus": [], "identity": {}}
    pred = evidence.run_predicate(
        kind="gate",
        argv=["reprostack", "gate", "micro"],
        verdict="pass",
        project={"commit": None, "dirty": None},
        host=host,
        started="2026-12-06T00:00:00Z",
        ended="2026-12-06T00:00:01Z",
    )
    evidence.attest_folder(folder, pred, signer)


def _attestation(root: Path) -> None:
    """What verify-report does with a run folder's attestation: check_folder, whose problems are lines (it raises
    nothing); a ReprostackError stands for a problem here so the fuzz counts a traceback only."""
    from reprostack import evidence
    from reprostack.errors import ReprostackError

    c = evidence.check_folder(root / "signed", evidence.Keyring.read(root / "keys"))
    if c.problems:
        raise ReprostackError(c.problems[0])


def _gate_loader(stem: str):
    """The spec's own loader, as every caller gets it: through the gate registry."""
    from reprostack.gates import registry

    return registry.BY_STEM[stem].load


def _aiperf(path: Path):
    """What `reprostack verify` reads of one cell: the export, the records, and one against the other."""
    agg, raw = path.with_name(EXPORT_JSON), path.with_name(EXPORT_JSONL)
    if agg.is_file() and raw.is_file():
        check_records(agg, raw)  # parse_export and read_records (what parse_records counts) of both
    else:
        parse_export(agg)


def readers(root: Path) -> dict[str, list[tuple[Path, object]]]:
    """Reader name -> [(the file a mutation replaces, a call that reads it)], all from the committed files; a
    reader's mutations go round-robin over its list."""
    cells = sorted((root / "aiperf").glob("*/c*"))
    lock, trimmed = root / "upstreams.lock", root / "trimmed" / "upstreams.lock"
    return {
        "lock": [(lock, lambda: lockmod.load(lock, root=root))]
        + [(trimmed, lambda: lockmod.load(trimmed, root=root))] * 4,
        "gate spec": [
            (p, (lambda f: lambda: f(root))(_gate_loader(p.stem)))
            for p in sorted((root / "gates").glob("*.yaml"))
            if p.stem != SPEC_STEM  # its own reader below
        ],
        "fabric spec": [(root / "gates" / f"{SPEC_STEM}.yaml", lambda: load_fabric_spec(root))],
        "claims": [(root / "claims" / "published.yaml", lambda: load_claims(root / "claims" / "published.yaml"))],
        "image.yaml": [
            (p, (lambda n: lambda: load_image_recipe(root, n))(p.parent.name))
            for p in sorted((root / "containers").glob("*/image.yaml"))
        ],
        "kernel recipe": [
            (p, (lambda n: lambda: load_kernel_recipe(root, n))(p.stem))
            for p in sorted((root / "kernels").glob("*.yaml"))
        ],
        "aiperf export": [(c / EXPORT_JSON, (lambda f: lambda: _aiperf(f))(c / EXPORT_JSON)) for c in cells],
        "attestation": [(root / "signed" / "run.intoto.jsonl", lambda: _attestation(root))],
        "attestation log": [(root / "results" / "attestations.jsonl", lambda: _attestation_log(root))],
        "keyring entry": [
            (p, (lambda f: lambda: read_key_entry(f))(p)) for p in sorted((root / "keys").glob("*.pub.json"))
        ],
        "aiperf records": [
            (c / EXPORT_JSONL, (lambda f: lambda: _aiperf(f))(c / EXPORT_JSONL))
            for c in cells
            if (c / EXPORT_JSONL).is_file()
        ],
    }


def run_reader(name: str, targets, n: int = N, seed: int = 14) -> list[str]:
    """Feed `n` mutations to one reader; return the cases that raised anything but a ReprostackError."""
    rng = random.Random(f"{seed}-{name}")
    kind = "json" if name.startswith(("aiperf", "attestation", "keyring")) else "yaml"
    bad = []
    originals = {p: p.read_bytes() for p, _ in targets}
    try:
        for i in range(n):
            target, call = targets[i % len(targets)]
            target.write_bytes(mutate(originals[target], rng, kind))
            try:
                call()
            except ReprostackError:
                pass
            except Exception as e:  # noqa: BLE001 - the point is to catch everything else
                bad.append(f"{name} #{i} ({target.relative_to(target.parents[1])}): {type(e).__name__}: {str(e)[:120]}")
            finally:
                target.write_bytes(originals[target])
    finally:
        for p, data in originals.items():
            p.write_bytes(data)
    return bad


@pytest.fixture(scope="module")
def staged(tmp_path_factory):
    return _stage(tmp_path_factory.mktemp("fuzz"))


@pytest.mark.parametrize(
    "name",
    [
        "lock",
        "gate spec",
        "fabric spec",
        "claims",
        "image.yaml",
        "kernel recipe",
        "aiperf export",
        "aiperf records",
        "attestation",
        "attestation log",
        "keyring entry",
    ],
)
def test_fuzz_reader_never_tracebacks(name, staged):
    bad = run_reader(name, readers(staged)[name])
    assert not bad, f"{len(bad)}/{N} mutated inputs escaped as non-ReprostackError:\n" + "\n".join(bad[:20])


def test_unmutated_files_load(staged):
    for name, targets in readers(staged).items():
        for _, call in targets:
            call()


def test_billion_laughs_is_one_located_line(staged, tmp_path):
    p = tmp_path / "upstreams.lock"
    p.write_text("lockfile-version: 1\nupstreams: {}\n" + BILLION_LAUGHS)
    with pytest.raises(ReprostackError) as ei:
        lockmod.load(p, root=staged)
    assert str(ei.value) == (
        f"{p}:4: (yaml): alias *a names a sequence: only aliases of scalars are allowed (an "
        f"alias of a collection can expand exponentially)"
    )
    claims = tmp_path / "claims.yaml"
    claims.write_text(BILLION_LAUGHS)
    with pytest.raises(ReprostackError, match=r"claims\.yaml:2: \(yaml\): alias \*a names a sequence"):
        load_claims(claims)


@pytest.mark.parametrize("depth", [65, 1000, 100_000])
def test_deep_nesting_is_one_located_line(depth, tmp_path):
    claims = tmp_path / "claims.yaml"
    claims.write_text("schema: 1\nclaims:\n  - " + "[" * depth + "]" * depth + "\n")
    with pytest.raises(ReprostackError, match=r"claims\.yaml:3: \(yaml\): nested deeper than 64 levels"):
        load_claims(claims)
    agg = tmp_path / EXPORT_JSON
    agg.write_text('{"a": ' + "[" * depth + "]" * depth + "}")
    with pytest.raises(ReprostackError, match=rf"{EXPORT_JSON}: nested deeper than 32 levels"):
        parse_export(agg)


def test_an_alias_of_a_scalar_still_loads(staged):
    assert "*nvl4" in (staged / "gates" / "micro.yaml").read_text()  # the one alias our files use
    load_spec(staged, "micro")


def test_bad_inputs_through_the_cli_exit_2_with_one_line(staged, tmp_path, capsys):
    """A sample of the mutated locks and claims files through `reprostack lock` and `reprostack verify`."""
    rng = random.Random("14-cli")
    lock, claims = staged / "upstreams.lock", staged / "claims" / "published.yaml"
    original = {p: p.read_bytes() for p in (lock, claims)}
    seen_2 = 0
    try:
        for i in range(40):
            p = (lock, claims)[i % 2]
            p.write_bytes(mutate(original[p], rng, "yaml"))
            argv = (
                ["lock", "--lock", str(lock), "check"]
                if p == lock
                else ["verify", str(PUB), "--claims", str(claims), "--out", str(tmp_path / "out")]
            )
            try:
                (lockmod.load if p == lock else load_claims)(p)
                valid = True
            except ReprostackError:
                valid = False
            rc = cli.main(argv)
            err = capsys.readouterr().err
            assert "Traceback" not in err and "internal error" not in err, (i, err)
            if not valid:
                assert rc == 2 and err.count("\n") == 1 and err.startswith("reprostack: error: "), (i, err)
                seen_2 += 1
            p.write_bytes(original[p])
    finally:
        for p, data in original.items():
            p.write_bytes(data)
    assert seen_2 >= 25  # most mutations are refused: the sample exercises the error path


@pytest.mark.parametrize(
    "text,message",
    [
        ("# " + "x" * (4 << 20), r": \(file\): more than the 4194304 bytes a YAML file here may have"),
        ("[" + "1," * 100_001 + "]", r":1: \(yaml\): more than 100000 nodes"),
        ("a: &a x\nb: [" + ", ".join(["*a"] * 1001) + "]\n", r":2: \(yaml\): more than 1000 aliases"),
        (
            "lockfile-version: 1\nb: &b {k: v}\nc: *b\n",
            r":3: \(yaml\): alias \*b names a mapping: only aliases of scalars",
        ),
        ("lockfile-version: .nan\n", r":1: \(yaml\): '\.nan' is not a finite number"),
        ("lockfile-version: -.inf\n", r":1: \(yaml\): '-\.inf' is not a finite number"),
        (
            "lockfile-version: 2026-13-45\n",
            r":1: \(yaml\): cannot read '2026-13-45' as timestamp: month must be in 1\.\.12",
        ),
        (
            "lockfile-version: " + "9" * 5000 + "\n",
            r":1: \(yaml\): cannot read '9{30}\.\.\.' as int: Exceeds the limit",
        ),
        ("lockfile-version: 1\nx: a\x07\n", r":2: \(yaml\): character '\\x07' is not allowed in YAML"),
        ("!!python/object/apply:os.system [true]\n", r":1: \(yaml\): could not determine a constructor for the tag"),
        ("? [1]\n: 2\n", r":1: \(yaml\): found unhashable key"),
        ("", r":1: \(file\): empty file"),
        (b"lockfile-version: 1\nx: \xff\n", r":2: \(file\): not UTF-8 \(byte 0xff at offset 23\)"),
    ],
)
def test_yaml_bounds_are_one_located_line(text, message, tmp_path, staged):
    p = tmp_path / "upstreams.lock"
    p.write_bytes(text if isinstance(text, bytes) else text.encode())
    with pytest.raises(ReprostackError) as ei:
        lockmod.load(p, root=staged)
    assert re.match(re.escape(str(p)) + message, str(ei.value)), str(ei.value)
    assert "\n" not in str(ei.value)


@pytest.mark.parametrize(
    "text,message",
    [
        ('{"schema_version": "1.3", "x": {"unit": "ms", "avg": NaN}}', r": NaN is not a number a JSON export may hold"),
        ('{"a": -Infinity}', r": -Infinity is not a number"),
        ('{"a": 1e999}', r": inf is not a finite number"),
        ('{"a": ' + "1" * 60 + "}", r": an integer of 60 digits \(more than 40\)"),
        ('{"a": ' + "1" * 5000 + "}", r": Exceeds the limit \(4300 digits\)"),
        ("[1, 2]", r": top level is an array, expected an object"),
        ('{\n"a": 1,\n}', r":3: not JSON: Expecting property name enclosed in double quotes"),
        (b'{"a": "\xff"}', r":1: not UTF-8 \(byte 0xff at offset 7\)"),
        (
            '{"schema_version": "1.3", "error_summary": {"x": 1}, "m": {"unit": "ms", "avg": 1}}',
            r": error_summary is an object, expected a list",
        ),
        (
            '{"schema_version": "1.3", "was_cancelled": "no", "m": {"unit": "ms", "avg": 1}}',
            r": was_cancelled is a string, expected true or false",
        ),
        (
            '{"execution_metadata": "x", "m": {"unit": "ms", "avg": 1}}',
            r": execution_metadata is a string, expected an object",
        ),
    ],
)
def test_json_bounds_are_one_line_naming_the_file(text, message, tmp_path):
    p = tmp_path / EXPORT_JSON
    p.write_bytes(text if isinstance(text, bytes) else text.encode())
    with pytest.raises(ReprostackError) as ei:
        parse_export(p)
    assert re.match(re.escape(str(p)) + message, str(ei.value)), str(ei.value)


@pytest.mark.parametrize(
    "line,message",
    [
        ("[1]", r":3: top level is an array, expected an object"),
        ('{"metadata": 5}', r":3: a record must be an object with 'metadata' and 'metrics' objects"),
        ('{"metadata": {"was_cancelled": 1}}', r":3: metadata\.was_cancelled is a number, expected true or false"),
        ('{"metadata": {"request_start_ns": "x"}}', r":3: metadata\.request_start_ns is a string, expected an integer"),
        (
            '{"metadata": {}, "metrics": {"ttft": {"value": "x", "unit": "ms"}}}',
            r":3: metrics\.ttft\.value is a string with unit 'ms', expected a number and a unit",
        ),
        ('{"metadata": {}, "metrics": {"ttft": 5}}', r":3: metrics\.ttft must be an object with a 'value'"),
        ('{"metadata": {"x": ' + "[" * 40 + "]" * 40 + "}}", r":3: nested deeper than 32 levels"),
        ('{"metadata": {"x": NaN}}', r":3: NaN is not a number"),
        ("{" + "x" * 100, r":3: not JSON: "),
        ('{"metadata": {}, "pad": "' + "x" * (4 << 20) + '"}', r":3: a record of more than 4194304 bytes"),
    ],
)
def test_jsonl_bounds_name_the_record_line(line, message, tmp_path):
    real = (PUB / "trtllm-shim" / "c4" / EXPORT_JSONL).read_text().splitlines()
    p = tmp_path / EXPORT_JSONL
    p.write_text("\n".join(real[:2] + [line] + real[2:4]) + "\n")
    with pytest.raises(ReprostackError) as ei:
        parse_records(p)
    assert re.match(re.escape(str(p)) + message, str(ei.value)), str(ei.value)


# --------------------------------------------------------------------------- nccl-tests output (gate 0, fabric)


def test_fuzz_nccl_tests_output_never_raises():
    """gates.parsers.nccl_tests on N mutations of real output (the pinned binaries run here, the p5en NCCL INFO log)
    and of a table printed with v2.19.6's formats: every one parses (problems named), none raises anything."""
    from nccltestsout import GIB, header, info, table

    from reprostack.gates.parsers.nccl_tests import parse_nccl_tests

    fix = ROOT / "tests" / "fixtures" / "nccl-tests" / "cpu-no-gpu"
    p5en = (PUB / "trtllm-shim" / "serve_log_head.log").read_bytes().splitlines(keepends=True)
    seeds = [
        (fix / "all_reduce_perf.log").read_bytes(),
        (fix / "alltoall_perf.log").read_bytes(),
        b"".join(p5en[700:1200] + p5en[1740:1800]),
        (
            header(ranks=(("a", 1, 0), ("b", 2, 0)))
            + info("a", 1, 0, "Channel 00/0 : 0[0] -> 1[0] [send] via NET/Libfabric/0/GDRDMA")
            + "\n"
            + info("a", 1, 0, "NET/OFI Selected provider is efa, fabric is efa-direct (found 16 nics)")
            + "\n"
            + table([8 << i for i in range(28)], lambda s, c: 40.0 + s / GIB, cycles=2, nranks=2)
        ).encode(),
    ]
    rng = random.Random("14-nccl-tests")
    bad = []
    for i in range(N):
        data = mutate(seeds[i % len(seeds)], rng, "yaml")
        try:
            p = parse_nccl_tests(data.decode("utf-8", "replace"))
            assert len(p.problems) <= 51 and all(len(x) <= 300 for x in p.problems)
        except Exception as e:  # noqa: BLE001 - the point is to catch everything
            bad.append(f"#{i}: {type(e).__name__}: {str(e)[:120]}")
    assert not bad, f"{len(bad)}/{N} mutated outputs raised:\n" + "\n".join(bad[:20])


def test_fuzz_the_mpi_launchs_files_never_raise(tmp_path):
    """gates.fabric_mpi.read_launched on N mutations of what the rendered sbatch / MPIJob leave (<test>.rc `RC RUN_ID`,
    <test>.log): never raises; an rc it cannot read as `integer run-id` of this run is None (the test's ERROR)."""
    from reprostack.gates import fabric_mpi
    from reprostack.gates.fabric import FabricGate
    from reprostack.gates.fabric_spec import load_fabric_spec

    spec = load_fabric_spec(ROOT)
    launch = FabricGate("fabric").launcher.mpi_launch(spec, spec.profile("p5en-efa-ep16"))
    rng = random.Random("37-mpi-logs")
    bad = []
    for i in range(N):
        for s in launch.steps:
            name = s.test
            (tmp_path / f"{name}.rc").write_bytes(mutate(b"0 4242\n", rng, "yaml"))
            (tmp_path / f"{name}.log").write_bytes(mutate(b"# nccl-tests version 2.19.6\n", rng, "yaml"))
        try:
            ran, text, _ = fabric_mpi.read_launched(tmp_path, launch, "4242")
            assert all(r["returncode"] is None or isinstance(r["returncode"], int) for r in ran.values())
            assert all(r["returncode"] is not None or r["why"] for r in ran.values())
        except Exception as e:  # noqa: BLE001 - the point is to catch everything
            bad.append(f"#{i}: {type(e).__name__}: {str(e)[:120]}")
    assert not bad, f"{len(bad)}/{N} mutated launch files raised:\n" + "\n".join(bad[:20])


# --------------------------------------------------------------------------- kernel cache entries (issue 41)


def test_fuzz_kernel_cache_entry_never_tracebacks(tmp_path):
    """kernels.cache.pull_into (the envelope, its signed statement and manifest, the files it names) on N mutations
    of a real signed entry in a folder store: half the envelope's bytes mutated, half the statement mutated and
    then signed again with the TRUSTED key (a hostile signer: only the manifest checks stand between it and the
    node). Each is a hit, a miss or a ReprostackError (Refused / StoreError); never another exception, never a file
    outside the pull's folder."""
    import base64
    import json

    from securesystemslib.dsse import Envelope

    from reprostack import evidence
    from reprostack.evidence.attest import keys as keysmod
    from reprostack.kernels import build
    from reprostack.kernels import cache as kcache

    def make(tmp, log):
        (tmp / "site" / "deep_ep").mkdir(parents=True)
        (tmp / "site" / "deep_ep" / "_C.so").write_bytes(b"\x7fELF" + bytes(range(256)))
        (tmp / "site" / "deep_ep" / "__init__.py").write_text("")
        return {"site": "site"}

    fields = {"component": "deepep", "tree": "e" * 40, "toolchain": {"arch": "90", "nvcc_version": "13.0"}}
    b = build.reuse_or_build(tmp_path / "cache", "deepep", fields, make)
    signer = evidence.new_key(tmp_path / "key.pem")
    ring = tmp_path / "keys"
    ring.mkdir()
    entry = evidence.public_entry(signer, "fuzz")
    (ring / keysmod.entry_name(entry)).write_text(json.dumps(entry))
    store = tmp_path / "store"
    kcache.push(b.out, str(store), tmp_path / "key.pem")
    env_file = store / b.key / "envelope.json"
    original = env_file.read_bytes()
    statement = base64.b64decode(json.loads(original)["payload"])
    rng = random.Random("14-kernel-cache")
    bad, outcomes = [], {"hit": 0, "refused": 0}
    for i in range(N):
        if i % 2:
            data = mutate(original, rng, "json")
        else:
            env = Envelope(mutate(statement, rng, "json"), evidence.PAYLOAD_TYPE, {})
            env.sign(signer)
            data = json.dumps(env.to_dict()).encode()
        env_file.write_bytes(data)
        dest = tmp_path / "dest" / str(i)
        dest.mkdir(parents=True)
        try:
            got = kcache.pull_into(str(store), b.key, "deepep", dest, keyring=ring, arch="90")
            outcomes["hit" if got else "miss"] = outcomes.get("hit" if got else "miss", 0) + 1
        except ReprostackError:
            outcomes["refused"] += 1
            if any(dest.iterdir()):
                bad.append(f"#{i}: refused but left files in the pull's folder")
        except Exception as e:  # noqa: BLE001 - the point is to catch everything else
            bad.append(f"#{i}: {type(e).__name__}: {str(e)[:120]}")
        shutil.rmtree(dest)
    escaped = [p for p in tmp_path.rglob("*") if p.is_file() and not p.is_relative_to(tmp_path / "cache")]
    escaped = [p for p in escaped if not any(p.is_relative_to(tmp_path / d) for d in ("store", "keys", "dest"))]
    assert not bad, f"{len(bad)}/{N} mutated entries escaped:\n" + "\n".join(bad[:20])
    assert [p.name for p in escaped] == ["key.pem"] and outcomes["refused"] > N // 2, outcomes
