"""Images from the lock: `containers/<image>/` recipes built on a Docker engine through the docker SDK.

One module per concern: `recipe` (image.yaml + Dockerfile, parents, base pins and overrides), `render`
(Dockerfile template from the lock, and what a Dockerfile may do), `context` (the deterministic tar),
`engine` (keys, reuse, build, labels, logs, progress), `baseimage` (the FROM image: found, pulled by digest, checked
against the pin), `preflight` (what a build checks before any engine work), `verify` (what is inside a built image),
`testbase` (the tiny local base image that stands in for CUDA on CPU machines and in tests).
"""

from .engine import BuildOptions, ImageResult, build_images, connect, render_recipe
from .errors import ContainerError, EngineUnavailable, ImageBuildError, RecipeError
from .recipe import OVERRIDE_ENV, Recipe, load_all, load_recipe, recipe_names
from .testbase import TEST_BASE, ensure_test_base
from .verify import tree_in_image

__all__ = [
    "BuildOptions",
    "ImageResult",
    "build_images",
    "connect",
    "render_recipe",
    "ContainerError",
    "EngineUnavailable",
    "ImageBuildError",
    "RecipeError",
    "OVERRIDE_ENV",
    "Recipe",
    "load_all",
    "load_recipe",
    "recipe_names",
    "TEST_BASE",
    "ensure_test_base",
    "tree_in_image",
]
