"""`reprostack lock images`: a real registry (Debian's docker-registry on 127.0.0.1) and a real push from the test
engine (tests/dockerd.py); the digest written into the lock must be the one the engine records in `RepoDigests`.
"""

from __future__ import annotations

import pytest

import dockerd
import registry as registry_mod
from reprostack import cli
from reprostack import lock as lockmod
from reprostack.lock import images as lockimages
from reprostack.errors import LockError
from lockfiles import lock_head

docker_client, test_base = dockerd.docker_client, dockerd.test_base  # session fixtures (tests/dockerd.py)
registry = registry_mod.registry  # session fixture (tests/registry.py)

REV, TREE = "a1" * 20, "b2" * 20


@pytest.fixture(scope="session")
def pushed(registry, docker_client, test_base):
    """(repo, tag, digest): the test base pushed as 127.0.0.1:PORT/reprostack-test/base:1, digest from RepoDigests."""
    repo, tag = f"{registry.host}/reprostack-test/base", "1"
    img = docker_client.images.get(test_base)
    assert img.tag(repo, tag)
    errors = [ev for ev in docker_client.images.push(repo, tag=tag, stream=True, decode=True) if "error" in ev]
    assert not errors, errors
    digests = [d for d in docker_client.images.get(f"{repo}:{tag}").attrs["RepoDigests"] if d.startswith(repo + "@")]
    assert len(digests) == 1, digests
    yield repo, tag, digests[0].split("@", 1)[1]
    docker_client.images.remove(f"{repo}:{tag}")


def _lock(tmp_path, repo: str, tag: str, digest_line: str = "") -> tuple:
    p = tmp_path / "upstreams.lock"
    p.write_text(
        lock_head(REV, TREE)
        + f"""\
  # the test base, resolved by `reprostack lock images`
  base:
    kind: image
    repo: {repo}
    tag: "{tag}"   # a tag, only where the digest comes from
{digest_line}  other:
    kind: wheel
    name: demo-pkg
    version: "1.0"
    files:
      - filename: demo_pkg-1.0-py3-none-any.whl
        sha256: {"c" * 64}
# footer comment
"""
    )
    return p


def test_fill_writes_the_engines_digest_then_check_passes(tmp_path, pushed, capsys, test_base):
    """The digest is the one the engine's push recorded in RepoDigests; the id is the pushed image's own id (the
    config digest the registry's manifest names), what a `docker load`ed copy has."""
    repo, tag, digest = pushed
    p = _lock(tmp_path, repo, tag)
    before = p.read_text()
    with pytest.raises(LockError, match=r"upstreams\.base: 'digest' is a required property"):
        lockmod.load(p)  # `lock check` refuses an unfilled image pin
    assert cli.main(["lock", "images", "--lock", str(p)]) == 0
    after = p.read_text()
    assert after == before.replace(
        "# a tag, only where the digest comes from\n",
        f"# a tag, only where the digest comes from\n    digest: {digest}\n    id: {test_base}\n",
    )
    pin = lockmod.load(p).get("base")
    assert isinstance(pin, lockmod.ImagePin) and pin.digest == digest and pin.ref == f"{repo}:{tag}@{digest}"
    assert pin.id == test_base
    capsys.readouterr()
    assert cli.main(["lock", "images", "--check", "--lock", str(p)]) == 0
    assert "1 image pin(s) match the registry" in capsys.readouterr().out
    assert cli.main(["lock", "images", "--lock", str(p)]) == 0  # idempotent
    assert p.read_text() == after
    assert cli.main(["lock", "check", "--lock", str(p)]) == 0


def test_fill_replaces_only_the_digest_line(tmp_path, pushed, test_base, capsys):
    repo, tag, digest = pushed
    stale = "sha256:" + "a" * 64
    p = _lock(tmp_path, repo, tag, f"    digest: {stale}  # stale: rewritten\n")
    before = p.read_text()
    assert cli.main(["lock", "images", "base", "--lock", str(p)]) == 0
    assert p.read_text() == before.replace(
        f"{stale}  # stale: rewritten\n", f"{digest}  # stale: rewritten\n    id: {test_base}\n"
    )
    # a stale id is rewritten in place, and `--check` names its line
    wrong = "sha256:" + "c" * 64
    p.write_text(p.read_text().replace(test_base, wrong))
    line = p.read_text().splitlines().index(f"    id: {wrong}") + 1
    capsys.readouterr()
    assert cli.main(["lock", "images", "--check", "--lock", str(p)]) == 2
    assert (
        f"{p}:{line}: upstreams.base.id: lock has {wrong}, the registry's linux/amd64 image of "
        f"{repo}@{digest} is {test_base}"
    ) in capsys.readouterr().err
    assert cli.main(["lock", "images", "--lock", str(p)]) == 0
    assert f"    id: {test_base}\n" in p.read_text() and wrong not in p.read_text()
    assert line == p.read_text().splitlines().index(f"    id: {test_base}") + 1


def test_check_names_file_line_and_pin_on_a_tampered_digest(tmp_path, pushed, capsys):
    repo, tag, digest = pushed
    bad = "sha256:" + "b" * 64
    p = _lock(tmp_path, repo, tag, f"    digest: {bad}\n")
    before = p.read_bytes()
    line = p.read_text().splitlines().index(f"    digest: {bad}") + 1
    capsys.readouterr()
    assert cli.main(["lock", "images", "--check", "--lock", str(p)]) == 2
    err = capsys.readouterr().err
    assert f"{p}:{line}: upstreams.base.digest: lock has {bad}, the registry serves {digest}" in err
    assert p.read_bytes() == before


def test_check_of_an_unfilled_pin_fails(tmp_path, pushed, capsys):
    repo, tag, digest = pushed
    p = _lock(tmp_path, repo, tag)
    capsys.readouterr()
    assert cli.main(["lock", "images", "--check", "--lock", str(p)]) == 2
    err = capsys.readouterr().err
    assert "upstreams.base: no digest pinned" in err and digest in err


def test_unknown_tag_is_an_error_naming_the_line_and_nothing_is_written(tmp_path, pushed, capsys):
    repo, _, _ = pushed
    p = _lock(tmp_path, repo, "no-such-tag", f"    digest: sha256:{'d' * 64}\n")
    before = p.read_bytes()
    line = p.read_text().splitlines().index('    tag: "no-such-tag"   # a tag, only where the digest comes from') + 1
    capsys.readouterr()
    assert cli.main(["lock", "images", "--lock", str(p)]) == 2
    err = capsys.readouterr().err
    assert f"{p}:{line}: upstreams.base.tag: {repo}:no-such-tag does not resolve" in err
    assert "404" in err
    assert p.read_bytes() == before
    unfilled = _lock(tmp_path, repo, "no-such-tag")
    before = unfilled.read_bytes()
    assert cli.main(["lock", "images", "--lock", str(unfilled)]) == 2
    assert unfilled.read_bytes() == before


def test_unreachable_registry_is_an_error(tmp_path, capsys):
    # port 1 (tcpmux): a privileged port nothing here listens on; a port freed by bind(0) could be handed to
    # another test's server before the request is made
    p = _lock(tmp_path, "127.0.0.1:1/x/y", "1")
    before = p.read_bytes()
    assert cli.main(["lock", "images", "--lock", str(p)]) == 2
    assert "upstreams.base.tag: 127.0.0.1:" in capsys.readouterr().err
    assert p.read_bytes() == before


def test_images_refuses_a_wheel_pin_and_schema_checks_the_digest(tmp_path, capsys):
    p = _lock(tmp_path, "127.0.0.1:1/x/y", "1")
    assert cli.main(["lock", "images", "other", "--lock", str(p)]) == 2
    assert "is kind wheel, `lock images` takes image pins" in capsys.readouterr().err
    bad = _lock(tmp_path, "127.0.0.1:1/x/y", "1", "    digest: sha256:XYZ\n")
    with pytest.raises(LockError, match=r"upstreams\.base\.digest"):
        lockmod.load(bad, allow_unfilled=True)


def test_registry_host_and_scheme():
    assert (
        lockimages.manifest_url("nvcr.io/nvidia/cuda", "13.0.0-devel-ubuntu22.04")
        == "https://nvcr.io/v2/nvidia/cuda/manifests/13.0.0-devel-ubuntu22.04"
    )
    assert lockimages.manifest_url("busybox", "1") == "https://registry-1.docker.io/v2/library/busybox/manifests/1"
    assert lockimages.manifest_url("localhost:5000/a/b", "t") == "http://localhost:5000/v2/a/b/manifests/t"
    assert lockimages.manifest_url("127.0.0.1:5000/a", "t") == "http://127.0.0.1:5000/v2/a/manifests/t"


def _project(tmp_path, repo: str, tag: str, base: str, digest_line: str = ""):
    root = tmp_path / "project"
    (root / "containers" / "fromlock").mkdir(parents=True)
    (root / "upstreams.lock").write_text(f"""\
lockfile-version: 1
upstreams:
  tb:
    kind: image
    repo: {repo}
    tag: "{tag}"
{digest_line}""")
    (root / "containers" / "fromlock" / "image.yaml").write_text(
        f"description: built on a lock image pin\nbase: {base}\n"
    )
    (root / "containers" / "fromlock" / "Dockerfile").write_text("FROM {{ from }}\nRUN echo ok > /fromlock\n")
    return root


def test_recipe_base_from_a_lock_image_pin_builds_on_the_pinned_digest(tmp_path, pushed, docker_client, test_base):
    """`base: lock:tb` takes repo:tag@digest from the lock (filled by `lock images`); the build runs FROM that
    digest, and a recipe naming a pin the lock does not have fails on its `base` line."""
    import io
    import uuid

    from rich.console import Console

    from reprostack.containers import BuildOptions, RecipeError, build_images

    repo, tag, digest = pushed
    root = _project(tmp_path, repo, tag, "lock:tb")
    assert cli.main(["lock", "images", "--lock", str(root / "upstreams.lock")]) == 0
    ns = f"rstest-{uuid.uuid4().hex[:10]}"

    def opts():
        return BuildOptions(
            root=root,
            lock=lockmod.load(root / "upstreams.lock"),
            out_dir=tmp_path / "out",
            namespace=ns,
            client=docker_client,
            base_overrides={},
            show_progress=False,
            console=Console(file=io.StringIO(), width=160),
        )

    try:
        (r,) = build_images(["fromlock"], opts())
        assert r.status == "built" and r.from_ref == test_base  # the image id that repo@digest names here
        assert r.labels["org.opencontainers.image.base.digest"] == digest
        assert r.labels["org.opencontainers.image.base.name"] == f"{repo}:{tag}@{digest}"
    finally:
        for img in docker_client.images.list(filters={"reference": f"{ns}/*"}):
            for t in img.tags:
                docker_client.images.remove(t, force=True)
    (root / "containers" / "fromlock" / "image.yaml").write_text("description: x\nbase: lock:nope\n")
    with pytest.raises(RecipeError) as ei:
        build_images(["fromlock"], opts())
    assert str(ei.value).startswith(f"{root}/containers/fromlock/image.yaml:2: base: 'lock:nope': ")
    assert "has no image pin 'nope' (image pins: tb)" in str(ei.value)


def test_an_index_pins_its_own_digest_and_the_linux_amd64_image_id(tmp_path, pushed, test_base, capsys):
    """A multi-platform tag (a manifest list, put into the real registry over its HTTP API): the pin's digest is the
    list's, its id the config digest of the linux/amd64 entry; a list without that platform is an error naming the
    tag line, nothing written."""
    import json
    import urllib.request

    repo, tag, digest = pushed
    host, name = repo.split("/", 1)

    def get(d):
        req = urllib.request.Request(
            f"http://{host}/v2/{name}/manifests/{d}",
            headers={"Accept": "application/vnd.docker.distribution.manifest.v2+json"},
        )
        with urllib.request.urlopen(req, timeout=10) as r:
            return r.read()

    def put_list(list_tag, platforms):
        body = json.dumps(
            {
                "schemaVersion": 2,
                "mediaType": "application/vnd.docker.distribution.manifest.list.v2+json",
                "manifests": [
                    {
                        "mediaType": "application/vnd.docker.distribution.manifest.v2+json",
                        "size": len(get(digest)),
                        "digest": digest,
                        "platform": {"architecture": arch, "os": "linux"},
                    }
                    for arch in platforms
                ],
            }
        )
        req = urllib.request.Request(
            f"http://{host}/v2/{name}/manifests/{list_tag}",
            data=body.encode(),
            method="PUT",
            headers={"Content-Type": "application/vnd.docker.distribution.manifest.list.v2+json"},
        )
        with urllib.request.urlopen(req, timeout=10) as r:
            return r.headers["Docker-Content-Digest"]

    list_digest = put_list("multi", ["arm64", "amd64"])
    assert list_digest != digest
    p = _lock(tmp_path, repo, "multi")
    assert cli.main(["lock", "images", "--lock", str(p)]) == 0
    pin = lockmod.load(p).get("base")
    assert (pin.digest, pin.id) == (list_digest, test_base)
    put_list("armonly", ["arm64"])
    (tmp_path / "q").mkdir()
    q = _lock(tmp_path / "q", repo, "armonly")
    before = q.read_bytes()
    capsys.readouterr()
    assert cli.main(["lock", "images", "--lock", str(q)]) == 2
    err = capsys.readouterr().err
    assert "upstreams.base.tag: " in err and "the index has no linux/amd64 manifest" in err
    assert q.read_bytes() == before


@pytest.mark.parametrize(
    "repo, want",
    [
        ("docker.io/nvidia/cuda", ("registry-1.docker.io", "nvidia/cuda")),  # the lock's CUDA pins
        ("index.docker.io/nvidia/cuda", ("registry-1.docker.io", "nvidia/cuda")),
        ("nvidia/cuda", ("registry-1.docker.io", "nvidia/cuda")),
        ("docker.io/ubuntu", ("registry-1.docker.io", "library/ubuntu")),
        ("ubuntu", ("registry-1.docker.io", "library/ubuntu")),
        ("nvcr.io/nvidia/cuda", ("nvcr.io", "nvidia/cuda")),
        ("127.0.0.1:5000/reprostack-test/base", ("127.0.0.1:5000", "reprostack-test/base")),
    ],
)
def test_registry_host_of_a_repo(repo, want):
    """docker.io serves no registry API: Docker Hub's names go to registry-1.docker.io (the CUDA pins asked
    https://docker.io/v2/... before)."""
    from reprostack.lock import split_repo
    from reprostack.lock.images import manifest_url

    assert split_repo(repo) == want
    assert manifest_url("docker.io/nvidia/cuda", "13.0.0-devel-ubuntu22.04").startswith(
        "https://registry-1.docker.io/v2/nvidia/cuda/manifests/"
    )
