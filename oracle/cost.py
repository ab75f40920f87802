"""NetKV's cost model (the paper's eq. 1-4 and Proposition 2, as DESIGN.md restates them)."""

from __future__ import annotations


def kv_bytes_per_token(layers: int, kv_heads: int, head_dim: int, bytes_per_elem: int = 2) -> int:
    """s = 2 * layers * kv_heads * head_dim * bytes (keys and values)."""
    return 2 * layers * kv_heads * head_dim * bytes_per_elem


def payload_bytes(prompt_tokens: int, hit_tokens: int, bytes_per_token: float) -> float:
    """S = s * (L_in - h): only the part of the prompt the decode side lacks travels."""
    return bytes_per_token * max(0, prompt_tokens - hit_tokens)


def effective_bandwidth(gbps: float, rho: float, self_contention: int) -> float:
    """B_eff in bytes/s = B * (1 - rho) / (1 + c_self)."""
    return gbps * 1e9 / 8 * (1.0 - rho) / (1 + self_contention)


def transfer_seconds(
    nbytes: float, gbps: float, latency_us: float, rho: float = 0.0, self_contention: int = 0
) -> float:
    """T_x = lat_tier + S / B_eff."""
    return latency_us * 1e-6 + nbytes / effective_bandwidth(gbps, rho, self_contention)


def staleness_tolerance(beta: float, rho_fast: float, rho_slow: float) -> float:
    """Proposition 2: the largest congestion error that cannot invert two tiers' order.

    `beta` = B_fast / B_slow. Negative means no tolerance (the fast tier is near saturation).
    """
    return (beta * (1.0 - rho_fast) - (1.0 - rho_slow)) / (beta + 1.0)
