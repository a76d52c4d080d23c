
CREATE FUNCTION gpufleet_minor_units(p_currency text) RETURNS integer
LANGUAGE sql IMMUTABLE PARALLEL SAFE AS $fn$
  SELECT CASE
    WHEN upper(p_currency) IN ('BIF', 'CLP', 'DJF', 'GNF', 'ISK', 'JPY', 'KMF', 'KRW', 'PYG', 'RWF', 'UGX', 'UYI',
                               'VND', 'VUV', 'XAF', 'XOF', 'XPF') THEN 0
    WHEN upper(p_currency) IN ('BHD', 'IQD', 'JOD', 'KWD', 'LYD', 'OMR', 'TND') THEN 3
    WHEN upper(p_currency) IN ('CLF', 'UYW') THEN 4
    ELSE 2 END
$fn$
