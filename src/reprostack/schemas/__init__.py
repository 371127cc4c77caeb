"""The JSON Schemas (draft 2020-12) of what reprostack reads and writes, one file per format:
`<name>.schema.json` here. `load(name)` is the one loader (each reader validates with it; yamlsrc.validate turns
the deepest error into `FILE:LINE: field: why`)."""

from __future__ import annotations

import json
from importlib import resources


def load(name: str) -> dict:
    """The schema `<name>.schema.json` of this package (`name` with or without the suffix), parsed anew each call
    (a caller may change its copy)."""
    file = name if name.endswith(".schema.json") else f"{name}.schema.json"
    return json.loads(resources.files(__name__).joinpath(file).read_text())
