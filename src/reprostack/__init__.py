"""reprostack: pinned upstreams -> fetch -> patch -> build -> gates -> report, for DeepEP on AWS EFA."""

__version__ = "0.1.0"
