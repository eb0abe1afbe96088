"""RabbitMQ's query parameters on list answers: `name` filter, `sort`, pagination,
`columns` (rabbit_mgmt_util's filter_and_paginate, checked against 3.10.8).

- `columns=a,b.c`: keep those keys (dotted paths into nested objects); rabbitmqadmin
  asks for its table's columns this way.
- `sort=key` (dotted too), `sort_reverse=true`.
- `page=N` (from 1) with `page_size` (default 100, at most 500): the answer becomes
  `{"filtered_count", "item_count", "items", "page", "page_count", "page_size",
  "total_count"}`; with pagination only, `name` keeps rows whose name contains it
  (case-insensitive), or matches it as a regular expression with `use_regex=true`.
  A page past the end is empty; one further than that is 400 `page_out_of_range`.

Order: filter, sort, page, columns, as RabbitMQ.
"""

from __future__ import annotations

import math
import re
from typing import Any

from .access import Refused

PAGE_SIZE = 100
MAX_PAGE_SIZE = 500
_MISSING = object()


def shape(body: Any, query) -> Any:
    if not isinstance(body, list):
        return _columns(body, query)
    paginated = "page" in query
    total = len(body)
    if paginated:
        page, page_size = _pagination(query)
        body = _filtered(body, query)
    body = _sorted(body, query)
    if not paginated:
        return [_columns(row, query) for row in body]
    filtered = len(body)
    if (page - 1) * page_size > filtered:
        raise Refused("page_out_of_range", f"Page out of range, page: {page} page size: "
                      f"{page_size}, len: {filtered}", 400)
    items = body[(page - 1) * page_size:page * page_size]
    return {"filtered_count": filtered, "item_count": len(items),
            "items": [_columns(row, query) for row in items], "page": page,
            "page_count": math.ceil(filtered / page_size), "page_size": page_size,
            "total_count": total}


def _pagination(query) -> tuple[int, int]:
    try:
        page = int(query["page"])
        size = int(query["page_size"]) if "page_size" in query else None
    except ValueError:
        raise Refused("bad_request", "Pagination parameters are invalid", 400) from None
    if page < 1 or (size is not None and not 1 <= size <= MAX_PAGE_SIZE):
        shown = "undefined" if size is None else size
        raise Refused("invalid_pagination_parameters", f"Invalid pagination parameters: "
                      f"page number {page}, page size {shown}", 400)
    return page, size or PAGE_SIZE


def _filtered(rows: list, query) -> list:
    name = query.get("name")
    if not name:
        return rows
    if query.get("use_regex") == "true":
        try:
            pattern = re.compile(name, re.IGNORECASE)
        except re.error:
            raise Refused("bad_request", f"invalid regular expression: {name}", 400) from None
        return [row for row in rows if pattern.search(str(row.get("name", "")))]
    wanted = name.lower()
    return [row for row in rows if wanted in str(row.get("name", "")).lower()]


def _sorted(rows: list, query) -> list:
    key = query.get("sort")
    if not key:
        return rows
    rows = sorted(rows, key=lambda row: _sort_key(_dig(row, key.split("."))))
    if query.get("sort_reverse") == "true":
        rows.reverse()  # ties come reversed too, as in RabbitMQ
    return rows


def _columns(row: Any, query) -> Any:
    columns = query.get("columns")
    if not columns or not isinstance(row, dict):
        return row
    picked: dict = {}
    for path in (column.split(".") for column in columns.split(",") if column):
        value = _dig(row, path)
        if value is _MISSING:
            continue
        target = picked
        for part in path[:-1]:
            target = target.setdefault(part, {})
        target[path[-1]] = value
    return picked


def _dig(row, path):
    for part in path:
        if not isinstance(row, dict) or part not in row:
            return _MISSING
        row = row[part]
    return row


def _sort_key(value):
    if value is _MISSING or value is None:
        return (0, "")
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        return (1, value)
    return (2, str(value))
