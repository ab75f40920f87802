"""The policies in use: one per model (or the default), and the disaggregated pair.

Built from the routing config (`settings.RoutingConfig`) and replaced whole when the
config changes; the proxy reads it on every request.
"""

from __future__ import annotations

from gateway.settings import RoutingConfig
from policies import Need, Policy, build_policy


class Routes:
    def __init__(self, config: RoutingConfig) -> None:
        self.apply(config)

    def apply(self, config: RoutingConfig) -> None:
        """Build every policy `config` names (raises PluginError or ValueError)."""
        prefill = build_policy(config.prefill)
        decode = build_policy(config.decode)
        default = build_policy(config.default)
        by_model = {m: build_policy(spec) for m, spec in config.models.items()}
        policies = (prefill, decode, default, *by_model.values())
        self.prefill = prefill
        self.decode = decode
        self._default = default
        self._by_model = by_model
        self.needs: frozenset[Need] = frozenset().union(*(p.needs for p in policies))
        # The disaggregated path hashes once, for both of its policies.
        self.pd_hashes = Need.BLOCK_HASHES in prefill.needs | decode.needs

    def for_model(self, model: str) -> Policy:
        return self._by_model.get(model, self._default)
