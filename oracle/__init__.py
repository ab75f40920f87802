"""NetKV's network cost oracle: topology, congestion and the transfer-cost model."""

from oracle.topology import TIERS, Topology

__all__ = ["TIERS", "Topology"]
