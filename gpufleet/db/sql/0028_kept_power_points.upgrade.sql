CREATE TRIGGER gpufleet_pricing_mark_run_progress_10 AFTER INSERT OR UPDATE OR DELETE ON run_progress FOR EACH ROW EXECUTE FUNCTION gpufleet_pricing_mark_run_progress_10();
