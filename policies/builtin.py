"""The built-in plugins, registered by type name (see `policies.plugins`)."""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

from policies import filters, netkv, pickers, scorers
from policies.plugins import Kind, PluginError, Registry, check_params, from_dataclass


def _fixed(plugin: object) -> Any:
    """A factory for a preconfigured variant (prefill_role, netkv_full, ...): it takes
    no parameters of its own."""

    def make(params: Mapping[str, Any]) -> object:
        check_params(params, ())
        return plugin

    return make


def _qos_drl(params: Mapping[str, Any]) -> Any:
    from policies.predictor import DEFAULT_MODEL_DIR
    from policies.qos_drl import load

    defaults = {"shed": True, "sample": False, "speed_prior": False}
    check_params(params, ("model", "latency_ms", *defaults))
    model = params.get("model")
    flags = {name: params.get(name, default) for name, default in defaults.items()}
    for name, flag in flags.items():
        if not isinstance(flag, bool):
            raise PluginError(f"qos_drl's {name} must be true or false, not {flag!r}")
    policy = load(
        Path(model) if model else DEFAULT_MODEL_DIR, float(params.get("latency_ms", 30.0)), **flags
    )
    if params.get("speed_prior") is False and policy.trained_with_prior:
        raise PluginError(
            "qos_drl's model was trained with speed_prior and is always served with it: "
            "speed_prior: false cannot be honoured"
        )
    return policy


def _predicted_quality(params: Mapping[str, Any]) -> Any:
    from policies.predictor import predicted_quality

    return predicted_quality(params)


def register_builtins(registry: Registry) -> None:
    dataclass_plugins: list[tuple[Kind, str, type]] = [
        ("filter", "healthy", filters.Healthy),
        ("filter", "serves_model", filters.ServesModel),
        ("filter", "role", filters.Role),
        ("filter", "memory_feasible", filters.MemoryFeasible),
        ("filter", "queue_cap", filters.QueueCap),
        ("filter", "kv_feasible", netkv.KVFeasible),
        ("scorer", "load", scorers.Load),
        ("scorer", "queue", scorers.Queue),
        ("scorer", "kv_utilization", scorers.KVUtilization),
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
    for role in ("prefill", "decode"):
        name = f"{role}_role"
        registry.register("filter", name, _fixed(filters.Role(role=role, name=name)))
    for name, self_contention, congestion in (
        ("netkv_topology", False, False),
        ("netkv_static", True, False),
        ("netkv_full", True, True),
    ):
        registry.register(
            "scorer", name, _fixed(netkv.NetKVCost(self_contention, congestion, name=name))
        )

    registry.register("scorer", "predicted_quality", _predicted_quality)
    registry.register("policy", "qos_drl", _qos_drl)
