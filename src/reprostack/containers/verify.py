"""Check what is inside a built image without running anything in it.

`tree_in_image` copies a folder out of an image (a created, never started container with no network,
`get_archive`) and recomputes its git tree hash, with each submodule folder recorded as the gitlink the
pin names (and its own tree hash computed too): equal to the lock's `patched-tree` means the image holds
exactly the verified patched source.
"""

from __future__ import annotations

import shutil
import tarfile
import tempfile
from dataclasses import dataclass
from pathlib import Path, PurePosixPath

from ..gitcmd import git
from ..lock import GitPin


@dataclass(frozen=True)
class TreeInImage:
    tree: str
    submodule_trees: dict


def _write_tree(work: Path, gitlinks: dict[str, str]) -> str:
    g = dict(cwd=work)
    git("init", "-q", **g)
    git("add", "-A", "-f", ".", **g)
    for path, rev in gitlinks.items():
        git("rm", "-r", "-q", "--cached", "--ignore-unmatch", "--", path, **g)
        git("update-index", "--add", "--cacheinfo", f"160000,{rev},{path}", **g)
    tree = git("write-tree", **g)
    shutil.rmtree(work / ".git")
    return tree


def tree_in_image(client, image: str, path: str, pin: GitPin | None = None) -> TreeInImage:
    """Git tree hash of folder `path` inside `image` (submodules of `pin` as gitlinks)."""
    subs = {s.path: s.rev for s in (pin.submodules if pin else ())}
    c = client.containers.create(image, command=["/bin/true"], network_mode="none")
    try:
        with tempfile.TemporaryDirectory(prefix="reprostack-verify-") as tmp:
            tar_path = Path(tmp) / "x.tar"
            stream, _ = c.get_archive(path)
            with open(tar_path, "wb") as f:
                for chunk in stream:
                    f.write(chunk)
            out = Path(tmp) / "x"
            out.mkdir()
            with tarfile.open(tar_path) as t:
                t.extractall(out, filter="tar")
            work = out / PurePosixPath(path).name
            sub_trees = {}
            for sp in sorted(subs, key=lambda s: -s.count("/")):  # deepest first
                if (work / sp).is_dir():
                    sub_trees[sp] = _write_tree(work / sp, {})
            return TreeInImage(_write_tree(work, subs), sub_trees)
    finally:
        c.remove(force=True)
