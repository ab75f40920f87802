"""Bearer tokens, compared in constant time."""

from __future__ import annotations

import hmac
from collections.abc import Sequence

from pydantic import SecretStr

from gateway.errors import GatewayError


def bearer(authorization: str | None) -> str | None:
    if not authorization:
        return None
    scheme, _, token = authorization.partition(" ")
    if scheme.lower() != "bearer" or not token:
        return None
    return token.strip()


def token_matches(given: str | None, expected: Sequence[SecretStr]) -> bool:
    """True when `given` equals one of `expected`; every candidate is compared in full."""
    if given is None:
        return False
    probe = given.encode()
    ok = False
    for secret in expected:
        ok |= hmac.compare_digest(probe, secret.get_secret_value().encode())
    return ok


def require_admin(authorization: str | None, token: SecretStr | None) -> None:
    if token is None or not token_matches(bearer(authorization), [token]):
        raise GatewayError(401, "a valid admin bearer token is required", code="invalid_token")


def require_client_key(authorization: str | None, keys: Sequence[SecretStr]) -> None:
    if keys and not token_matches(bearer(authorization), keys):
        raise GatewayError(401, "Incorrect or missing API key.", code="invalid_api_key")
