"""Routing policies: pure, synchronous functions of a request and a cluster snapshot.

The gateway and every simulator call the very same objects.
"""

from policies.pipeline import Filter, Picker, Pipeline, Policy, Refilterable, Scorer, Warmable
from policies.plugins import Need, PluginError, Registry, check_params, default_registry
from policies.registry import PRESETS, PipelineSpec, PluginRef, build_pipeline, build_policy
from policies.types import BackendView, ClusterView, Decision, RequestInfo, Role

__all__ = [
    "PRESETS",
    "BackendView",
    "ClusterView",
    "Decision",
    "Filter",
    "Need",
    "Picker",
    "Pipeline",
    "PipelineSpec",
    "PluginError",
    "PluginRef",
    "Policy",
    "Refilterable",
    "Registry",
    "RequestInfo",
    "Role",
    "Scorer",
    "Warmable",
    "build_pipeline",
    "build_policy",
    "check_params",
    "default_registry",
]
