"""Text of a small lockfile for the fill/check tests: a header comment and one git pin with trailing
comments, which a fill must keep byte for byte."""

REV = "b306af06afd412c88e51e71802951606e40b7358"
TREE = "186344a19c36d5dceb2c386fb0b6b0a2f08e9e75"


def lock_head(rev: str = REV, tree: str = TREE) -> str:
    """The lockfile up to and including the `src` git pin; the caller appends its own pins."""
    return f"""\
# header comment: kept byte for byte
lockfile-version: 1
upstreams:
  src:
    kind: git   # trailing comment
    url: https://example.invalid/src
    rev: {rev}
    tree: {tree}
"""
