"""Plugins: every filter, scorer, picker, whole policy and request hook, registered by
type name.

The built-ins are registered in `policies.builtin`. An installed package adds its own
through an entry-point group, with no edit to this repository:

    [project.entry-points."edgeroute.scorers"]
    queue_depth = "my_package.scoring:make_queue_depth"

The entry point's name is the type a routing spec uses (`{type: queue_depth}`) and
its value is a factory: a callable that takes the plugin's parameters (the spec's
`params`, a mapping) and returns the plugin. A plugin states what it needs from the
gateway in `needs` (a frozenset of `Need`); the gateway provides exactly that.
"""

from __future__ import annotations

import dataclasses
import enum
import functools
import logging
from collections.abc import Callable, Iterable, Mapping
from importlib.metadata import entry_points
from typing import Any, Literal

log = logging.getLogger("edgeroute.plugins")

# A hook is called around each attempt of each request (see gateway.hooks); it is
# registered here so that one mechanism finds every kind of plugin.
Kind = Literal["filter", "scorer", "picker", "policy", "hook"]
KINDS: tuple[Kind, ...] = ("filter", "scorer", "picker", "policy", "hook")
GROUPS: dict[Kind, str] = {
    "filter": "edgeroute.filters",
    "scorer": "edgeroute.scorers",
    "picker": "edgeroute.pickers",
    "policy": "edgeroute.policies",
    "hook": "edgeroute.hooks",
}
Factory = Callable[[Mapping[str, Any]], Any]


class Need(enum.Enum):
    """What a plugin reads that costs the gateway work to provide."""

    BLOCK_HASHES = "block_hashes"  # RequestInfo.block_hashes: the prompt's prefix blocks
    INFLIGHT_REQUESTS = "inflight_requests"  # BackendView.requests: each one's progress
    ORACLE = "oracle"  # ClusterView.oracle and self_contention: NetKV's network view
    LATENCY_TARGETS = "latency_targets"  # accounting of Decision.token_target (met, missed)
    ARRIVAL_RATE = "arrival_rate"  # RequestInfo.arrival_rate: its model's requests per second


NO_NEEDS: frozenset[Need] = frozenset()


def needs_of(plugin: object) -> frozenset[Need]:
    """A plugin's declared needs (none when it declares nothing)."""
    declared: frozenset[Need] = getattr(plugin, "needs", NO_NEEDS)
    return declared


class PluginError(ValueError):
    """An unknown plugin type, or parameters its factory refused."""


def check_params(params: Mapping[str, Any], known: Iterable[str]) -> None:
    """PluginError when `params` names a parameter outside `known`: for factories."""
    allowed = set(known)
    unknown = sorted(set(params) - allowed)
    if unknown:
        listed = ", ".join(sorted(allowed)) or "none"
        raise PluginError(f"unknown parameters {unknown} (known: {listed})")


def from_dataclass(cls: type) -> Factory:
    """A factory for a dataclass plugin: its init fields (but `name`) are its parameters."""
    fields = {f.name for f in dataclasses.fields(cls) if f.init and f.name != "name"}

    def make(params: Mapping[str, Any]) -> Any:
        check_params(params, fields)
        return cls(**params)

    make.__doc__ = f"Make a {cls.__name__} from its parameters."
    return make


class Registry:
    """Factories by kind and type name."""

    def __init__(self) -> None:
        self._factories: dict[Kind, dict[str, Factory]] = {k: {} for k in KINDS}

    def register(self, kind: Kind, type_name: str, factory: Factory) -> None:
        table = self._factories[kind]
        if type_name in table:
            raise PluginError(f"a {kind} named {type_name!r} is already registered")
        table[type_name] = factory

    def has(self, kind: Kind, type_name: str) -> bool:
        return type_name in self._factories[kind]

    def types(self, kind: Kind) -> list[str]:
        return sorted(self._factories[kind])

    def create(self, kind: Kind, type_name: str, params: Mapping[str, Any] | None = None) -> Any:
        factory = self._factories[kind].get(type_name)
        if factory is None:
            raise PluginError(f"unknown {kind} {type_name!r}; known: {self.types(kind)}")
        try:
            return factory(params or {})
        except PluginError as exc:
            raise PluginError(f"{kind} {type_name!r}: {exc}") from exc
        except (TypeError, ValueError) as exc:
            raise PluginError(f"{kind} {type_name!r} refused its parameters: {exc}") from exc

    def load_entry_points(self) -> None:
        """Register every installed package's plugins. A built-in's name cannot be
        taken over: a clash is logged and the installed one ignored."""
        for kind, group in GROUPS.items():
            for ep in entry_points(group=group):
                if self.has(kind, ep.name):
                    log.warning(
                        "ignoring the %s %r from %s: the name is taken", kind, ep.name, ep.value
                    )
                    continue
                self.register(kind, ep.name, _Deferred(ep.load))


class _Deferred:
    """An entry point's factory, imported on first use (so that a broken package
    fails the spec that names it, not the gateway's start)."""

    def __init__(self, load: Callable[[], Any]) -> None:
        self._load = load

    def __call__(self, params: Mapping[str, Any]) -> Any:
        try:
            factory = self._load()
        except Exception as exc:  # an installed package's import error, named
            raise PluginError(f"could not be imported: {exc!r}") from exc
        return factory(params)


@functools.cache
def default_registry() -> Registry:
    """The built-ins and every installed package's plugins (read once per process)."""
    from policies.builtin import register_builtins

    registry = Registry()
    register_builtins(registry)
    registry.load_entry_points()
    return registry
