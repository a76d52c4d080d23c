DROP FUNCTION IF EXISTS gpufleet_accounting(timestamptz, timestamptz, timestamptz, text[], boolean, double precision, text, text, interval);
DROP FUNCTION IF EXISTS gpufleet_gpu_hour_prices(text, text, timestamptz, timestamptz, interval);
DROP FUNCTION IF EXISTS gpufleet_energy_rates(text, timestamptz, timestamptz, interval);
DROP FUNCTION IF EXISTS gpufleet_site_periods(text, timestamptz, timestamptz);
DROP FUNCTION IF EXISTS gpufleet_claim_energy(gpufleet_claim[], double precision, text);
DROP FUNCTION IF EXISTS gpufleet_minor_units(text);
DROP TYPE IF EXISTS gpufleet_claim;
