"""Control answers only the orchestrator: every call carries the agent's token.

The orchestrator gives an agent its token in the environment (TOKEN_ENV), not on the
command line: a netns lab's agents are host processes, and any local user can read another
process's arguments, but only its owner (and root) its environment. Calls carry it as
`authorization: Bearer <token>` metadata; a call without it, or with another, ends in
UNAUTHENTICATED before any method runs.
"""

from __future__ import annotations

import hmac
from typing import Awaitable, Callable

import grpc

TOKEN_ENV = "TESTBED_AGENT_TOKEN"
METADATA_KEY = "authorization"
SCHEME = "Bearer "


def metadata(token: str) -> tuple[tuple[str, str], ...]:
    return ((METADATA_KEY, SCHEME + token),)


class TokenCheck(grpc.aio.ServerInterceptor):
    """Refuses every call whose metadata does not carry `token` (compared in constant time)."""

    def __init__(self, token: str) -> None:
        self.expected = (SCHEME + token).encode()

    async def intercept_service(
        self,
        continuation: Callable[[grpc.HandlerCallDetails], Awaitable[grpc.RpcMethodHandler]],
        details: grpc.HandlerCallDetails,
    ) -> grpc.RpcMethodHandler:
        given = dict(details.invocation_metadata or ()).get(METADATA_KEY)
        if given is not None and hmac.compare_digest(str(given).encode(), self.expected):
            return await continuation(details)
        reason = "no token" if given is None else "a wrong token"
        return _refusal(f"{details.method} refused: {reason} (Control calls must carry the token this agent was "
                        f"started with; the orchestrator that started it holds it)")


def _refusal(message: str) -> grpc.RpcMethodHandler:
    # every Control method is unary-unary; the request is left undecoded
    async def refuse(request: bytes, context: grpc.aio.ServicerContext) -> None:
        await context.abort(grpc.StatusCode.UNAUTHENTICATED, message)

    return grpc.unary_unary_rpc_method_handler(refuse)
