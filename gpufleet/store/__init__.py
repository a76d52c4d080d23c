"""SQL for runs, sites, carbon series, nodes and incidents, shared by the API,
the CLI and replay (one place per concern, plain psycopg, no ORM)."""
