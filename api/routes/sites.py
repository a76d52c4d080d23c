"""Sites, time-of-use prices, carbon-intensity series, nodes' sites."""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, HTTPException, Path, Query, Response

from gpufleet.api.deps import AccountingReader, Admin, ConnDep, Reader
from gpufleet.api.schemas import (
    CarbonSeries,
    NodePublic,
    NodeUpdate,
    PriceSeries,
    SitePublic,
    SiteUpdate,
    SiteUpsert,
    UtcDatetime,
)
from gpufleet.store import nodes as node_store
from gpufleet.store import sites as store
from gpufleet.store.runs import NotFound

router = APIRouter(tags=["sites"])
NAME = r"^[A-Za-z0-9][A-Za-z0-9._\-]{0,252}$"


@router.get("/v1/sites", response_model=list[SitePublic])
def list_sites(conn: ConnDep, _: AccountingReader) -> list[dict]:
    return store.list_sites(conn)


@router.get("/v1/sites/{site}", response_model=SitePublic)
def get_site(site: str, conn: ConnDep, _: AccountingReader) -> dict:
    try:
        return store.get_site(conn, site)
    except NotFound as e:
        raise HTTPException(404, str(e)) from None


#: Response header of PUT naming the fields the request left out, which PUT set to their defaults.
DEFAULTED_HEADER = "Gpufleet-Defaulted-Fields"


@router.put("/v1/sites/{site}", response_model=SitePublic,
            description="Replaces the **whole** site: a field left out takes its default (pue 1.0, prices 0, "
                        "currency USD, no carbon region or constant), whatever it was before; the response "
                        f"header `{DEFAULTED_HEADER}` names those fields.  To change some fields only, use PATCH.")
def put_site(body: SiteUpsert, conn: ConnDep, _: Admin, response: Response,
             site: str = Path(..., pattern=NAME)) -> dict:
    defaulted = [f for f in store.SITE_COLUMNS if f not in body.model_fields_set]
    if defaulted:
        response.headers[DEFAULTED_HEADER] = ",".join(defaulted)
    return store.upsert_site(conn, site, body.model_dump())


@router.patch("/v1/sites/{site}", response_model=SitePublic,
              description="Changes only the fields given; the others keep their values.  404 for a site "
                          "that does not exist (create it with PUT).")
def patch_site(body: SiteUpdate, conn: ConnDep, _: Admin, site: str = Path(..., pattern=NAME)) -> dict:
    try:
        return store.patch_site(conn, site, body.model_dump(exclude_unset=True))[0]
    except NotFound as e:
        raise HTTPException(404, str(e)) from None


@router.put("/v1/sites/{site}/prices")
def put_prices(site: str, body: PriceSeries, conn: ConnDep, _: Admin) -> dict:
    try:
        n = store.set_prices(conn, site, [(p.time, p.price_per_kwh) for p in body.points])
    except NotFound as e:
        raise HTTPException(404, str(e)) from None
    return {"site": site, "points": n}


@router.get("/v1/carbon/{region}")
def get_carbon(region: str, conn: ConnDep, _: AccountingReader, since: Annotated[UtcDatetime | None, Query(alias="from")] = None,
               until: Annotated[UtcDatetime | None, Query(alias="to")] = None) -> dict:
    return {"region": region, "points": store.get_carbon(conn, region, since, until)}


@router.put("/v1/carbon/{region}")
def put_carbon(region: str, body: CarbonSeries, conn: ConnDep, _: Admin) -> dict:
    n = store.set_carbon(conn, region, [(p.time, p.g_co2e_per_kwh) for p in body.points])
    return {"region": region, "points": n}


@router.get("/v1/nodes", response_model=list[NodePublic], tags=["nodes"])
def list_nodes(conn: ConnDep, _: Reader) -> list[dict]:
    return node_store.list_nodes(conn)


@router.patch("/v1/nodes/{node}", response_model=NodePublic, tags=["nodes"])
def set_node_site(body: NodeUpdate, conn: ConnDep, _: Admin, node: str = Path(..., pattern=NAME)) -> dict:
    try:
        return node_store.set_node_site(conn, node, body.site)
    except NotFound as e:
        raise HTTPException(422, str(e)) from None
