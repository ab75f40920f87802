"""An upper bound on any router's average QoS in an episode of the edge simulator.

No request can do better than it would alone: on an idle expert its first iteration
starts at its arrival, and every iteration it takes part in lasts at least as long as
its own prefill and context make it (others in the batch only add to both, a queue only
delays it). With a prefix cache the prefill can be as small as one token, so the bound
assumes the cache held the whole prompt. The bound gives each request the best, over
the experts, of its real score if its latency per token alone meets L, else 0: what a
router that knew every answer's quality and length, and never met a queue, would earn.
It reads the truth and ignores contention, so no policy reaches it; what it shows is
how much room there is above a policy at a setting (docs/research.md, (205)).
"""

from __future__ import annotations

import statistics

from edgeroute.qos.evaluate import Score
from edgeroute.sim.edge import EdgeEnv
from edgeroute.sim.timeline import alone_latency

# Rounding: the simulator sums iteration by iteration what `alone_latency` sums in
# closed form, so the bound lets a latency this close above L count as met.
SLACK = 1e-9


def best_alone(env: EdgeEnv) -> tuple[float, float]:
    """The waiting arrival's bound (its best QoS alone over the experts, by the real
    scores and lengths) and the latency per token that gives it (that of its fastest
    expert when no expert scores)."""
    options = []
    for n, spec in enumerate(env.specs):
        req = env.request_for(n)
        latency = alone_latency(spec, req.prompt_tokens, req.length, env.prefix_cache)
        met = latency <= env.L * (1 + SLACK)
        options.append((req.score * met, -latency))
    qos, neg_latency = max(options)
    return qos, -neg_latency


def contention_free(env: EdgeEnv, seeds: list[int]) -> Score:
    """The bound over each of `seeds`' episodes, as `evaluate` scores a policy: the mean
    bound per arrival, the mean latency per token the bound assumes, and the share of
    arrivals no expert could serve with a QoS above 0 even alone. The episodes' arrivals
    do not depend on the routing, so they are those every policy meets; each is dropped
    once bounded, which leaves the experts idle and costs nothing to simulate."""
    qos, latency, lost = [], [], []
    for seed in seeds:
        env.reset(seed)
        bounds = []
        done = False
        while not done:
            bounds.append(best_alone(env))
            _, done = env.step(0)
        qos.append(statistics.fmean(q for q, _ in bounds))
        latency.append(statistics.fmean(t for _, t in bounds))
        lost.append(sum(q == 0 for q, _ in bounds) / len(bounds))
    return Score(statistics.fmean(qos), statistics.fmean(latency) * 1e3, statistics.fmean(lost))
