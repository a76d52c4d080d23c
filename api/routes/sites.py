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
    PueSeries,
    QueryTime,
    SitePublic,
    SiteSettingPoint,
    SiteUpdate,
    SiteUpsert,
)
from gpufleet.store import nodes as node_store
from gpufleet.store import sites as store
from gpufleet.store.runs import Conflict, NotFound
from gpufleet.store.sites import SiteError
from gpufleet.timeparse import iso

router = APIRouter(tags=["sites"])
NAME = r"^[A-Za-z0-9][A-Za-z0-9._\-]{0,252}$"


FromParam = Query(
    alias="from",
    description="when the change takes effect (RFC 3339 with offset, or a bare date as UTC "
    "midnight); default now, so accounting of the past stays as it was. A time in the "
    "past dates the change back on purpose.",
)


@router.get("/v1/sites", response_model=list[SitePublic])
def list_sites(
    conn: ConnDep,
    _: AccountingReader,
    at: Annotated[QueryTime | None, Query(description="values in force at this time (default now)")] = None,
) -> list[dict]:
    return store.list_sites(conn, at)


@router.get("/v1/sites/{site}", response_model=SitePublic)
def get_site(
    site: str,
    conn: ConnDep,
    _: AccountingReader,
    at: Annotated[QueryTime | None, Query(description="values in force at this time (default now)")] = None,
) -> dict:
    try:
        return store.get_site(conn, site, at)
    except NotFound as e:
        raise HTTPException(404, str(e)) from None


@router.get("/v1/sites/{site}/history", response_model=list[SiteSettingPoint])
def site_history(site: str, conn: ConnDep, _: AccountingReader) -> list[dict]:
    """Every dated value of the site's settings: which value was (or will be) in force from when."""
    try:
        return store.site_history(conn, site)
    except NotFound as e:
        raise HTTPException(404, str(e)) from None


#: Response header of PUT naming the fields the request left out, which PUT set to their defaults.
DEFAULTED_HEADER = "Gpufleet-Defaulted-Fields"
#: Response header of PUT: the time from which the whole site was replaced ("beginning" for a new site).
REPLACED_HEADER = "Gpufleet-Replaced-From"


def site_error(e: SiteError) -> HTTPException:
    """422 naming the field a site write got wrong (a bound, a missing currency)."""
    return HTTPException(422, [{"loc": ["body", e.field], "msg": str(e), "type": "value_error"}])


@router.put(
    "/v1/sites/{site}",
    response_model=SitePublic,
    description="Replaces the **whole** site from `from` (default now; a new site from the beginning): "
    "a field left out takes its default (pue 1.0, prices 0, no carbon region or constant, no "
    "GPU-model prices), whatever it was before, and changes scheduled after `from` are dropped; "
    f"the response header `{DEFAULTED_HEADER}` names the defaulted fields and "
    f"`{REPLACED_HEADER}` the time the replacement holds from.  Accounting before that time is "
    "unchanged.  A site with a price needs `currency` (there is no default); a different "
    "currency holds from `from`.  To change some fields only, use PATCH.",
    responses={422: {"description": "a value outside its bound, or prices without a currency"}},
)
def put_site(
    body: SiteUpsert,
    conn: ConnDep,
    _: Admin,
    response: Response,
    site: str = Path(..., pattern=NAME),
    valid_from: Annotated[QueryTime | None, FromParam] = None,
) -> dict:
    try:
        w = store.put_site(
            conn,
            site,
            body.model_dump(),
            given=body.model_fields_set,
            valid_from=valid_from,
            gpu_hour_prices=body.gpu_hour_prices,
        )
    except Conflict as e:
        raise HTTPException(409, str(e)) from None
    except SiteError as e:
        raise site_error(e) from None
    if w.defaulted:
        response.headers[DEFAULTED_HEADER] = ",".join(w.defaulted)
    response.headers[REPLACED_HEADER] = "beginning" if w.valid_from is None else iso(w.valid_from) or ""
    return w.site


@router.patch(
    "/v1/sites/{site}",
    response_model=SitePublic,
    description="Changes only the fields given, from `from` (default now); the others keep their "
    "values, and accounting before that time is unchanged.  A currency change is dated too: "
    "give the prices in force then in the new currency with it (amounts are never converted). "
    "404 for a site that does not exist (create it with PUT).",
    responses={
        404: {"description": "unknown site"},
        422: {
            "description": "a value outside its bound, prices without a currency, or a currency "
            "change without the prices in the new currency"
        },
    },
)
def patch_site(
    body: SiteUpdate,
    conn: ConnDep,
    _: Admin,
    site: str = Path(..., pattern=NAME),
    valid_from: Annotated[QueryTime | None, FromParam] = None,
) -> dict:
    changes = body.model_dump(exclude_unset=True)
    models = changes.pop("gpu_hour_prices", None)
    try:
        return store.patch_site(conn, site, changes, valid_from=valid_from, gpu_hour_prices=models).site
    except NotFound as e:
        raise HTTPException(404, str(e)) from None
    except Conflict as e:
        raise HTTPException(409, str(e)) from None
    except SiteError as e:
        raise site_error(e) from None


@router.put(
    "/v1/sites/{site}/prices",
    description="Time-of-use energy prices: points of the site's dated "
    "`price_per_kwh` (each holds until the next).",
)
def put_prices(site: str, body: PriceSeries, conn: ConnDep, _: Admin) -> dict:
    try:
        n = store.set_prices(conn, site, [(p.time, p.price_per_kwh) for p in body.points])
    except NotFound as e:
        raise HTTPException(404, str(e)) from None
    except SiteError as e:
        raise site_error(e) from None
    return {"site": site, "points": n}


@router.put(
    "/v1/sites/{site}/pue",
    description="Measured or monthly PUE: points of the site's dated `pue` "
    "(each holds until the next), loaded like a carbon series.",
)
def put_pue(site: str, body: PueSeries, conn: ConnDep, _: Admin) -> dict:
    try:
        n = store.set_series(conn, site, "pue", [(p.time, p.pue) for p in body.points])
    except NotFound as e:
        raise HTTPException(404, str(e)) from None
    except SiteError as e:
        raise site_error(e) from None
    return {"site": site, "points": n}


@router.get(
    "/v1/carbon/{region}",
    description="A region's carbon-intensity points, with what the series is: "
    "`method` (average or marginal; null if never recorded), `name` and "
    "`provider`.",
)
def get_carbon(
    region: str,
    conn: ConnDep,
    _: AccountingReader,
    since: Annotated[QueryTime | None, Query(alias="from")] = None,
    until: Annotated[QueryTime | None, Query(alias="to")] = None,
) -> dict:
    return {
        "region": region,
        **store.carbon_region(conn, region),
        "points": store.get_carbon(conn, region, since, until),
    }


@router.put(
    "/v1/carbon/{region}",
    description="Points of a region's carbon-intensity step series (each holds until "
    "the next), with what the series is: `method` average or marginal, "
    "and a readable `name`, recorded for reports.",
)
def put_carbon(region: str, body: CarbonSeries, conn: ConnDep, _: Admin) -> dict:
    try:
        n = store.set_carbon(
            conn,
            region,
            [(p.time, p.g_co2e_per_kwh) for p in body.points],
            method=body.method,
            name=body.name,
            provider="api",
        )
    except SiteError as e:
        raise site_error(e) from None
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
