"""Example plugins: `pinned`, a scorer that prefers the backends named in its
parameters; `pinned_only`, a whole policy that sends every request to the first
named backend that passes the usual filters (503 when none does); and `outcome_log`,
a request hook that appends one JSON line per finished attempt to a file."""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, ClassVar

from gateway.hooks import Dispatch, Outcome
from policies import (
    BackendView,
    ClusterView,
    Decision,
    Need,
    PluginError,
    RequestInfo,
    check_params,
)
from policies.filters import Healthy, ServesModel


@dataclass(frozen=True)
class Pinned:
    backends: tuple[str, ...]
    name: str = "pinned"
    # Nothing the gateway must work out for it (see policies.plugins.Need).
    needs: ClassVar[frozenset[Need]] = frozenset()

    def score(
        self, req: RequestInfo, view: ClusterView, candidates: Sequence[BackendView]
    ) -> list[float]:
        return [1.0 if b.id in self.backends else 0.0 for b in candidates]


def _backends(params: Mapping[str, Any]) -> tuple[str, ...]:
    check_params(params, ("backends",))
    names = params.get("backends")
    if not isinstance(names, list) or not all(isinstance(n, str) for n in names) or not names:
        raise PluginError("'backends' must be a non-empty list of backend ids")
    return tuple(names)


def make_scorer(params: Mapping[str, Any]) -> Pinned:
    return Pinned(_backends(params))


@dataclass(frozen=True)
class PinnedOnly:
    backends: tuple[str, ...]
    name: str = "pinned_only"
    needs: ClassVar[frozenset[Need]] = frozenset()

    def decide(self, req: RequestInfo, view: ClusterView) -> Decision:
        return self.ranked(req, view)[0]

    def ranked(self, req: RequestInfo, view: ClusterView) -> tuple[Decision, ...]:
        """The pinned backends that can serve, in the order given (retries walk it)."""
        filters = (Healthy(), ServesModel())
        ok = {b.id for b in view.backends if all(f.keep(req, view, b) for f in filters)}
        order = tuple(Decision(b) for b in self.backends if b in ok)
        return order or (Decision(None, reason="none of the pinned backends can serve"),)


def make_policy(params: Mapping[str, Any]) -> PinnedOnly:
    return PinnedOnly(_backends(params))


class OutcomeLog:
    """Appends `{"rid", "backend", "status", "tokens"}` per attempt that ended."""

    def __init__(self, path: str) -> None:
        self.path = path

    def dispatched(self, d: Dispatch) -> None:
        pass

    def first_byte(self, d: Dispatch) -> None:
        pass

    def ended(self, d: Dispatch, outcome: Outcome | None) -> None:
        line = {
            "rid": d.rid,
            "backend": d.backend.id,
            "status": outcome.status if outcome is not None else None,
            "tokens": outcome.tokens if outcome is not None else 0,
        }
        with open(self.path, "a") as f:  # an example: a real hook would not block
            f.write(json.dumps(line) + "\n")


def make_outcome_log(params: Mapping[str, Any]) -> OutcomeLog:
    check_params(params, ("path",))
    path = params.get("path")
    if not isinstance(path, str) or not path:
        raise PluginError("'path' must name a file")
    return OutcomeLog(path)
