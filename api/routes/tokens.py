"""Tokens: created by admins, secret shown once, revocable."""

from __future__ import annotations

from fastapi import APIRouter, HTTPException, Response
from psycopg import errors
from psycopg.rows import dict_row

from gpufleet.api.deps import Admin, ConnDep
from gpufleet.api.schemas import TokenCreate, TokenCreated, TokenPublic
from gpufleet.auth import create_token, revoke_token

router = APIRouter(prefix="/v1/tokens", tags=["tokens"])


@router.post("", response_model=TokenCreated, status_code=201)
def create(body: TokenCreate, conn: ConnDep, _: Admin) -> dict:
    try:
        secret = create_token(conn, body.name, body.role, body.node)
    except ValueError as e:
        raise HTTPException(422, str(e)) from None
    except errors.UniqueViolation:
        raise HTTPException(409, f"a token named {body.name!r} exists") from None
    return {"name": body.name, "role": body.role, "node": body.node, "token": secret}


@router.get("", response_model=list[TokenPublic])
def list_tokens(conn: ConnDep, _: Admin) -> list[dict]:
    with conn.cursor(row_factory=dict_row) as cur:
        return cur.execute(
            "SELECT name, role, node, created_at, revoked_at FROM agent_tokens ORDER BY name"
        ).fetchall()


@router.delete("/{name}", status_code=204)
def revoke(name: str, conn: ConnDep, _: Admin) -> Response:
    if not revoke_token(conn, name):
        raise HTTPException(404, f"no active token named {name!r}")
    return Response(status_code=204)
