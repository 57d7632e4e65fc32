"""Reading and aggregating rows: the result file, the declared columns, grouping, statistics, flags and metrics."""
