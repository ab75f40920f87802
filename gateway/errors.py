"""OpenAI-shaped errors: `{"error": {"message", "type", "param", "code"}}`."""

from __future__ import annotations

import orjson
from starlette.responses import Response

_TYPES = {
    400: "invalid_request_error",
    401: "authentication_error",
    404: "not_found_error",
    409: "conflict_error",
    413: "invalid_request_error",
    429: "rate_limit_error",
    502: "api_error",
    503: "service_unavailable",
    504: "timeout_error",
}


class GatewayError(Exception):
    """Raised anywhere on the request path; becomes one OpenAI-style error response."""

    def __init__(
        self,
        status: int,
        message: str,
        *,
        param: str | None = None,
        code: str | None = None,
        retry_after: float | None = None,
    ) -> None:
        super().__init__(message)
        self.status = status
        self.message = message
        self.param = param
        self.code = code
        self.retry_after = retry_after

    def payload(self) -> dict[str, object]:
        return {
            "error": {
                "message": self.message,
                "type": _TYPES.get(self.status, "api_error"),
                "param": self.param,
                "code": self.code,
            }
        }

    def response(self, headers: dict[str, str] | None = None) -> Response:
        hdrs = dict(headers or {})
        if self.retry_after is not None:
            hdrs["retry-after"] = str(max(1, round(self.retry_after)))
        if self.status == 401:
            hdrs["www-authenticate"] = "Bearer"
        return Response(
            orjson.dumps(self.payload()),
            status_code=self.status,
            media_type="application/json",
            headers=hdrs,
        )

    def sse_event(self) -> bytes:
        return b"data: " + orjson.dumps(self.payload()) + b"\n\n"
