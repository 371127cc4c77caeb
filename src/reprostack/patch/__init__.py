"""Patch stage: replay an upstream's pinned patch series onto its pinned commit.

Invariants (each one is checked here, not assumed):

- zero fuzz: a cherry-pick is a plain 3-way merge whose conflicts are never resolved (no rerere, no
  `-X` strategy options); an `mbox` entry goes through `git am --keep-cr` and a `diff` entry through
  `git apply --index`, both without `--3way`, without `-C<n>` context reduction, without
  `--reject`, without `--ignore-whitespace` and with `--whitespace=nowarn` (whitespace is never
  "fixed"). Every context line must match byte for byte; git's only leeway is the line offset of a
  hunk. A hunk that would need fuzz is a failure.
- all-or-nothing: the whole series is checked before anything is written (every cherry-pick commit
  is in the object db and is not a merge, every committed patch file exists, parses, has no
  abbreviated binary hunk and carries an `Upstream-Status:` header equal to the lock's), then it is
  replayed in a fresh scratch repository next to `dest`. Only when every entry applied and the final
  tree equals the pinned `patched-tree` is the scratch renamed to `dest` (one `os.replace`). On any
  failure the scratch is removed and `dest` never appears.
- tree verified: the base commit must have the pinned base tree, every entry with a pinned `tree` is
  compared right after it applied, the final `HEAD^{tree}` must be `patched-tree`, and the working
  tree must be clean (what a build reads is what was verified).
- reproducible: git runs through `gitcmd.git()` (no user/system config, fixed identity and dates)
  with every behaviour-changing setting pinned on the command line, so the commit ids of a replay are
  the same on every machine; the *tree* is what is verified, the commit ids are reported.

`dest` shares its object database with `src` (`objects/info/alternates`, like `git clone --shared`):
`src` (and whatever it borrows from) must outlive `dest`. Submodules are not populated here.
"""

from .apply import AppliedEntry, SeriesResult, apply_series
from .errors import SeriesError
from .headers import PatchHeader, check_patch_headers
from .precheck import check_series

__all__ = [
    "AppliedEntry",
    "PatchHeader",
    "SeriesError",
    "SeriesResult",
    "apply_series",
    "check_patch_headers",
    "check_series",
]
