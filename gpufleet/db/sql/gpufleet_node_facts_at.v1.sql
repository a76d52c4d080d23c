
CREATE OR REPLACE FUNCTION gpufleet_node_facts_at(p_node text, p_at timestamptz) RETURNS jsonb
LANGUAGE sql STABLE PARALLEL SAFE AS $fn$
  SELECT coalesce(
    (SELECT h.facts FROM node_facts_history h WHERE h.node = p_node AND h.valid_from <= p_at
     ORDER BY h.valid_from DESC LIMIT 1),
    (SELECT h.facts FROM node_facts_history h WHERE h.node = p_node ORDER BY h.valid_from LIMIT 1),
    (SELECT n.facts FROM nodes n WHERE n.node = p_node))
$fn$