"""The policies in use: one per model (or the default), and the disaggregated pair.

Built from the routing config (`settings.RoutingConfig`) and replaced when the config
changes; the proxy reads it on every request.
"""

from __future__ import annotations

from gateway.settings import RoutingConfig
from policies import Need, PipelineSpec, Policy, build_policy


class Routes:
    def __init__(self, config: RoutingConfig) -> None:
        self._built: dict[str, tuple[PipelineSpec, Policy]] = {}
        self.apply(config)

    def apply(self, config: RoutingConfig) -> None:
        """Build every policy `config` names (raises PluginError or ValueError).

        A role whose spec is unchanged keeps its policy object: every replica reloads
        the config at its first store sync and whenever an operator changes any part
        of it, and rebuilding would load models again on the event loop and drop the
        policies' per-backend caches.
        """
        wanted = {
            "*prefill": config.prefill,
            "*decode": config.decode,
            "*": config.default,
            **config.models,
        }
        built = {role: self._kept_or_built(role, spec) for role, spec in wanted.items()}
        self._built = built
        self.prefill = built["*prefill"][1]
        self.decode = built["*decode"][1]
        self._default = built["*"][1]
        self._by_model = {m: built[m][1] for m in config.models}
        self.needs: frozenset[Need] = frozenset().union(*(p.needs for _, p in built.values()))
        # The disaggregated path hashes once, for both of its policies.
        self.pd_hashes = Need.BLOCK_HASHES in self.prefill.needs | self.decode.needs

    def _kept_or_built(self, role: str, spec: PipelineSpec) -> tuple[PipelineSpec, Policy]:
        old = self._built.get(role)
        if old is not None and old[0] == spec:
            return old
        return spec, build_policy(spec)

    def for_model(self, model: str) -> Policy:
        return self._by_model.get(model, self._default)
