DROP FUNCTION IF EXISTS gpufleet_incident_accounting(text[], text[], text[], integer[], timestamptz[], timestamptz[], double precision[], timestamptz, double precision, text);
