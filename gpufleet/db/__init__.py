"""Database access: URL resolution, the embedded server, migrations, rollups."""
