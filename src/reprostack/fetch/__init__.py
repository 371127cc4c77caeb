"""Fetch pinned sources into a content-addressed cache, materialize working trees, carry them in bundles.

One module per concern, invariants in each docstring: `cache` (layout, markers, locks), `verify`
(what "verified" means), `git` (fetching a git pin), `checkout` (working trees), `bundle` (offline transport).
"""

from .bundle import import_bundle, write_bundle
from .cache import Cache
from .checkout import checkout_submodules, materialize
from .git import FetchedGit, fetch_commit, fetch_git, insteadof_args, mirrors_from_env, via

__all__ = [
    "fetch_git",
    "fetch_commit",
    "insteadof_args",
    "via",
    "materialize",
    "checkout_submodules",
    "write_bundle",
    "import_bundle",
    "Cache",
    "FetchedGit",
    "mirrors_from_env",
]
