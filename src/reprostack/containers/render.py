"""Render a recipe's Dockerfile template from the lock, and check what the Dockerfile may do.

Template: `{{ dotted.name }}` fields only (no expressions, no loops, no code); a name that is not in the
values is an error naming the Dockerfile line. A value never holds a newline or `{{`, so a rendered
value cannot add an instruction, and rendering keeps line numbers (an error in step N points at the
recipe's own line).

Values (see `template_values`):
  from                                  the FROM image (parent image id, pinned base, or override's id)
  image.name, source_date_epoch
  (no value describes the whole lock, such as its sha256: an image's bytes depend only on the pins it names, so an
  edit of another pin, or of a comment, in the lock rebuilds nothing; the lock of the build is an API label,
  `dev.reprostack.lock-sha256`, outside the image key: containers/engine.py)
  upstreams.<pin>.{url,rev,tree,patched_tree,original}   git pins (patched_tree = tree without a series)
  upstreams.<pin>.{name,version,wheel_pin}                wheel pins (wheel_pin: the shared pin a stack override
                                        `{wheel: W}` made <pin> of, else <pin>: what a kernels manifest names)
  upstreams.<pin>.{filename,sha256}     a wheel pin with exactly one file (so a Dockerfile can re-check it with
                                        sha256sum); absent for a pin with several files, or a filename outside
                                        [A-Za-z0-9_.+-] (it would go into a RUN line)
  sources.<pin>.dest                    where the recipe put that pin's tree inside the context
  wheels.<pin>.dest                     where the recipe put that pin's wheels (+ requirements.txt, pins.json)
  kernels.<c>.{recipe,targets,make,env,nccl_floor}   the kernel recipe kernels/<c>.yaml, so an image builds a
                                        kernel exactly as the host does (`kernel_values`); only when the template
                                        names one

Dockerfile rules (a build never reaches outside the context): every FROM is `{{ from }}` or an earlier
stage; no `git clone`; no ADD of a URL.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path
from typing import Mapping

from ..lock import GitPin, Lock, WheelPin
from .errors import RecipeError

_FIELD = re.compile(r"\{\{\s*([A-Za-z0-9_.-]+)\s*\}\}")
_SAFE_FILENAME = re.compile(r"[A-Za-z0-9_.+-]+\.whl")


def template_values(
    lock: Lock,
    *,
    image: str,
    from_ref: str,
    epoch: int,
    source_dests: Mapping[str, str],
    wheel_dests: Mapping[str, str] | None = None,
) -> dict[str, str]:
    """The flat {dotted name: value} map a recipe template may use."""
    v = {"from": from_ref, "image.name": image, "source_date_epoch": str(epoch)}
    st = lock.stacks.get(lock.stack)
    wheel_of = st.wheel_of if st else {}
    for name, pin in lock.upstreams.items():
        p = f"upstreams.{name}."
        if isinstance(pin, GitPin):
            v.update(
                {
                    p + "url": pin.url,
                    p + "rev": pin.rev,
                    p + "tree": pin.tree,
                    p + "patched_tree": pin.patched_tree or pin.tree,
                    p + "original": pin.original or "",
                }
            )
        elif isinstance(pin, WheelPin):
            v.update({p + "name": pin.name, p + "version": pin.version, p + "wheel_pin": wheel_of.get(name, name)})
            if len(pin.files) == 1 and _SAFE_FILENAME.fullmatch(pin.files[0].filename):
                v.update({p + "filename": pin.files[0].filename, p + "sha256": pin.files[0].sha256})
    for name, dest in source_dests.items():
        v[f"sources.{name}.dest"] = dest
    for name, dest in (wheel_dests or {}).items():
        v[f"wheels.{name}.dest"] = dest
    return v


_SAFE_VALUE = re.compile(r"[A-Za-z0-9_.,=:+/@%-]*")
_SAFE_KEY = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")


def kernel_values(root: Path) -> dict[str, str]:
    """`kernels.<component>.*` of every kernels/<component>.yaml of `root` (reprostack.kernels.recipe): `recipe` (its
    digest, the value the host build key and the image's kernels manifest hold), `targets` (make targets), `make`
    and `env` (`K="V"` words for a shell; `{arch}` / `{arch_dotted}` become `${CUDA_ARCH}` / `${CUDA_ARCH_DOTTED}`,
    which the Dockerfile sets), `nccl_floor`. A value or key outside a plain charset is refused (a recipe cannot
    put shell syntax into an image build). Raises RecipeError / BuildError naming the recipe."""
    from ..kernels.recipe import load_recipe

    def words(mapping: dict, r) -> str:
        out = []
        for k, v in mapping.items():
            shell = str(v).replace("{arch_dotted}", "\x00D").replace("{arch}", "\x00A")
            if not _SAFE_KEY.fullmatch(str(k)) or not _SAFE_VALUE.fullmatch(
                shell.replace("\x00D", "").replace("\x00A", "")
            ):
                raise RecipeError(
                    r.path,
                    None,
                    str(k),
                    f"{v!r}: a kernel recipe value for an image build may hold only "
                    "letters, digits, _.,=:+/@%- and {arch} / {arch_dotted}",
                )
            out.append(f'{k}="' + shell.replace("\x00D", "${CUDA_ARCH_DOTTED}").replace("\x00A", "${CUDA_ARCH}") + '"')
        return " ".join(out)

    vals: dict[str, str] = {}
    for p in sorted((Path(root) / "kernels").glob("*.yaml")):
        r = load_recipe(root, p.stem)
        c = f"kernels.{r.component}."
        for t in r.make_targets:
            if not _SAFE_VALUE.fullmatch(t):
                raise RecipeError(r.path, None, "make.targets", f"{t!r}: not a plain make target")
        vals.update(
            {
                c + "recipe": r.digest,
                c + "targets": " ".join(r.make_targets),
                c + "make": words(r.make_vars, r),
                c + "env": words(r.env, r),
                c + "nccl_floor": r.nccl_floor or "",
            }
        )
    return vals


def render(text: str, values: Mapping[str, str], path: Path | str) -> str:
    """Fill every `{{ name }}` of `text`. Raises RecipeError (FILE:LINE) for unknown names or stray braces."""
    out = []
    for i, line in enumerate(text.splitlines(keepends=True), start=1):

        def sub(m: re.Match) -> str:
            key = m.group(1)
            if key not in values:
                near = sorted(k for k in values if k.split(".")[0] == key.split(".")[0])[:12]
                hint = f" (known here: {', '.join(near)})" if near else f" (known roots: {_roots(values)})"
                raise RecipeError(path, i, "{{ " + key + " }}", f"unknown template field{hint}")
            val = str(values[key])
            if "\n" in val or "\r" in val or "{{" in val:
                raise RecipeError(path, i, "{{ " + key + " }}", "value holds a newline or '{{': refused")
            return val

        rendered = _FIELD.sub(sub, line)
        if "{{" in rendered or "}}" in _FIELD.sub("", line):
            raise RecipeError(path, i, "(template)", "stray '{{' or '}}': fields are written {{ dotted.name }}")
        out.append(rendered)
    return "".join(out)


def render_value(text: str, values: Mapping[str, str], path: Path | str, line: int | None, field: str) -> str:
    """Render one image.yaml value (build arg, label); errors name the image.yaml line."""
    try:
        return render(text, values, path)
    except RecipeError as e:
        raise RecipeError(path, line, field, str(e).split(": ", 2)[-1]) from None


def _roots(values: Mapping[str, str]) -> str:
    return ", ".join(sorted({k.split(".")[0] for k in values}))


@dataclass(frozen=True)
class Instruction:
    """One Dockerfile instruction: its keyword, full text (continuations joined) and first line."""

    keyword: str
    text: str
    line: int

    def short(self, width: int = 100) -> str:
        t = " ".join(self.text.split())
        return t if len(t) <= width else t[: width - 3] + "..."


def instructions(text: str) -> list[Instruction]:
    """Split a Dockerfile into instructions as the classic builder counts its steps (comments and blank
    lines skipped, `\\`-continued lines joined)."""
    out: list[Instruction] = []
    buf: list[str] = []
    start = 0
    for i, raw in enumerate(text.splitlines(), start=1):
        s = raw.strip()
        if not buf and (not s or s.startswith("#")):
            continue
        if buf and s.startswith("#"):
            continue  # a comment inside a continued instruction is dropped by the parser
        if not buf:
            start = i
        if s.endswith("\\"):
            buf.append(s[:-1])
            continue
        buf.append(s)
        joined = " ".join(b.strip() for b in buf if b.strip())
        buf = []
        out.append(Instruction(joined.split(None, 1)[0].upper(), joined, start))
    if buf:
        joined = " ".join(b.strip() for b in buf if b.strip())
        out.append(Instruction(joined.split(None, 1)[0].upper(), joined, start))
    return out


def check_dockerfile(template: str, rendered: str, path: Path | str) -> list[Instruction]:
    """Enforce the rules in the module doc on a template and its rendering; returns the instructions."""
    stages: set[str] = set()
    tmpl = instructions(template)
    inst = instructions(rendered)
    if not inst or inst[0].keyword != "FROM":
        raise RecipeError(path, inst[0].line if inst else 1, "FROM", "the first instruction must be FROM {{ from }}")
    for t, r in zip(tmpl, inst):
        words = _FIELD.sub(lambda m: "{{" + m.group(1) + "}}", t.text).split()
        if t.keyword == "FROM":
            args = [w for w in words[1:] if not w.startswith("--")]
            image = args[0] if args else ""
            if image != "{{from}}":
                if image.lower() not in stages:
                    raise RecipeError(
                        path,
                        t.line,
                        "FROM",
                        f"{image!r}: an image is only ever FROM {{{{ from }}}} (the recipe's parent or "
                        f"pinned base) or an earlier stage",
                    )
            if len(args) >= 3 and args[1].upper() == "AS":
                stages.add(args[2].lower())
        if re.search(r"\bgit\s+clone\b", r.text):
            raise RecipeError(
                path,
                r.line,
                r.keyword,
                "no `git clone` in a Dockerfile: put the pin under `sources:` "
                "(the verified patched tree is copied into the context)",
            )
        if r.keyword == "ADD" and "://" in r.text:
            raise RecipeError(
                path,
                r.line,
                "ADD",
                "ADD of a URL fetches unpinned bytes: bring the file into the context (`files:` / `sources:`) instead",
            )
    return inst
