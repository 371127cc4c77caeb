"""Errors of the image stage; each names what to fix (recipe file:line, image, Dockerfile step, log)."""

from __future__ import annotations

from pathlib import Path

from ..errors import ReprostackError


class ContainerError(ReprostackError):
    """An image could not be planned or built; the message is complete and meant for the operator."""


class RecipeError(ContainerError):
    """A recipe (`containers/<image>/image.yaml` or its Dockerfile) is wrong: `FILE:LINE: FIELD: what`."""

    def __init__(self, path: str | Path, line: int | None, field: str, message: str):
        self.path, self.line, self.field = str(path), line, field
        where = f"{path}:{line}" if line else str(path)
        super().__init__(f"{where}: {field}: {message}")


class EngineUnavailable(ContainerError):
    """No Docker engine answers (DOCKER_HOST / the default socket)."""


class ImageBuildError(ContainerError):
    """A Dockerfile step failed: names the image, the step (instruction and recipe line) and the full log."""

    def __init__(self, image: str, step: str, log: Path, detail: str, tail: str = ""):
        self.image, self.step, self.log, self.detail = image, step, Path(log), detail
        msg = f"image {image}: step {step} failed: {detail}\n  full log: {log}"
        if tail:
            msg += "\n  last lines:\n" + "\n".join(f"    {l}" for l in tail.splitlines())
        super().__init__(msg)
