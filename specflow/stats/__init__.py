"""Statistics, each in one place: critical values (`critical`), intervals (`intervals`: the
percentile bootstrap, Wilson, Newcombe), the engine-start replicate model and its contrasts and
drift steps (`replicates`), sample sizes (`power`) and multiplicity (`multiplicity`: Holm).

Numbers in, numbers out: imports only `specflow.spec` (settings), numpy and scipy.
"""
