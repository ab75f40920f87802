"""The built-in plugins, registered by type name (see `policies.plugins`)."""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

from policies import filters, netkv, pickers, scorers
from policies.plugins import Kind, PluginError, Registry, from_dataclass


def _role(role: str, name: str) -> Any:
    def make(params: Mapping[str, Any]) -> filters.Role:
        if params:
            raise PluginError("takes no parameters (use the 'role' filter with a role)")
        return filters.Role(role=role, name=name)

    return make


def _netkv(self_contention: bool, congestion: bool, name: str) -> Any:
    def make(params: Mapping[str, Any]) -> netkv.NetKVCost:
        if params:
            raise PluginError("takes no parameters (each variant is its own type)")
        return netkv.NetKVCost(self_contention, congestion, name=name)

    return make


def _qos_drl(params: Mapping[str, Any]) -> Any:
    from policies.qos_drl import DEFAULT_MODEL_DIR, QoSDRL

    unknown = sorted(set(params) - {"model", "latency_ms", "running_cap"})
    if unknown:
        raise PluginError(f"unknown parameters {unknown} (known: latency_ms, model, running_cap)")
    model = params.get("model")
    return QoSDRL(
        Path(model) if model else DEFAULT_MODEL_DIR,
        float(params.get("latency_ms", 30.0)),
        int(params.get("running_cap", 5)),
    )


def register_builtins(registry: Registry) -> None:
    dataclass_plugins: list[tuple[Kind, str, type]] = [
        ("filter", "healthy", filters.Healthy),
        ("filter", "serves_model", filters.ServesModel),
        ("filter", "role", filters.Role),
        ("filter", "memory_feasible", filters.MemoryFeasible),
        ("filter", "kv_feasible", netkv.KVFeasible),
        ("scorer", "load", scorers.Load),
        ("scorer", "prefix_cache", scorers.PrefixCache),
        ("scorer", "session_affinity", scorers.SessionAffinity),
        ("scorer", "expert_map", scorers.ExpertMap),
        ("picker", "argmax", pickers.Argmax),
        ("picker", "power_of_two", pickers.PowerOfTwo),
        ("picker", "round_robin", pickers.RoundRobin),
        ("picker", "random", pickers.Random),
    ]
    for kind, name, cls in dataclass_plugins:
        registry.register(kind, name, from_dataclass(cls))
    registry.register("filter", "prefill_role", _role("prefill", "prefill_role"))
    registry.register("filter", "decode_role", _role("decode", "decode_role"))

    registry.register("scorer", "netkv_topology", _netkv(False, False, "netkv_topology"))
    registry.register("scorer", "netkv_static", _netkv(True, False, "netkv_static"))
    registry.register("scorer", "netkv_full", _netkv(True, True, "netkv_full"))

    registry.register("policy", "qos_drl", _qos_drl)
