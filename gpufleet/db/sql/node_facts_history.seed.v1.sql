
INSERT INTO node_facts_history (node, valid_from, facts)
SELECT node, '-infinity'::timestamptz, gpufleet_priced_facts(facts) FROM nodes WHERE facts <> '{}'::jsonb