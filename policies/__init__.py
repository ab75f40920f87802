"""Routing policies: pure, synchronous functions of a request and a cluster snapshot.

The gateway and every simulator call the very same objects.
"""

from policies.pipeline import Filter, Picker, Pipeline, Policy, Scorer
from policies.registry import PRESETS, PipelineSpec, build_pipeline, build_policy
from policies.types import BackendView, ClusterView, Decision, RequestInfo, Role

__all__ = [
    "PRESETS",
    "BackendView",
    "ClusterView",
    "Decision",
    "Filter",
    "Picker",
    "Pipeline",
    "PipelineSpec",
    "Policy",
    "RequestInfo",
    "Role",
    "Scorer",
    "build_pipeline",
    "build_policy",
]
