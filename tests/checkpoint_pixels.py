"""Find image data in what a checkpointer stored: the guard behind "no pixels in checkpoints".

Every row is checked twice: its stored bytes are searched as bytes (a ``bytea`` column read
as ``bytes``, never its ``::text`` form, which is hex and hides everything), and its value is
decoded with LangGraph's serializer and searched as text (so a leak is reported with the
channel and the task that wrote it, and one the serializer compresses or escapes is found
too). What counts as image data: a ``data:image`` URL, base64 of a PNG, JPEG, GIF or WebP
file, and those headers as raw bytes; except a thumbnail, which a chat message keeps so the
person sees the picture they sent (base64 of an image of at most
:data:`THUMBNAIL_MAX_SIDE` px a side, :mod:`speceyes_graph.integrations.chat`).

Sources: a PostgreSQL database (the ``checkpoints``, ``checkpoint_blobs`` and
``checkpoint_writes`` tables of ``PostgresSaver``, as LangGraph's servers and Aegra lay them
out), a ``SqliteSaver``'s database and an ``InMemorySaver``; :func:`saver_rows` picks one.
"""

from __future__ import annotations

import base64
import binascii
import io
import re
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from typing import Any

from langgraph.checkpoint.serde.jsonplus import JsonPlusSerializer
from PIL import Image

# base64 of the first bytes of PNG, JPEG, GIF and WebP files, and the headers themselves
TEXT_SIGNS = ("data:image", "iVBORw0KGgo", "/9j/", "R0lGOD", "UklGR")
BYTE_SIGNS = tuple(s.encode() for s in TEXT_SIGNS) + (b"\x89PNG\r\n", b"\xff\xd8\xff", b"GIF8")
THUMBNAIL_MAX_SIDE = 128
_BASE64_IMAGE = re.compile(rb"(?:iVBORw0KGgo|/9j/|R0lGOD|UklGR)[A-Za-z0-9+/]*={0,2}")


def _beyond_thumbnails(data: bytes) -> bool:
    """Whether ``data`` holds image data other than thumbnails: a raw image header, a
    ``data:image`` URL, or base64 of an image larger than a thumbnail (or not decodable)."""
    if b"data:image" in data or any(sign in data for sign in BYTE_SIGNS[len(TEXT_SIGNS) :]):
        return True
    for found in _BASE64_IMAGE.finditer(data):
        try:
            with Image.open(io.BytesIO(base64.b64decode(found.group()))) as image:
                if max(image.size) > THUMBNAIL_MAX_SIDE:
                    return True
        except (binascii.Error, ValueError, OSError):
            return True  # image-like base64 that is no whole image: count it
    return False


@dataclass(frozen=True)
class Row:
    """One stored row: where it is (table, thread, channel, task) and its stored bytes."""

    table: str
    thread: str
    channel: str
    task: str
    type: str | None  # the serializer's type tag; None for a JSON column
    data: bytes = field(repr=False)

    @property
    def size(self) -> int:
        return len(self.data)


def holds_pixels(row: Row, serde: JsonPlusSerializer | None = None) -> bool:
    """Whether the row's bytes or its decoded value hold image data."""
    if _beyond_thumbnails(row.data):
        return True
    if row.type is None or row.type == "empty":
        return False
    try:
        value = (serde or JsonPlusSerializer()).loads_typed((row.type, row.data))
    except Exception:  # a value we cannot decode is searched as bytes only (above)
        return False
    return _beyond_thumbnails(repr(value).encode())


def leaks(rows: Iterable[Row]) -> list[Row]:
    serde = JsonPlusSerializer()
    return [row for row in rows if holds_pixels(row, serde)]


def describe(rows: Iterable[Row]) -> list[str]:
    """One line per row, for an assertion message."""
    return [
        f"{r.table} thread={r.thread} channel={r.channel} task={r.task} {r.size} B" for r in rows
    ]


def postgres_rows(conn: Any, thread: str | None = None) -> Iterator[Row]:
    """Every checkpoint row of a PostgresSaver database (``conn``: a psycopg connection),
    of one thread or all."""
    where, args = ("WHERE thread_id = %s", (thread,)) if thread else ("", ())
    for thread_id, checkpoint, metadata in conn.execute(
        f"SELECT thread_id, checkpoint::text, metadata::text FROM checkpoints {where}", args
    ):
        yield Row("checkpoints", thread_id, "", "", None, checkpoint.encode())
        yield Row("checkpoints.metadata", thread_id, "", "", None, metadata.encode())
    for thread_id, channel, type_, blob in conn.execute(
        f"SELECT thread_id, channel, type, blob FROM checkpoint_blobs {where}", args
    ):
        yield Row("checkpoint_blobs", thread_id, channel, "", type_, bytes(blob or b""))
    for thread_id, channel, task_path, type_, blob in conn.execute(
        f"SELECT thread_id, channel, task_path, type, blob FROM checkpoint_writes {where}", args
    ):
        yield Row("checkpoint_writes", thread_id, channel, task_path, type_, bytes(blob or b""))


def memory_rows(saver: Any) -> Iterator[Row]:
    """Every stored value of an ``InMemorySaver``: checkpoints, channel blobs, pending writes."""
    for thread, namespaces in saver.storage.items():
        for checkpoints in namespaces.values():
            for (type_, data), (mtype, mdata), _parent in checkpoints.values():
                yield Row("checkpoints", thread, "", "", type_, data)
                yield Row("checkpoints.metadata", thread, "", "", mtype, mdata)
    for (thread, _ns, channel, _version), (type_, data) in saver.blobs.items():
        yield Row("checkpoint_blobs", thread, channel, "", type_, data)
    for (thread, _ns, _id), writes in saver.writes.items():
        for (task_id, _idx), (_task, channel, (type_, data), task_path) in writes.items():
            yield Row("checkpoint_writes", thread, channel, task_path or task_id, type_, data)


def sqlite_rows(conn: Any) -> Iterator[Row]:
    """Every row of a ``SqliteSaver`` database (channel values are inside its checkpoints)."""
    for thread, type_, checkpoint, metadata in conn.execute(
        "SELECT thread_id, type, checkpoint, metadata FROM checkpoints"
    ).fetchall():
        yield Row("checkpoints", thread, "", "", type_, bytes(checkpoint))
        yield Row("checkpoints.metadata", thread, "", "", None, bytes(metadata or b""))
    for thread, task_id, channel, type_, value in conn.execute(
        "SELECT thread_id, task_id, channel, type, value FROM writes"
    ).fetchall():
        yield Row("checkpoint_writes", thread, channel, task_id, type_, bytes(value or b""))


def saver_rows(saver: Any) -> list[Row]:
    """Every row a checkpointer (in memory, SQLite or Postgres) has stored."""
    from langgraph.checkpoint.memory import InMemorySaver

    if isinstance(saver, InMemorySaver):
        return list(memory_rows(saver))
    if type(saver).__name__ == "SqliteSaver":
        return list(sqlite_rows(saver.conn))
    if hasattr(saver.conn, "connection"):  # a psycopg pool
        with saver.conn.connection() as conn:
            return list(postgres_rows(conn))
    return list(postgres_rows(saver.conn))


def thread_sizes(rows: Iterable[Row]) -> dict[str, dict[str, int]]:
    """Bytes stored per thread and table."""
    sizes: dict[str, dict[str, int]] = {}
    for row in rows:
        table = sizes.setdefault(row.thread, {})
        table[row.table] = table.get(row.table, 0) + row.size
    return sizes


def tables_holding_pixels(conn: Any) -> dict[str, tuple[int, int]]:
    """Outside the checkpoint tables: {"table.column": (rows holding image data, their
    largest size in bytes)} over every text, JSON and bytea column of the database's public
    schema (a server's own records: Aegra's ``runs.input``, ...). ``bytea`` is searched as
    bytes, never as its hex text."""
    columns = conn.execute(
        "SELECT table_name, column_name, data_type FROM information_schema.columns"
        " WHERE table_schema = 'public'"
        " AND data_type IN ('text', 'jsonb', 'json', 'bytea', 'character varying')"
        " AND table_name NOT IN ('checkpoints', 'checkpoint_blobs', 'checkpoint_writes')"
    ).fetchall()
    found: dict[str, tuple[int, int]] = {}
    for table, column, data_type in columns:
        if data_type == "bytea":  # as bytes
            value, signs, cast = f'"{column}"', list(BYTE_SIGNS), "::bytea"
        else:
            value, signs, cast = f'"{column}"::text', list(TEXT_SIGNS), ""
        test = " OR ".join(f"position(%s{cast} in {value}) > 0" for _ in signs)
        rows = conn.execute(f'SELECT {value} FROM "{table}" WHERE {test}', signs).fetchall()
        held = [bytes(v) if data_type == "bytea" else str(v).encode() for (v,) in rows]
        held = [v for v in held if _beyond_thumbnails(v)]  # thumbnails are what a chat keeps
        if held:
            found[f"{table}.{column}"] = (len(held), max(map(len, held)))
    return found
