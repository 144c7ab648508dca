"""A deployment with identities, for the tests: the shipped rules
(:func:`speceyes_graph.deploy.auth.make_auth`) over an ``x-user`` header, as a gateway in
front of a server would set it. Never an example of authentication: anyone can send it."""

from __future__ import annotations

from collections.abc import Mapping

from langgraph_sdk import Auth

from speceyes_graph.deploy.auth import make_auth


async def by_header(headers: Mapping[bytes, bytes]) -> Auth.types.MinimalUserDict:
    user = headers.get(b"x-user")
    if not user:
        raise Auth.exceptions.HTTPException(status_code=401, detail="no x-user header")
    return {"identity": user.decode()}


auth = make_auth(by_header)
