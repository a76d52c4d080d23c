DROP TRIGGER IF EXISTS gpufleet_pricing_mark_run_progress_10 ON run_progress;
DROP FUNCTION IF EXISTS gpufleet_pricing_mark_run_progress_10();
