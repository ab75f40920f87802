"""The HAN state encoder and the actor and critic heads (the QoS paper, section V-B).

The heterogeneous graph has four node types: the arrived request, the experts, and
each expert's running and waiting requests. Each layer does node-level attention per
relation (running->expert, waiting->expert, arrived->expert, expert->arrived; a
request node hears its own expert), then semantic-level attention that weighs the
relations. The paper uses 2 layers, 4 heads and hidden 64; the trainer's defaults
(`edgeroute.qos.config.SACConfig`) are 1 layer, 2 heads and hidden 32, for the serving
budget and the training speed (see `docs/research.md`). Everything is dense, padded tensors with masks, so
the batch trains in one pass (the served ONNX graph is written from these weights by
`edgeroute.qos.export`).

With `load`, an encoder also reads the load (`policies.qos_state.load_feature`): the
HAN adds its own embedding of it to the arrived request's, Baseline RL appends it to
every expert's features. Without it, the `load` input is read by nothing.

Heads are pointer-style: expert n's logit (or Q-value) is read from the pair
(arrived embedding, expert n's embedding), and `drop` from the arrived embedding, so
one trained model serves any number of experts.
"""

from __future__ import annotations

import torch
from torch import Tensor, nn

from policies.qos_state import F_EXPERT, F_REQ, INPUTS

NEG = -1e9
MASK, LOAD = INPUTS.index("expert_mask"), INPUTS.index("load")  # positions in an observation


def head_membership(hidden: int, heads: int) -> Tensor:
    """[hidden, heads]: 1 where feature d belongs to head h (contiguous blocks)."""
    member = torch.zeros(hidden, heads)
    member[torch.arange(hidden), torch.arange(hidden) // (hidden // heads)] = 1.0
    return member


class NodeAttention(nn.Module):
    """Multi-head attention of target nodes over their (masked) neighbours."""

    def __init__(self, hidden: int, heads: int) -> None:
        super().__init__()
        self.heads, self.d = heads, hidden // heads
        self.q, self.k, self.v = (nn.Linear(hidden, hidden) for _ in range(3))
        # Sums per head and spreads a head's weight back over its features, with no
        # reshape of the batch shape.
        member = head_membership(hidden, heads)
        self.member: Tensor
        self.register_buffer("member", member, persistent=False)
        self.scaled: Tensor  # member / sqrt(d): the per-head sum and the scaling in one
        self.register_buffer("scaled", member / self.d**0.5, persistent=False)

    def forward(self, target: Tensor, neigh: Tensor, mask: Tensor) -> Tensor:
        # target [..., H], neigh [..., K, H], mask [..., K]; products broadcast rather
        # than batched matmuls of tiny matrices (K <= 12 keys of d <= 16).
        q = self.q(target).unsqueeze(-2)  # [..., 1, H]
        m = mask.unsqueeze(-1)  # [..., K, 1]
        scores = (q * self.k(neigh)) @ self.scaled + (1.0 - m) * NEG
        attn = torch.softmax(scores, dim=-2) * m  # [..., K, heads]; all-masked rows -> 0
        out: Tensor = ((attn @ self.member.T) * self.v(neigh)).sum(-2)
        return out


def queue_attention(
    relations: tuple[NodeAttention, ...],
    target: Tensor,
    queues: Tensor,
    mask: Tensor,
    embed: nn.Linear | None = None,
) -> Tensor:
    """Each expert's attention over its running and waiting queues in one pass: queue r
    is heard through relations[r]'s weights, as that NodeAttention would. target
    [B, N, H], queues [B, N, R, K, H], mask [B, N, R, K] -> [B, N, R, H]. `embed`, if
    given, is the linear embedding the queues (then raw features) have yet to go
    through: it is folded into the key and value projections. The served graph's cost
    is mostly its operations on queue-sized tensors, hence one product per projection
    for both queues and no separate embedding."""

    def stacked(name: str) -> tuple[Tensor, Tensor]:
        layers: list[nn.Linear] = [getattr(r, name) for r in relations]
        weight = torch.stack([x.weight.T for x in layers])  # [R, H, H]
        return weight, torch.stack([x.bias for x in layers])  # [R, H]

    (wq, bq), (wk, bk), (wv, bv) = stacked("q"), stacked("k"), stacked("v")
    if embed is not None:  # (x W_e + b_e) W + b = x (W_e W) + (b_e W + b)
        w_e, b_e = embed.weight.T, embed.bias
        wk, bk = w_e @ wk, b_e @ wk + bk
        wv, bv = w_e @ wv, b_e @ wv + bv
    first = relations[0]
    # einsum keeps each relation's weights one matrix instead of expanding them per
    # expert (twice as fast under autograd as broadcast products)
    q = (torch.einsum("bnh,rhg->bnrg", target, wq) + bq).unsqueeze(-2)
    keys = torch.einsum("bnrkd,rdh->bnrkh", queues, wk) + bk[:, None, :]
    values = torch.einsum("bnrkd,rdh->bnrkh", queues, wv) + bv[:, None, :]
    m = mask.unsqueeze(-1)  # [B, N, R, K, 1]
    scores = (q * keys) @ first.scaled + (1.0 - m) * NEG
    attn = torch.softmax(scores, dim=-2) * m  # [B, N, R, K, heads]
    out: Tensor = ((attn @ first.member.T) * values).sum(-2)
    return out


class SemanticAttention(nn.Module):
    """Weighs relation-specific embeddings with one weight per relation (HAN)."""

    def __init__(self, hidden: int) -> None:
        super().__init__()
        self.proj = nn.Linear(hidden, hidden)
        self.q = nn.Linear(hidden, 1, bias=False)

    def forward(self, z: Tensor, mask: Tensor | None = None) -> Tensor:
        # z [B, M, R, H] (M nodes, R relations), mask [B, M] (None: every node is valid)
        w = self.q(torch.tanh(self.proj(z))).squeeze(-1)  # [B, M, R]
        if mask is None:
            w = w.mean(1)
        else:
            denom = mask.sum(-1, keepdim=True).clamp(min=1.0)
            w = (w * mask.unsqueeze(-1)).sum(1) / denom  # [B, R]: averaged over valid nodes
        beta = torch.softmax(w, dim=-1)
        return (z * beta[:, None, :, None]).sum(2)


class HANLayer(nn.Module):
    def __init__(self, hidden: int, heads: int) -> None:
        super().__init__()
        self.run_to_exp = NodeAttention(hidden, heads)
        self.wait_to_exp = NodeAttention(hidden, heads)
        self.arr_to_exp = nn.Linear(hidden, hidden)  # one neighbour: attention weight 1
        self.exp_self = nn.Linear(hidden, hidden)
        self.exp_sem = SemanticAttention(hidden)
        self.exp_to_arr = NodeAttention(hidden, heads)
        self.arr_self = nn.Linear(hidden, hidden)
        self.arr_sem = SemanticAttention(hidden)
        self.req_self = nn.Linear(hidden, hidden)
        self.req_from_exp = nn.Linear(hidden, hidden)
        self.act = nn.ELU()

    def forward(
        self,
        arr: Tensor,
        exp: Tensor,
        req: Tensor,
        m_exp: Tensor,
        m_req: Tensor,
        last: bool = False,
        embed: nn.Linear | None = None,
    ) -> tuple[Tensor, Tensor, Tensor]:
        # Relations into an expert: its running queue, its waiting queue, the arrived
        # request, itself. req [B, N, 2, K, H] holds both queues; the first layer gets
        # them as features, with the `embed` to apply.
        relations = (self.run_to_exp, self.wait_to_exp)
        from_queues = queue_attention(relations, exp, req, m_req, embed)
        others = torch.stack(
            [self.arr_to_exp(arr).unsqueeze(1).expand_as(exp), self.exp_self(exp)], 2
        )
        new_exp = self.act(self.exp_sem(torch.cat([from_queues, others], dim=2), m_exp))
        z_arr = torch.stack([self.exp_to_arr(arr, exp, m_exp), self.arr_self(arr)], dim=1)
        new_arr = self.act(self.arr_sem(z_arr.unsqueeze(1)))
        new_arr = new_arr.squeeze(1)
        if last:  # the heads read the arrived and expert nodes only
            return new_arr, new_exp * m_exp.unsqueeze(-1), req
        if embed is not None:
            req = embed(req)
        from_exp = self.req_from_exp(exp)[:, :, None, None, :]
        new_req = self.act(self.req_self(req) + from_exp) * m_req.unsqueeze(-1)
        return new_arr, new_exp * m_exp.unsqueeze(-1), new_req


class HANEncoder(nn.Module):
    def __init__(
        self, hidden: int = 64, heads: int = 4, layers: int = 2, load: bool = False
    ) -> None:
        super().__init__()
        self.in_req = nn.Linear(F_REQ, hidden)
        self.in_load = nn.Linear(1, hidden, bias=False) if load else None
        self.in_exp = nn.Linear(F_EXPERT, hidden)
        self.layers = nn.ModuleList(HANLayer(hidden, heads) for _ in range(layers))
        self.hidden = hidden

    def forward(
        self,
        arrived: Tensor,
        experts: Tensor,
        queues: Tensor,
        expert_mask: Tensor,
        queue_mask: Tensor,
        load: Tensor,
    ) -> tuple[Tensor, Tensor]:
        # Padded nodes are not zeroed here: attention and the semantic average leave
        # them out by their masks, and every layer zeroes its outputs' padding.
        arr = self.in_req(arrived)
        if self.in_load is not None:
            arr = arr + self.in_load(load)
        exp = self.in_exp(experts)
        req = queues  # embedded by the first layer, folded into its attention
        for i, layer in enumerate(self.layers):
            arr, exp, req = layer(
                arr,
                exp,
                req,
                expert_mask,
                queue_mask,
                last=i == len(self.layers) - 1,
                embed=self.in_req if i == 0 else None,
            )
        return arr, exp


class ExpertFeatureEncoder(nn.Module):
    """Baseline RL's state: expert-level features only (memory, running, waiting, and
    the measured seconds per token the HAN state also has; with `load`, the load)."""

    def __init__(self, hidden: int = 64, load: bool = False) -> None:
        super().__init__()
        self.net = nn.Sequential(
            nn.Linear(4 + int(load), hidden), nn.ReLU(), nn.Linear(hidden, hidden), nn.ReLU()
        )
        self.hidden = hidden
        self.load = load

    def forward(
        self,
        arrived: Tensor,
        experts: Tensor,
        queues: Tensor,
        expert_mask: Tensor,
        queue_mask: Tensor,
        load: Tensor,
    ) -> tuple[Tensor, Tensor]:
        columns = [experts[..., :3], experts[..., 5:6]]
        if self.load:
            columns.append(load.unsqueeze(1).expand(-1, experts.shape[1], -1))
        level = torch.cat(columns, dim=-1)
        exp = self.net(level) * expert_mask.unsqueeze(-1)
        arr = exp.sum(1) / expert_mask.sum(1, keepdim=True).clamp(min=1.0)
        return arr, exp


def _mlp(inp: int, hidden: int) -> nn.Sequential:
    return nn.Sequential(nn.Linear(inp, hidden), nn.ReLU(), nn.Linear(hidden, 1))


class PointerHead(nn.Module):
    """One output per action: drop from the arrived embedding, expert n from the pair."""

    def __init__(self, hidden: int) -> None:
        super().__init__()
        self.drop = _mlp(hidden, hidden)
        self.expert = _mlp(2 * hidden, hidden)

    def forward(self, arr: Tensor, exp: Tensor, expert_mask: Tensor, masked: float) -> Tensor:
        pair = torch.cat([arr.unsqueeze(1).expand_as(exp), exp], dim=-1)
        per_expert = self.expert(pair).squeeze(-1)
        per_expert = per_expert * expert_mask + (1.0 - expert_mask) * masked
        return torch.cat([self.drop(arr), per_expert], dim=-1)  # [B, 1 + N]

    def forbid_drop(self) -> None:
        """Make the drop an action never taken: its output a constant NEG, out of
        training. The output stays, so every actor has the same graph and outputs."""
        last = self.drop[2]
        assert isinstance(last, nn.Linear)
        with torch.no_grad():
            last.weight.zero_()
            last.bias.fill_(NEG)
        self.drop.requires_grad_(False)


def make_encoder(encoder: str, hidden: int, heads: int, layers: int, load: bool) -> nn.Module:
    """The HAN ("han") or Baseline RL's expert-feature encoder ("experts")."""
    if encoder == "han":
        return HANEncoder(hidden, heads, layers, load)
    return ExpertFeatureEncoder(hidden, load)


class QoSNet(nn.Module):
    """Encoder + pointer head: the actor (logits) or a critic (Q-values)."""

    def __init__(
        self,
        encoder: str = "han",
        hidden: int = 64,
        heads: int = 4,
        layers: int = 2,
        critic: bool = False,
        load: bool = False,
    ) -> None:
        super().__init__()
        self.encoder = make_encoder(encoder, hidden, heads, layers, load)
        self.head = PointerHead(hidden)
        self.masked = 0.0 if critic else NEG

    def forward(
        self,
        arrived: Tensor,
        experts: Tensor,
        queues: Tensor,
        expert_mask: Tensor,
        queue_mask: Tensor,
        load: Tensor,
    ) -> Tensor:
        arr, exp = self.encoder(arrived, experts, queues, expert_mask, queue_mask, load)
        out: Tensor = self.head(arr, exp, expert_mask, self.masked)
        return out


class TwinCritic(nn.Module):
    """Two Q heads on one encoder: the clipped double-Q of SAC at the cost of one encoder.

    With `head_load`, the heads alone read the load (their own embedding of it added to
    the arrived request's): an encoder shared with the actor stays as without it, so
    the critic judges with what the actor is not given (an asymmetric actor-critic)."""

    def __init__(
        self,
        encoder: str = "han",
        hidden: int = 64,
        heads: int = 4,
        layers: int = 2,
        load: bool = False,
        head_load: bool = False,
    ) -> None:
        super().__init__()
        self.encoder = make_encoder(encoder, hidden, heads, layers, load)
        self.in_load = nn.Linear(1, hidden, bias=False) if head_load else None
        self.q1, self.q2 = PointerHead(hidden), PointerHead(hidden)

    def forward(self, *obs: Tensor) -> tuple[Tensor, Tensor]:
        arr, exp = self.encoder(*obs)
        return self.heads(arr, exp, obs[MASK], obs[LOAD])

    def heads(
        self, arr: Tensor, exp: Tensor, expert_mask: Tensor, load: Tensor
    ) -> tuple[Tensor, Tensor]:
        if self.in_load is not None:
            arr = arr + self.in_load(load)
        return self.q1(arr, exp, expert_mask, 0.0), self.q2(arr, exp, expert_mask, 0.0)
