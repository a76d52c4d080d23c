
CREATE TYPE gpufleet_claim AS (k integer, grp integer, node text, gpu integer, lo timestamptz, hi timestamptz,
                               share double precision, edges timestamptz[])
