"""The store: one schema, two backends (SQLite embedded, PostgreSQL via asyncpg); imports
nothing from gateway/ or admin/.

`connect(url)` opens a `Database`; `migrate(db)` applies the numbered files in
`migrations/`. Everything above this package speaks `$1`-style parameterized
SQL that both backends run; nothing builds SQL from values.
"""

from .db import Database, Row, StoreError, connect
from .migrate import migrate

__all__ = ["Database", "Row", "StoreError", "connect", "migrate"]
