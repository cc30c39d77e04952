"""Reports: a sweep's markdown table, plots and intervals (``report``).

Imports ``stack`` (the lines' names) only."""
