"""The policies in use: one per model (or the default), and the disaggregated pair.

Built from the routing config (`settings.RoutingConfig`) and replaced when the config
changes; the proxy reads it on every request.
"""

from __future__ import annotations

from gateway.settings import RoutingConfig
from policies import Need, PipelineSpec, Policy, Warmable, build_policy

# Each role's spec and the policy built from it: "*" is the default, "*prefill" and
# "*decode" the disaggregated pair, any other key a model (whose names never start
# with "*").
Plan = dict[str, tuple[PipelineSpec, Policy]]


class Routes:
    def __init__(self, config: RoutingConfig) -> None:
        self._built: Plan = {}
        self.use(self.plan(config))

    def plan(self, config: RoutingConfig, fresh: Plan | None = None) -> Plan:
        """Every policy `config` names, built (raises PluginError, ValueError, or a
        plugin's own error), or taken from `fresh` (built already) where the role's
        spec is the same. A role whose spec is unchanged keeps its policy object:
        every replica reloads the config at its first store sync and whenever an
        operator changes any part of it, and rebuilding would load models again and
        drop the policies' per-backend caches. So files a spec names are read once:
        new model files go in a new folder, named by a new spec. Only reads the routes
        in use, so it can run off the event loop while they serve."""
        wanted = {
            "*prefill": config.prefill,
            "*decode": config.decode,
            "*": config.default,
            **config.models,
        }
        fresh = fresh or {}
        return {role: self._kept_or_built(role, spec, fresh) for role, spec in wanted.items()}

    def use(self, plan: Plan) -> None:
        self._built = plan
        self.prefill = plan["*prefill"][1]
        self.decode = plan["*decode"][1]
        self._default = plan["*"][1]
        self._by_model = {m: p for m, (_, p) in plan.items() if not m.startswith("*")}
        self.needs: frozenset[Need] = frozenset().union(*(p.needs for _, p in plan.values()))
        # The disaggregated path hashes and counts once, for both of its policies.
        pd_needs = self.prefill.needs | self.decode.needs
        self.pd_hashes = Need.BLOCK_HASHES in pd_needs
        self.pd_counted = Need.ARRIVAL_RATE in pd_needs
        distinct = {id(p): p for _, p in plan.values()}.values()
        self.warmable: tuple[Warmable, ...] = tuple(p for p in distinct if isinstance(p, Warmable))

    def _kept_or_built(
        self, role: str, spec: PipelineSpec, fresh: Plan
    ) -> tuple[PipelineSpec, Policy]:
        for ready in (self._built.get(role), fresh.get(role)):
            if ready is not None and ready[0] == spec:
                return ready
        return spec, build_policy(spec)

    def for_model(self, model: str) -> Policy:
        return self._by_model.get(model, self._default)
