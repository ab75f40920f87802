"""Prism's activation-aware MoE expert placement (pure functions, no I/O).

- `allocate_counts`: Algorithm 1. Each server's expert budget is split across layers in
  proportion to the normalised entropy of its activations there, then coverage is
  repaired by borrowing from the most over-provisioned layers, servers taken by memory
  in descending order.
- `assign`: Algorithm 2. Per server and layer, the most frequently activated experts;
  then each unplaced expert replaces the least-used duplicate on the servers with the
  fewest duplicates.
- `remote_cost` (eq. 2), `migration_seconds` (eq. 3), `should_adopt` (eq. 4).
- Baselines re-implemented for heterogeneous servers: `uniform`, `redundance`,
  `smartmoe` (load-balanced, each expert once) and `eplb` (replicas of hot experts).

A server's capacity counts whole experts per GPU (sum over GPUs of floor(mem / m_e)),
not floor(total memory / m_e) as Algorithm 1 writes it, so that packing experts onto
GPUs never exceeds a GPU's memory.
"""

from __future__ import annotations

import math
import random
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

Expert = tuple[int, int]  # (layer, expert index)


@dataclass(frozen=True)
class Server:
    id: str
    gpu_memory: tuple[float, ...]  # per GPU, in the unit of the expert size
    gpu_io: tuple[float, ...] = ()  # per GPU, size unit per second (migration)

    def capacity(self, expert_size: float) -> int:
        return sum(int(m // expert_size) for m in self.gpu_memory)


@dataclass(frozen=True)
class Placement:
    """`gpus[n][g]`: the experts on GPU g of server n."""

    gpus: tuple[tuple[frozenset[Expert], ...], ...]

    def on_server(self, n: int) -> frozenset[Expert]:
        return frozenset().union(*self.gpus[n])

    def layer_sets(self, n: int, layers: int) -> list[set[int]]:
        out: list[set[int]] = [set() for _ in range(layers)]
        for layer, e in self.on_server(n):
            out[layer].add(e)
        return out


def entropy(freq: np.ndarray) -> np.ndarray:
    """Normalised Shannon entropy of each layer's activation distribution: [L] in [0, 1]."""
    p = freq / np.clip(freq.sum(-1, keepdims=True), 1e-12, None)
    logp = np.log(np.where(p > 0, p, 1.0))
    out: np.ndarray = -(p * logp).sum(-1) / math.log(freq.shape[-1])
    return out


def allocate_counts(
    servers: Sequence[Server],
    experts: int,
    expert_size: float,
    freq: Sequence[np.ndarray],
    rounding: str = "largest_remainder",
) -> np.ndarray:
    """Algorithm 1: N[n, l], the number of layer-l experts server n holds.

    `rounding="floor"` is the paper's line 4; by default the entropy-proportional shares
    are rounded by largest remainder instead, so that no whole expert slot is left idle
    (flooring 32 layers loses about 16 slots a server).
    """
    layers = freq[0].shape[0]
    counts = np.zeros((len(servers), layers), dtype=int)
    for n, s in enumerate(servers):
        v = entropy(freq[n]) + 1e-9
        share = s.capacity(expert_size) * v / v.sum()
        counts[n] = np.minimum(experts, np.floor(share))
        if rounding == "largest_remainder":
            left = s.capacity(expert_size) - int(counts[n].sum())
            for layer in np.argsort(-(share - np.floor(share)), kind="stable"):
                if left <= 0:
                    break
                if counts[n, layer] < experts:
                    counts[n, layer] += 1
                    left -= 1
    order = sorted(range(len(servers)), key=lambda n: -sum(servers[n].gpu_memory))
    for layer in range(layers):
        while counts[:, layer].sum() < experts:
            moved = False
            for n in order:
                totals = counts.sum(0)
                donor = int(np.argmax(np.where(np.arange(layers) == layer, -1, totals)))
                if counts[n, donor] > 0 and totals[donor] > experts and counts[n, layer] < experts:
                    counts[n, donor] -= 1
                    counts[n, layer] += 1
                    moved = True
                    if counts[:, layer].sum() == experts:
                        break
            if not moved:
                # No over-provisioned layer to borrow from: use a server's unallocated
                # slots (left by the per-layer cap of E, or by rounding).
                for n in order:
                    if counts[n].sum() < servers[n].capacity(expert_size) and (
                        counts[n, layer] < experts
                    ):
                        counts[n, layer] += 1
                        moved = True
                        break
            if not moved:
                raise ValueError("the servers' memory cannot hold every expert once")
    return counts


def greedy(counts: np.ndarray, freq: Sequence[np.ndarray]) -> list[list[set[int]]]:
    """Algorithm 2, lines 1-3: each server's most frequently activated experts per layer."""
    servers, layers = counts.shape
    return [
        [
            set(np.argsort(-freq[n][layer], kind="stable")[: counts[n, layer]].tolist())
            for layer in range(layers)
        ]
        for n in range(servers)
    ]


def assign(counts: np.ndarray, freq: Sequence[np.ndarray]) -> list[list[set[int]]]:
    """Algorithm 2: A[n][l], the experts of layer l placed on server n (the greedy stage,
    then coverage repair)."""
    servers, layers = counts.shape
    experts = freq[0].shape[1]
    sets = greedy(counts, freq)
    for layer in range(layers):

        def holders(e: int, layer: int = layer) -> int:
            return sum(e in sets[n][layer] for n in range(servers))

        unplaced = {e for e in range(experts) if holders(e) == 0}
        while unplaced:
            dup = {n: [e for e in sets[n][layer] if holders(e) > 1] for n in range(servers)}
            progress = False
            for n in sorted(range(servers), key=lambda n: len(dup[n])):
                if not unplaced or not dup[n]:
                    continue
                e = max(unplaced, key=lambda x: (freq[n][layer][x], -x))
                victim = min(dup[n], key=lambda x: (freq[n][layer][x], x))
                if holders(victim) < 2:
                    continue
                sets[n][layer].discard(victim)
                sets[n][layer].add(e)
                unplaced.discard(e)
                progress = True
                dup = {m: [x for x in sets[m][layer] if holders(x) > 1] for m in range(servers)}
            if not progress:
                raise ValueError("no duplicate left to replace: counts cannot cover the layer")
    return sets


def pack(servers: Sequence[Server], expert_size: float, sets: list[list[set[int]]]) -> Placement:
    """Put each server's experts on its GPUs, filling them in order."""
    out = []
    for n, s in enumerate(servers):
        room = [int(m // expert_size) for m in s.gpu_memory]
        gpus: list[set[Expert]] = [set() for _ in room]
        g = 0
        for layer, es in enumerate(sets[n]):
            for e in sorted(es):
                while room[g] == 0:
                    g += 1
                gpus[g].add((layer, e))
                room[g] -= 1
        out.append(tuple(frozenset(x) for x in gpus))
    return Placement(tuple(out))


def prism(
    servers: Sequence[Server],
    experts: int,
    expert_size: float,
    freq: Sequence[np.ndarray],
    rounding: str = "largest_remainder",
) -> Placement:
    counts = allocate_counts(servers, experts, expert_size, freq, rounding)
    return pack(servers, expert_size, assign(counts, freq))


def local_utility(sets: list[set[int]], freq: np.ndarray) -> float:
    """U_n: the activation mass a server serves locally."""
    return float(sum(freq[layer][list(es)].sum() for layer, es in enumerate(sets) if es))


def remote_cost(
    placement: Placement, freq: Sequence[np.ndarray], weights: Sequence[float] | None = None
) -> float:
    """Eq. 2: expected remote invocations, sum over n, l, e of f_n^l(e) [e not on n]."""
    total = 0.0
    for n, f in enumerate(freq):
        local = placement.layer_sets(n, f.shape[0])
        missing = f.sum() - local_utility(local, f)
        total += missing * (weights[n] if weights is not None else 1.0)
    return total


def migration_seconds(
    old: Placement, new: Placement, servers: Sequence[Server], expert_size: float
) -> float:
    """Eq. 3: every expert that changes on a GPU costs m_e / that GPU's I/O speed."""
    t = 0.0
    for n, s in enumerate(servers):
        for g, (a, b) in enumerate(zip(old.gpus[n], new.gpus[n], strict=True)):
            speed = s.gpu_io[g] if s.gpu_io else 1.0
            t += len(a ^ b) * expert_size / speed
    return t


def should_adopt(cost_new: float, migration: float, cost_old: float) -> bool:
    """Eq. 4: migrate only when C(P') + T_mig(P, P') < C(P) (all in seconds)."""
    return cost_new + migration < cost_old


# -- baselines ------------------------------------------------------------------------------


def uniform(
    servers: Sequence[Server], experts: int, layers: int, expert_size: float, seed: int = 0
) -> Placement:
    """Prism's Uniform baseline (Megatron-LM's expert parallelism): each expert once,
    every layer's experts shuffled and dealt over the GPUs in turn, so each GPU gets
    about the same number of random experts per layer (a GPU that is full is skipped)."""
    rng = random.Random(seed)
    gpus = [(n, g) for n, s in enumerate(servers) for g in range(len(s.gpu_memory))]
    room = [int(servers[n].gpu_memory[g] // expert_size) for n, g in gpus]
    placed: list[set[Expert]] = [set() for _ in gpus]
    turn = 0
    for layer in range(layers):
        order = list(range(experts))
        rng.shuffle(order)
        for e in order:
            for k in range(len(gpus)):
                m = (turn + k) % len(gpus)
                if room[m] > 0:
                    placed[m].add((layer, e))
                    room[m] -= 1
                    turn = m + 1
                    break
    return _placement(servers, gpus, placed)


def redundance(
    servers: Sequence[Server], experts: int, layers: int, expert_size: float, seed: int = 0
) -> Placement:
    """Prism's Redundance baseline: Uniform, then every GPU's spare memory takes random
    experts that its server does not hold yet (copies across servers)."""
    rng = random.Random(seed + 1)
    base = uniform(servers, experts, layers, expert_size, seed)
    gpus = [(n, g) for n, s in enumerate(servers) for g in range(len(s.gpu_memory))]
    placed = [set(base.gpus[n][g]) for n, g in gpus]
    for k, (n, g) in enumerate(gpus):
        spare = int(servers[n].gpu_memory[g] // expert_size) - len(placed[k])
        held = set().union(*(placed[j] for j, (m, _) in enumerate(gpus) if m == n))
        missing = [(la, e) for la in range(layers) for e in range(experts) if (la, e) not in held]
        rng.shuffle(missing)
        placed[k].update(missing[: max(0, spare)])
    return _placement(servers, gpus, placed)


def _placement(
    servers: Sequence[Server], gpus: Sequence[tuple[int, int]], placed: Sequence[set[Expert]]
) -> Placement:
    """Per-GPU sets, listed as `gpus` (server, GPU) pairs, as a Placement."""
    return Placement(
        tuple(
            tuple(frozenset(placed[gpus.index((n, g))]) for g in range(len(s.gpu_memory)))
            for n, s in enumerate(servers)
        )
    )


def smartmoe(
    servers: Sequence[Server], experts: int, expert_size: float, freq: Sequence[np.ndarray]
) -> Placement:
    """SmartMoE's placement module (Zhai et al., ATC'23), as Prism's evaluation uses it:
    every expert once, each GPU the same number of experts per layer (as memory allows),
    and within a layer the experts taken hottest first onto the GPU with the least load
    so far (its greedy load balancer). Spare memory stays empty, as in Uniform: SmartMoE
    balances, it does not replicate. The load is the activations summed over all
    servers; SmartMoE does not look at where requests come from."""
    layers = freq[0].shape[0]
    load = np.stack(list(freq)).sum(0)
    gpus = [(n, g) for n, s in enumerate(servers) for g in range(len(s.gpu_memory))]
    room = [int(servers[n].gpu_memory[g] // expert_size) for n, g in gpus]
    placed: list[set[Expert]] = [set() for _ in gpus]
    quota = math.ceil(experts / len(gpus))
    for layer in range(layers):
        taken = [0] * len(gpus)
        gpu_load = [0.0] * len(gpus)
        for e in sorted(range(experts), key=lambda x: -load[layer, x]):
            open_ = [k for k in range(len(gpus)) if room[k] > 0]
            even = [k for k in open_ if taken[k] < quota] or open_
            k = min(even, key=lambda m: (gpu_load[m], taken[m]))
            placed[k].add((layer, e))
            room[k] -= 1
            taken[k] += 1
            gpu_load[k] += float(load[layer, e])
    return _placement(servers, gpus, placed)


def eplb(
    servers: Sequence[Server], experts: int, expert_size: float, freq: Sequence[np.ndarray]
) -> Placement:
    """DeepSeek's Expert Parallelism Load Balancer (its global policy), per layer:

    1. the layer's share of the physical slots (all GPUs' memory, split evenly over the
       layers) holds every expert once, and each further slot replicates the expert
       with the highest load per replica (`replicate_experts`);
    2. the replicas, each carrying its expert's load over its replica count, are packed
       heaviest first onto the GPU with the least load that still has room
       (`balanced_packing`).

    The load is the activations summed over all servers: EPLB balances GPUs and does
    not look at where requests come from. Ported to heterogeneous GPUs (the open-source
    version assumes equal ones) as the Prism paper did: a GPU's room is its own memory.
    Two simplifications, named: a server holds an expert at most once (a second copy
    on the same server would serve no one), so replicas are capped at the number of
    servers; and the hierarchical (node-group) stage is not used, as with DeepSeek's
    own global policy when groups do not divide evenly.
    """
    layers = freq[0].shape[0]
    load = np.stack(list(freq)).sum(0)
    gpus = [(n, g) for n, s in enumerate(servers) for g in range(len(s.gpu_memory))]
    room = [int(servers[n].gpu_memory[g] // expert_size) for n, g in gpus]
    total = sum(room)
    placed: list[set[Expert]] = [set() for _ in gpus]
    for layer in range(layers):
        slots = min(total // layers + (1 if layer < total % layers else 0), experts * len(servers))
        replicas = np.ones(experts)
        for _ in range(max(0, slots - experts)):
            per_replica = np.where(replicas < len(servers), load[layer] / replicas, -1.0)
            replicas[int(np.argmax(per_replica))] += 1
        items = sorted(
            (
                (float(load[layer, e] / replicas[e]), e)
                for e in range(experts)
                for _ in range(int(replicas[e]))
            ),
            key=lambda x: -x[0],
        )
        gpu_load = [0.0] * len(gpus)
        for weight, e in items:
            on = {gpus[k][0] for k in range(len(gpus)) if (layer, e) in placed[k]}
            fits = [k for k in range(len(gpus)) if room[k] > 0 and gpus[k][0] not in on]
            if not fits:
                continue
            k = min(fits, key=lambda m: (gpu_load[m], -room[m]))
            placed[k].add((layer, e))
            room[k] -= 1
            gpu_load[k] += weight
    return _placement(servers, gpus, placed)
