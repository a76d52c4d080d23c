DROP TRIGGER IF EXISTS gpufleet_pricing_mark_incidents_8 ON incidents;
DROP FUNCTION IF EXISTS gpufleet_pricing_mark_incidents_8();
DROP TRIGGER IF EXISTS gpufleet_pricing_mark_incidents_9 ON incidents;
DROP FUNCTION IF EXISTS gpufleet_pricing_mark_incidents_9();
