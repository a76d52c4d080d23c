CREATE TRIGGER gpufleet_pricing_mark_runs_0 AFTER UPDATE ON runs FOR EACH ROW WHEN (OLD.start IS DISTINCT FROM NEW.start OR OLD."end" IS DISTINCT FROM NEW."end" OR OLD.site IS DISTINCT FROM NEW.site OR OLD.run_id IS DISTINCT FROM NEW.run_id) EXECUTE FUNCTION gpufleet_pricing_mark_runs_0();
CREATE TRIGGER gpufleet_pricing_mark_runs_1 AFTER DELETE ON runs FOR EACH ROW EXECUTE FUNCTION gpufleet_pricing_mark_runs_1();
CREATE TRIGGER gpufleet_pricing_mark_run_allocations_2 AFTER INSERT OR UPDATE OR DELETE ON run_allocations FOR EACH ROW EXECUTE FUNCTION gpufleet_pricing_mark_run_allocations_2();
CREATE TRIGGER gpufleet_pricing_mark_nodes_3 AFTER UPDATE ON nodes FOR EACH ROW WHEN (OLD.site IS DISTINCT FROM NEW.site OR OLD.gpu_count IS DISTINCT FROM NEW.gpu_count OR OLD.facts IS DISTINCT FROM NEW.facts OR OLD.node IS DISTINCT FROM NEW.node) EXECUTE FUNCTION gpufleet_pricing_mark_nodes_3();
CREATE TRIGGER gpufleet_pricing_mark_nodes_4 AFTER DELETE ON nodes FOR EACH ROW EXECUTE FUNCTION gpufleet_pricing_mark_nodes_4();
CREATE TRIGGER gpufleet_pricing_mark_node_facts_history_5 AFTER INSERT OR UPDATE OR DELETE ON node_facts_history FOR EACH ROW EXECUTE FUNCTION gpufleet_pricing_mark_node_facts_history_5();
CREATE TRIGGER gpufleet_pricing_mark_site_settings_6 AFTER INSERT OR UPDATE OR DELETE ON site_settings FOR EACH ROW EXECUTE FUNCTION gpufleet_pricing_mark_site_settings_6();
CREATE TRIGGER gpufleet_pricing_mark_sites_7 AFTER UPDATE OR DELETE ON sites FOR EACH ROW EXECUTE FUNCTION gpufleet_pricing_mark_sites_7();
CREATE TRIGGER gpufleet_pricing_mark_carbon AFTER INSERT OR UPDATE OR DELETE ON carbon_intensity FOR EACH ROW EXECUTE FUNCTION gpufleet_pricing_mark_carbon();
