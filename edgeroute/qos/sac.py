"""Discrete SAC over {drop, expert 1..N} (Haarnoja et al., in its discrete-action form).

A replay buffer of padded observations; one HAN (or, for Baseline RL, expert-feature)
encoder shared by the twin critic and the actor; the temperature is tuned towards a
target entropy; the target critic follows by Polyak averaging.

Where this departs from the letter of SAC, for speed on a CPU (see
`docs/research.md`, the QoS router's "Training"): the encoder learns from the critic's
loss only and the actor's head reads it detached (as in SAC-AE and DrQ), so an
update runs three encoder passes instead of five; and the actor's loss uses the Q
values of the critic's own pass.
"""

from __future__ import annotations

import copy
import math
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F
from torch import Tensor

from edgeroute.qos.config import SACConfig
from edgeroute.qos.model import LOAD, MASK, NEG, QoSNet, TwinCritic
from policies.qos_action import drawn
from policies.qos_state import INPUTS


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

    def state_dict(self) -> dict[str, Any]:
        n = self.size
        return {
            "obs": {k: v[:n].copy() for k, v in self.obs.items()},
            "next": {k: v[:n].copy() for k, v in self.next.items()},
            "action": self.action[:n].copy(),
            "reward": self.reward[:n].copy(),
            "done": self.done[:n].copy(),
            "i": self.i,
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        n = len(state["action"])
        for k in self.obs:
            self.obs[k][:n] = state["obs"][k]
            self.next[k][:n] = state["next"][k]
        self.action[:n], self.reward[:n], self.done[:n] = (
            state["action"],
            state["reward"],
            state["done"],
        )
        self.size, self.i = n, int(state["i"])


def batch_of(obs: dict[str, np.ndarray]) -> list[Tensor]:
    """Tensors for one observation or, when already stacked, a batch of them."""
    one = obs["arrived"].ndim == 1
    return [torch.from_numpy(obs[k][None] if one else obs[k]) for k in INPUTS]


def stack(observations: list[dict[str, np.ndarray]]) -> dict[str, np.ndarray]:
    return {k: np.stack([o[k] for o in observations]) for k in INPUTS}


class SAC:
    def __init__(self, config: SACConfig, experts: int) -> None:
        c = config
        self.config = c
        self.critic = TwinCritic(c.encoder, c.hidden, c.heads, c.layers, c.load, c.critic_load)
        self.actor = QoSNet(c.encoder, c.hidden, c.heads, c.layers, load=c.load)
        self.actor.encoder = self.critic.encoder  # shared; trained by the critic's loss
        if not c.drop:
            self.actor.head.forbid_drop()
        self.target = copy.deepcopy(self.critic).requires_grad_(False)
        self.log_alpha = torch.full((1,), math.log(c.init_alpha), requires_grad=True)
        self.opt_actor = torch.optim.Adam(self.actor.head.parameters(), lr=c.lr)
        self.opt_critic = torch.optim.Adam(self.critic.parameters(), lr=c.lr)
        self.opt_alpha = torch.optim.Adam([self.log_alpha], lr=c.lr)
        # The target entropy by fleet size (`target_entropy[n]`, n up to `experts`, the
        # largest fleet trained on): a share of the most a policy over n experts (and
        # the drop) can have, so that episodes of several sizes each get their own.
        self.target_entropy = torch.tensor(
            [c.target_entropy_ratio * math.log(max(1, n + int(c.drop))) for n in range(experts + 1)]
        )

    @property
    def alpha(self) -> Tensor:
        return self.log_alpha.exp()

    @torch.no_grad()
    def act(self, obs: dict[str, np.ndarray], greedy: bool, rng: np.random.Generator) -> int:
        return int(self.act_batch(obs, greedy, rng)[0])

    @torch.no_grad()
    def act_batch(
        self, obs: dict[str, np.ndarray], greedy: bool, rng: np.random.Generator
    ) -> np.ndarray:
        """One action per observation of a batch (or of a single observation)."""
        logits = self.actor(*batch_of(obs)).numpy().astype(np.float64)
        if greedy:
            return np.asarray(logits.argmax(-1))
        return drawn(logits, rng.random((len(logits), 1)))

    def update(self, replay: Replay, rng: np.random.Generator) -> dict[str, float]:
        c = self.config
        obs, action, reward, nxt, done = replay.sample(c.batch, rng)
        with torch.no_grad():
            arr_n, exp_n = self.critic.encoder(*nxt)
            p_next = torch.softmax(self.actor.head(arr_n, exp_n, nxt[MASK], NEG), -1)
            logp_next = torch.log(p_next + 1e-8)
            q1t, q2t = self.target(*nxt)
            v_next = (p_next * (torch.min(q1t, q2t) - self.alpha * logp_next)).sum(-1)
            target = reward + c.gamma * (1.0 - done) * v_next
        arr, exp = self.critic.encoder(*obs)
        q1, q2 = self.critic.heads(arr, exp, obs[MASK], obs[LOAD])
        a = action.unsqueeze(-1)
        loss_q = F.mse_loss(q1.gather(-1, a).squeeze(-1), target) + F.mse_loss(
            q2.gather(-1, a).squeeze(-1), target
        )
        self.opt_critic.zero_grad()
        loss_q.backward()
        self.opt_critic.step()

        logits = self.actor.head(arr.detach(), exp.detach(), obs[MASK], NEG)
        p = torch.softmax(logits, -1)
        logp = torch.log(p + 1e-8)
        q = torch.min(q1, q2).detach()
        loss_pi = (p * (self.alpha.detach() * logp - q)).sum(-1).mean()
        self.opt_actor.zero_grad()
        loss_pi.backward()
        self.opt_actor.step()

        entropy = -(p * logp).sum(-1).detach()
        target = self.target_entropy[obs[MASK].sum(-1).long()]
        loss_alpha = (self.log_alpha * (entropy - target)).mean()
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
            "q": q.mean().item(),
        }

    def state_dict(self) -> dict[str, Any]:
        return {
            "actor_head": self.actor.head.state_dict(),
            "critic": self.critic.state_dict(),
            "target": self.target.state_dict(),
            "log_alpha": self.log_alpha.detach().clone(),
            "opt_actor": self.opt_actor.state_dict(),
            "opt_critic": self.opt_critic.state_dict(),
            "opt_alpha": self.opt_alpha.state_dict(),
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.actor.head.load_state_dict(state["actor_head"])
        self.critic.load_state_dict(state["critic"])
        self.target.load_state_dict(state["target"])
        with torch.no_grad():
            self.log_alpha.copy_(state["log_alpha"])
        self.opt_actor.load_state_dict(state["opt_actor"])
        self.opt_critic.load_state_dict(state["opt_critic"])
        self.opt_alpha.load_state_dict(state["opt_alpha"])
