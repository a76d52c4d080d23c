DROP TRIGGER IF EXISTS gpufleet_fleet_hours_mark_run_allocations ON run_allocations;
DROP FUNCTION IF EXISTS gpufleet_fleet_hours_mark_run_allocations();
CREATE TRIGGER gpufleet_fleet_hours_mark_allocations_insert AFTER INSERT ON run_allocations REFERENCING NEW TABLE AS gpufleet_new FOR EACH STATEMENT EXECUTE FUNCTION gpufleet_fleet_hours_mark_allocations();
CREATE TRIGGER gpufleet_fleet_hours_mark_allocations_delete AFTER DELETE ON run_allocations REFERENCING OLD TABLE AS gpufleet_old FOR EACH STATEMENT EXECUTE FUNCTION gpufleet_fleet_hours_mark_allocations();
CREATE TRIGGER gpufleet_fleet_hours_mark_allocations_update AFTER UPDATE ON run_allocations REFERENCING OLD TABLE AS gpufleet_old NEW TABLE AS gpufleet_new FOR EACH STATEMENT EXECUTE FUNCTION gpufleet_fleet_hours_mark_allocations();
