"""Discrete SAC over {drop, expert 1..N} (Haarnoja et al., in its discrete-action form).

A replay buffer of padded observations; the actor and a twin critic each have their own
HAN (or, for the baseline, expert-feature) encoder; the temperature is tuned towards a
target entropy; the target critic follows by Polyak averaging.
"""

from __future__ import annotations

import copy
import math
from dataclasses import dataclass

import numpy as np
import torch
import torch.nn.functional as F
from torch import Tensor

from edgeroute.qos.model import QoSNet, TwinCritic
from policies.qos_state import INPUTS


@dataclass(frozen=True)
class SACConfig:
    encoder: str = "han"  # or "experts" for Baseline RL
    hidden: int = 64
    heads: int = 4
    layers: int = 2
    gamma: float = 0.99
    tau: float = 0.005
    lr: float = 3e-4
    batch: int = 64
    buffer: int = 100_000
    target_entropy_ratio: float = 0.5  # of log(number of actions)


class Replay:
    def __init__(self, capacity: int, example: dict[str, np.ndarray]) -> None:
        self.capacity = capacity
        self.obs = {k: np.zeros((capacity, *v.shape), np.float32) for k, v in example.items()}
        self.next = {k: np.zeros((capacity, *v.shape), np.float32) for k, v in example.items()}
        self.action = np.zeros(capacity, np.int64)
        self.reward = np.zeros(capacity, np.float32)
        self.done = np.zeros(capacity, np.float32)
        self.size = self.i = 0

    def add(
        self,
        obs: dict[str, np.ndarray],
        action: int,
        reward: float,
        nxt: dict[str, np.ndarray],
        done: bool,
    ) -> None:
        i = self.i
        for k in self.obs:
            self.obs[k][i] = obs[k]
            self.next[k][i] = nxt[k]
        self.action[i], self.reward[i], self.done[i] = action, reward, float(done)
        self.i = (i + 1) % self.capacity
        self.size = min(self.size + 1, self.capacity)

    def sample(
        self, n: int, rng: np.random.Generator
    ) -> tuple[list[Tensor], Tensor, Tensor, list[Tensor], Tensor]:
        idx = rng.integers(0, self.size, n)
        obs = [torch.from_numpy(self.obs[k][idx]) for k in INPUTS]
        nxt = [torch.from_numpy(self.next[k][idx]) for k in INPUTS]
        return (
            obs,
            torch.from_numpy(self.action[idx]),
            torch.from_numpy(self.reward[idx]),
            nxt,
            torch.from_numpy(self.done[idx]),
        )


def batch_of(obs: dict[str, np.ndarray]) -> list[Tensor]:
    return [torch.from_numpy(obs[k][None]) for k in INPUTS]


class SAC:
    def __init__(self, config: SACConfig, n_actions: int) -> None:
        c = config
        self.config = c
        self.actor = QoSNet(c.encoder, c.hidden, c.heads, c.layers)
        self.critic = TwinCritic(c.encoder, c.hidden, c.heads, c.layers)
        self.target = copy.deepcopy(self.critic).requires_grad_(False)
        self.log_alpha = torch.zeros(1, requires_grad=True)
        self.opt_actor = torch.optim.Adam(self.actor.parameters(), lr=c.lr)
        self.opt_critic = torch.optim.Adam(self.critic.parameters(), lr=c.lr)
        self.opt_alpha = torch.optim.Adam([self.log_alpha], lr=c.lr)
        self.target_entropy = c.target_entropy_ratio * math.log(n_actions)

    @property
    def alpha(self) -> Tensor:
        return self.log_alpha.exp()

    @torch.no_grad()
    def act(self, obs: dict[str, np.ndarray], greedy: bool, rng: np.random.Generator) -> int:
        logits = self.actor(*batch_of(obs))[0]
        if greedy:
            return int(torch.argmax(logits))
        p = torch.softmax(logits, -1).numpy().astype(np.float64)
        return int(rng.choice(len(p), p=p / p.sum()))

    def update(self, replay: Replay, rng: np.random.Generator) -> dict[str, float]:
        c = self.config
        obs, action, reward, nxt, done = replay.sample(c.batch, rng)
        with torch.no_grad():
            logits_next = self.actor(*nxt)
            p_next = torch.softmax(logits_next, -1)
            logp_next = torch.log(p_next + 1e-8)
            q1t, q2t = self.target(*nxt)
            v_next = (p_next * (torch.min(q1t, q2t) - self.alpha * logp_next)).sum(-1)
            target = reward + c.gamma * (1.0 - done) * v_next
        q1, q2 = self.critic(*obs)
        a = action.unsqueeze(-1)
        loss_q = F.mse_loss(q1.gather(-1, a).squeeze(-1), target) + F.mse_loss(
            q2.gather(-1, a).squeeze(-1), target
        )
        self.opt_critic.zero_grad()
        loss_q.backward()
        self.opt_critic.step()

        logits = self.actor(*obs)
        p = torch.softmax(logits, -1)
        logp = torch.log(p + 1e-8)
        with torch.no_grad():
            q = torch.min(*self.critic(*obs))
        loss_pi = (p * (self.alpha.detach() * logp - q)).sum(-1).mean()
        self.opt_actor.zero_grad()
        loss_pi.backward()
        self.opt_actor.step()

        entropy = -(p * logp).sum(-1).detach()
        loss_alpha = (self.log_alpha * (entropy - self.target_entropy)).mean()
        self.opt_alpha.zero_grad()
        loss_alpha.backward()
        self.opt_alpha.step()

        with torch.no_grad():
            for t, s in zip(self.target.parameters(), self.critic.parameters(), strict=True):
                t.mul_(1 - c.tau).add_(s, alpha=c.tau)
        return {
            "loss_q": loss_q.item(),
            "loss_pi": loss_pi.item(),
            "alpha": self.alpha.item(),
            "entropy": entropy.mean().item(),
        }
