DROP FUNCTION IF EXISTS gpufleet_ledger(timestamptz, timestamptz, timestamptz, text[], double precision, text);
DROP FUNCTION IF EXISTS gpufleet_ledger_pieces(timestamptz, timestamptz, timestamptz, text[]);
