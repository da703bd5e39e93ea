"""Who is asking: tokens, roles and pinned tenants.

With no `[[auth.tokens]]` the broker is open and every caller may do
everything. With any, each message carries a token: a missing or unknown
one is `UNAUTHENTICATED`; a role doing what it may not is
`PERMISSION_DENIED` (clients submit, wait, ask for status or an explanation, and cancel;
workers serve pools; viewers only look: the broker's statistics, a task's
status, the web dashboard; admins do everything). A token pinned to a tenant
covers that tenant's subtree: pinned to `acme`, it may submit as `acme` or
any `acme/...` tenant and see their tasks; pinned to `acme/search`, only
that subtree. Presented tokens are looked up by their SHA-256 digest, so the lookup takes
the same time however much of a secret a caller guessed right; secrets are
never logged or echoed.
"""

from __future__ import annotations

import hashlib
import hmac
from dataclasses import dataclass
from typing import Any, Iterable

from cronoq.broker.config import TokenSpec
from cronoq.errors import PermissionDenied, Unauthenticated

CLIENT, WORKER, ADMIN, VIEWER = "client", "worker", "admin", "viewer"

# What each role may do. Admin may do everything.
CLIENT_ACTIONS = frozenset({"submit", "wait", "unwait", "status", "explain", "cancel", "ping"})
WORKER_ACTIONS = frozenset({"serve", "ping"})
# A viewer reads what an on-call person needs and changes nothing. Not `wait`: results are the tenants' data.
VIEWER_ACTIONS = frozenset({"stats", "status", "explain", "ping", "dashboard"})

# How a refusal names each action: "a client token may not <phrase>".
ACTION_PHRASES = {
    "submit": "submit tasks",
    "wait": "wait for results",
    "unwait": "stop waiting for results",
    "status": "ask for a task's status",
    "explain": "ask why a task waits",
    "cancel": "cancel tasks",
    "pause": "pause a pool",
    "resume": "resume a pool",
    "stats": "ask for the broker's statistics",
    "reload": "reload the broker's config",
    "serve": "serve pools",
    "ping": "ping the broker",
    "dashboard": "read the web dashboard",
}

_ACTIONS_OF_ROLE = {CLIENT: CLIENT_ACTIONS, WORKER: WORKER_ACTIONS, VIEWER: VIEWER_ACTIONS}


def _roles_allowed(action: str) -> str:
    """The roles that may do `action`, as a phrase: "a worker or admin"."""
    roles = [role for role, actions in _ACTIONS_OF_ROLE.items() if action in actions]
    return "a " + ", ".join(roles) + " or admin" if roles else "an admin"


@dataclass(frozen=True)
class Principal:
    """The caller behind a token: its role, and the tenant it is pinned to (if any)."""

    role: str
    tenant: str | None = None
    name: str = "anonymous"  # the token's environment variable: safe to log, unlike the secret

    def allows(self, action: str) -> bool:
        if self.role == ADMIN:
            return True
        return action in _ACTIONS_OF_ROLE.get(self.role, ())

    def require(self, action: str) -> None:
        """Raise PermissionDenied if this principal's role may not do `action`."""
        if not self.allows(action):
            what = ACTION_PHRASES.get(action, f"do {action!r}")
            raise PermissionDenied(f"a {self.role} token may not {what}; that takes {_roles_allowed(action)} token")

    def may_see_tenant(self, tenant: str | None) -> bool:
        """Whether `tenant` is in this principal's subtree (everything, when it is not pinned)."""
        pinned = self.tenant
        return (
            pinned is None
            or tenant == pinned
            or (tenant is not None and tenant.startswith(pinned) and tenant[len(pinned) : len(pinned) + 1] == "/")
        )


OPEN = Principal(ADMIN, None, "open broker")


class Authenticator:
    """Maps presented tokens to principals; an authenticator with no tokens lets everyone in as admin."""

    def __init__(self, tokens: Iterable[TokenSpec]) -> None:
        self._by_digest = {
            hashlib.sha256(spec.secret).digest(): Principal(spec.role, spec.tenant, spec.token_env)
            for spec in tokens
        }
        # The token of the last message, and who it was: most messages in a row carry the same token,
        # and a constant-time comparison is 8x cheaper than hashing it again. A connection keeps its own
        # (`identify`'s `conn`): a client's and a worker's messages alternate, each with its token.
        self._last: tuple[Authenticator, bytes, Principal] | None = None

    @property
    def enabled(self) -> bool:
        return bool(self._by_digest)

    def identify(self, token: bytes, conn: Any = None) -> Principal:
        """The principal for a token frame; Unauthenticated when it is missing or unknown. `conn`, if given,
        is the connection (cronoq.broker.connections) the token came on: it remembers its last valid token
        (`last_token`) with the authenticator that knew it (a reload makes another, so a revoked token is not
        taken again)."""
        if not self._by_digest:
            return OPEN
        if not token:
            raise Unauthenticated(
                "this broker requires a token and none was sent: pass token=... to cronoq.connect or "
                "cronoq.Worker; the cronoq commands read it from the environment variable --token-env names"
            )
        last = self._last if conn is None else conn.last_token
        if last is not None and last[0] is self and hmac.compare_digest(token, last[1]):
            return last[2]
        principal = self._by_digest.get(hashlib.sha256(token).digest())
        if principal is None:
            raise Unauthenticated("unknown token: check the token and the broker's [[auth.tokens]]")
        if conn is None:
            self._last = (self, token, principal)
        else:
            conn.last_token = (self, token, principal)
        return principal
