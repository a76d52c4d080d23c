DROP FUNCTION IF EXISTS gpufleet_accounting(timestamptz, timestamptz, timestamptz, text[], boolean, double precision, text, text, interval, double precision);
DROP FUNCTION IF EXISTS gpufleet_incident_accounting(text[], text[], text[], integer[], timestamptz[], timestamptz[], double precision[], timestamptz, double precision, text);
DROP FUNCTION IF EXISTS gpufleet_gpu_hour_prices(text, text, timestamptz, timestamptz, interval);
DROP FUNCTION IF EXISTS gpufleet_energy_rates(text, timestamptz, timestamptz, interval);
DROP FUNCTION IF EXISTS gpufleet_site_periods(text, timestamptz, timestamptz);
