"""``/v1/memory``: the caller's tenant's long-term memory (``shared/memory.py``).

The tenant is the API key's, never a field of the request: there is no way to name another
tenant's items, so another tenant's item answers 404 exactly as one that does not exist, and a
search or listing sees only the caller's. Modelled on LangGraph's store API: put, get, delete,
search under a namespace prefix, list namespaces.
"""

from __future__ import annotations

from typing import Annotated, Any

from fastapi import APIRouter, Query
from pydantic import BaseModel, Field

from producer.api.auth import Caller
from producer.api.errors import ApiError
from producer.api.runs import ERRORS, Svc, Who
from producer.api.services import Services
from shared.embedding import load_embedding
from shared.errors import InvalidRequest
from shared.memory import (
    MAX_DEPTH,
    MAX_KEY_CHARS,
    MAX_LIMIT,
    MAX_NAMESPACES,
    MAX_TTL_S,
    NAMESPACE_SCAN,
    SCAN_ITEMS,
    Item,
    Memory,
    MemoryFull,
    SearchResult,
    memory_of,
)

__all__ = [
    "DeletedItem",
    "MemoryPut",
    "MemorySearch",
    "NamespaceList",
    "NamespaceQuery",
    "delete_item",
    "get_item",
    "list_namespaces",
    "put_item",
    "router",
    "search_items",
]

router = APIRouter(prefix="/v1/memory", responses=ERRORS, tags=["memory"])

_NAMESPACE = Field(
    min_length=1,
    max_length=MAX_DEPTH,
    description=f"1 to {MAX_DEPTH} labels of letters, digits and _ . : @ + = - (64 chars each).",
)
_KEY = Field(min_length=1, max_length=MAX_KEY_CHARS, description="The item's key (printable text).")


class MemoryPut(BaseModel):
    """An item to store (replacing what is under its namespace and key)."""

    namespace: list[str] = _NAMESPACE
    key: str = _KEY
    value: dict[str, Any] = Field(description="A JSON object (16 KiB of JSON at most).")
    ttl_s: float | None = Field(
        default=None, gt=0, le=MAX_TTL_S, description="Expire it this many seconds from now (none: never)."
    )


class MemorySearch(BaseModel):
    """A search of the caller's items under a namespace prefix."""

    namespace_prefix: list[str] = Field(default_factory=list, max_length=MAX_DEPTH)
    query: str | None = Field(
        default=None,
        max_length=1000,
        description="Every word must appear in the value (any case); with ``semantic``, the text the"
        " items are ranked by similarity to.",
    )
    filter: dict[str, Any] | None = Field(
        default=None, description="Top-level fields the value must have, with these exact values."
    )
    limit: int = Field(default=10, ge=1, le=MAX_LIMIT)
    offset: int = Field(default=0, ge=0, le=SCAN_ITEMS)
    semantic: bool = Field(
        default=False,
        description="Rank the scanned items matching ``filter`` by cosine similarity to ``query``'s"
        " embedding (each with its ``score``); needs ``WESICHAIN_MEMORY_EMBEDDING`` on the API"
        " process, else 422. Items stored without a vector are left out.",
    )


class NamespaceQuery(BaseModel):
    """Which namespaces to list."""

    prefix: list[str] = Field(default_factory=list, max_length=MAX_DEPTH)
    max_depth: int | None = Field(
        default=None, ge=1, le=MAX_DEPTH, description="Cut namespaces to this depth."
    )
    limit: int = Field(default=100, ge=1, le=MAX_NAMESPACES)
    offset: int = Field(default=0, ge=0, le=NAMESPACE_SCAN)


class NamespaceList(BaseModel):
    namespaces: list[list[str]]


class DeletedItem(BaseModel):
    deleted: bool = Field(description="False when there was no such item.")


def _memory(services: Services, who: Caller) -> Memory:
    embed = load_embedding(services.client.settings.memory_embedding)
    return memory_of(services.store.redis, services.keys, who.tenant, embed)


def _invalid(exc: InvalidRequest) -> ApiError:
    return ApiError(422, "invalid_request", exc.message)


_Namespace = Annotated[
    list[str], Query(min_length=1, max_length=MAX_DEPTH, description="The item's namespace, one label each.")
]
_Key = Annotated[str, Query(min_length=1, max_length=MAX_KEY_CHARS)]


@router.put(
    "/items",
    response_model=Item,
    summary="Store an item",
    description="Stores ``value`` under ``namespace`` and ``key`` in the caller's tenant's memory,"
    " replacing what was there; ``version`` counts the writes to the key. 409 ``quota_exceeded``"
    " when a new item would pass the tenant's ``max_memory_items``.",
)
def put_item(body: MemoryPut, services: Svc, who: Who) -> Item:
    try:
        return _memory(services, who).put(body.namespace, body.key, body.value, ttl_s=body.ttl_s)
    except InvalidRequest as exc:
        raise _invalid(exc) from None
    except MemoryFull as exc:
        raise ApiError(409, "quota_exceeded", str(exc), details={"max_memory_items": exc.limit}) from None


@router.get(
    "/items",
    response_model=Item,
    summary="Read an item",
    description="404 when the caller's tenant has no such item (or it expired).",
)
def get_item(services: Svc, who: Who, namespace: _Namespace, key: _Key) -> Item:
    try:
        item = _memory(services, who).get(namespace, key)
    except InvalidRequest as exc:
        raise _invalid(exc) from None
    if item is None:
        raise ApiError(404, "not_found", "no such memory item")
    return item


@router.delete("/items", response_model=DeletedItem, summary="Delete an item")
def delete_item(services: Svc, who: Who, namespace: _Namespace, key: _Key) -> DeletedItem:
    try:
        return DeletedItem(deleted=_memory(services, who).delete(namespace, key))
    except InvalidRequest as exc:
        raise _invalid(exc) from None


@router.post(
    "/items/search",
    response_model=SearchResult,
    summary="Search items under a namespace prefix",
    description="Items in namespace and key order (``semantic``: most similar first). A search looks"
    " at a bounded number of items of the prefix (and bytes of their values): ``truncated`` says it"
    " stopped there. A semantic search ranks those items only: there is no nearest-neighbour index."
    " A tenant runs at most 2 searches, listings or run timelines at once on one API process (429"
    " ``too_many_scans``).",
)
def search_items(body: MemorySearch, services: Svc, who: Who) -> SearchResult:
    try:
        with services.scans.hold(who.tenant):
            return _memory(services, who).search(
                body.namespace_prefix,
                query=body.query,
                filter=body.filter,
                limit=body.limit,
                offset=body.offset,
                semantic=body.semantic,
            )
    except InvalidRequest as exc:
        raise _invalid(exc) from None


@router.post("/namespaces", response_model=NamespaceList, summary="List the namespaces holding items")
def list_namespaces(body: NamespaceQuery, services: Svc, who: Who) -> NamespaceList:
    try:
        with services.scans.hold(who.tenant):
            found = _memory(services, who).list_namespaces(
                prefix=body.prefix, max_depth=body.max_depth, limit=body.limit, offset=body.offset
            )
    except InvalidRequest as exc:
        raise _invalid(exc) from None
    return NamespaceList(namespaces=[list(ns) for ns in found])
