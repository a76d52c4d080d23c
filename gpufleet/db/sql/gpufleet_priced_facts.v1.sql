
CREATE OR REPLACE FUNCTION gpufleet_priced_facts(p jsonb) RETURNS jsonb
LANGUAGE sql IMMUTABLE PARALLEL SAFE AS $fn$
  SELECT jsonb_strip_nulls(jsonb_build_object(
    'gpu_model', CASE WHEN jsonb_typeof(p -> 'gpu_model') = 'string' THEN p -> 'gpu_model' END,
    'gpu_count', CASE WHEN jsonb_typeof(p -> 'gpu_count') = 'number' THEN p -> 'gpu_count' END,
    'site', CASE WHEN jsonb_typeof(p -> 'site') = 'string' THEN p -> 'site' END,
    'gpus', (SELECT jsonb_agg(jsonb_build_object('gpu', x.e -> 'gpu', 'index', x.e -> 'index', 'name', x.e -> 'name',
                                                 'mig_enabled', x.e -> 'mig_enabled',
                                                 'mig_instances', x.e -> 'mig_instances') ORDER BY x.i)
             FROM jsonb_array_elements(CASE WHEN jsonb_typeof(p -> 'gpus') = 'array' THEN p -> 'gpus'
                                            ELSE '[]'::jsonb END) WITH ORDINALITY AS x(e, i)
             WHERE jsonb_typeof(x.e) = 'object'),
    'dcgm_mig_instances', CASE WHEN jsonb_typeof(p -> 'dcgm_mig_instances') = 'array'
                               THEN p -> 'dcgm_mig_instances' END))
$fn$